# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""verify_problems: every way a host differs from what its last deploy left, one sentence each
(plugin_utils/_verify_findings.py, which the run record shares)."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._verify_findings import host_findings


def verify_problems(checks: dict) -> list[str]:
    return host_findings(checks)


class FilterModule:
    def filters(self):
        return {"verify_problems": verify_problems}
