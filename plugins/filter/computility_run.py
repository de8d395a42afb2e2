# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""computility_run: the platform's computility-run.yaml, rendered from the variables the fleet
is deployed with, so that the platform submission and the hosts cannot disagree."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._computility_run import computility_run


class FilterModule:
    def filters(self):
        return {"computility_run": computility_run}
