# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""probe_summary: one line of a host's probe verdicts (plugin_utils/_probe_summary.py, which the
ledger callback shares)."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._probe_summary import probe_summary


class FilterModule:
    def filters(self):
        return {"probe_summary": probe_summary}
