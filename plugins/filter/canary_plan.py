# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""canary_plan: whether the rollout's canary is analysed, and against which baseline;
canary_record: what a release record keeps of the analysis (plugin_utils/_canary_analysis.py)."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import (
    canary_plan,
    canary_record,
    first_batch_size,
    rollout_hosts,
)


def canary_plan_filter(order, hostvars, enabled=True, measured=True, serial=None, baseline=None,
                       settings=None) -> dict:
    order = list(order)
    return canary_plan(order, rollout_hosts(order, hostvars), enabled=bool(enabled), measured=bool(measured),
                       first_batch=first_batch_size(serial if serial is not None else 1, len(order)),
                       baseline=baseline or None, settings=settings)


class FilterModule:
    def filters(self):
        return {"canary_plan": canary_plan_filter, "canary_record": canary_record}
