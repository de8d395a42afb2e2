# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""canary_candidate: what the canary's plan reads of one host; canary_plan: whether the rollout's
canary is analysed, and against which baseline; canary_record: what a release record keeps of the
analysis (plugin_utils/_canary_analysis.py)."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import (
    candidate,
    canary_plan,
    canary_record,
    first_batch_size,
)


def canary_candidate_filter(plan, takes_part=False, gpus=None, instances=None) -> dict:
    return candidate((plan or {}).get("current_release"), takes_part=takes_part, gpus=gpus, instances=instances)


def canary_plan_filter(order, candidates, enabled=True, measured=True, serial=None, baseline=None,
                       settings=None, latency=None) -> dict:
    order = list(order)
    missing = [name for name in order if not isinstance(candidates.get(name), dict)]
    if missing:
        raise ValueError(f"canary_plan: no canary_candidate for {', '.join(missing)}")
    return canary_plan(order, candidates, enabled=bool(enabled), measured=bool(measured),
                       first_batch=first_batch_size(serial if serial is not None else 1, len(order)),
                       baseline=baseline or None, settings=settings, latency=latency)


class FilterModule:
    def filters(self):
        return {"canary_candidate": canary_candidate_filter, "canary_plan": canary_plan_filter,
                "canary_record": canary_record}
