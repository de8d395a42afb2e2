#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# The documentation of the action plugin of the same name, which does all the work on the
# controller; as for ansible.builtin.debug, there is no module code.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: canary_analysis
short_description: Judge a canary's measurements against a baseline's, metric by metric, as Kayenta does
version_added: 0.2.0
description:
  - Compares the canary's trials with its baseline's on the controller and returns a verdict
    that steers a rollout - C(pass), C(marginal), C(fail) or C(inconclusive) - with a score out
    of 100.
  - The metrics - per trial the weighted token C(score), C(output_tps) and the medians of its
    requests' C(ttft_ms), C(tpot_ms) and C(e2e_ms); per engine instance the C(quality) set's
    score and the share of C(probes) that passed. Throughput must not decrease and latencies
    must not increase by more than a margin.
  - The unit is the trial - a canary bench and the baseline's of the same engine instance and
    trial (the benches' C(label)), measured in the same seconds, are a pair. Per metric the
    estimate is the mean log ratio canary / baseline of the trials, less that of the A/A trials
    O(before) the canary changed (difference in differences, which takes the hosts' own gap
    out), with its Student-t interval from the pooled spread of both phases.
  - C(Low) when the shift lies below -margin and the whole interval below 0, for a throughput or
    score; C(High) likewise above +margin and 0 for a latency; C(NoData) without a pair; else
    C(Pass), which is not conclusive when the shift lies past the margin (within the noise) or
    there are too few trials for an interval. A C(quality) or C(probes) figure is compared as it
    is.
  - The score is Kayenta's weighted sum over the groups throughput (50), latency (30) and
    correctness (20, the quality set and the probes). C(score), C(quality) and C(probes) are
    critical, a regression of one makes the score 0. Below O(marginal_score) the verdict is
    C(fail), below O(pass_score) C(marginal), else C(pass); C(inconclusive) instead of those two
    when a Pass is not conclusive or a critical metric has no data.
  - The verdict is data; the task fails only on bad input. RV(promote) says whether the rollout
    may go on - on a pass, or a verdict O(accept) names.
  - Shows the analysis as one line, and writes it with every pair to
    C(build/canary/<release>/<host>.json) at the project root.
  - Needs C(scipy) on the controller (the project's C(requirements.txt)).
options:
  canary:
    description: The canary's side.
    type: dict
    required: true
    suboptions: &side
      host:
        description: The host; required for the canary and a same-window baseline.
        type: str
      release:
        description: The release the side runs; required for the canary, whose results file it names.
        type: str
      benches:
        description: The results of M(biv100.serving.engine_bench), one per trial and engine
          instance, in trial order, with their C(label) and per-request C(samples).
        type: list
        elements: dict
        default: []
      qualities:
        description: The quality set's score per engine instance.
        type: list
        elements: raw
        default: []
      probes:
        description: The probes' verdicts per engine instance (M(biv100.serving.engine_probe)'s
          RV(biv100.serving.engine_probe#module:probes)).
        type: list
        elements: list
        default: []
  baseline:
    description:
      - The baseline's side, with what the canary is measured against.
    type: dict
    required: true
    suboptions:
      host:
        description: The baseline host, measured beside the canary.
        type: str
      release:
        description: The release it runs.
        type: str
      benches:
        description: As for O(canary.benches).
        type: list
        elements: dict
        default: []
      qualities:
        description: As for O(canary.qualities).
        type: list
        elements: raw
        default: []
      probes:
        description: As for O(canary.probes).
        type: list
        elements: list
        default: []
      kind:
        description:
          - C(same window) for a host measured beside the canary, C(historical) for the canary's
            own figures recorded with O(baseline.release), the weaker kind.
        type: str
        choices: [same window, historical]
        default: same window
      gates:
        description: For a historical baseline, the gates' figures its release recorded.
        type: dict
      instances:
        description: For a historical baseline, the engine instances to read from O(baseline.gates).
        type: list
        elements: str
        default: []
  before:
    description:
      - The A/A trials of a same-window baseline - both hosts benched together on the release both
        ran before the canary changed, one bench per trial and engine instance as for
        O(canary.benches). Their pairs' gap is taken out of the trials after the change. Without
        them, the hosts' gap counts as the release's. A historical baseline takes none.
    type: dict
    suboptions:
      canary:
        description: The canary's benches.
        type: list
        elements: dict
        default: []
      baseline:
        description: The baseline's benches.
        type: list
        elements: dict
        default: []
  trials:
    description: The trials after the change, for the line shown.
    type: int
    required: true
  margin:
    description: The harm allowed to a trial's C(score) and C(output_tps), a fraction.
    type: float
    default: 0.05
  request_margin:
    description: The harm allowed to a trial's latencies, the medians of a few dozen requests.
    type: float
    default: 0.10
  quality_margin:
    description: The drop allowed to the quality score, the quality gate's bound.
    type: float
    required: true
  pass_score:
    description: The lowest score that passes (Kayenta's documented example).
    type: float
    default: 95
  marginal_score:
    description: The lowest score that is marginal rather than a fail.
    type: float
    default: 75
  confidence:
    description: The confidence of the shift's interval.
    type: float
    default: 0.98
  accept:
    description: Verdicts besides C(pass) that let the rollout go on - C(marginal), C(inconclusive).
    type: list
    elements: str
    default: []
  latency:
    description:
      - The objective's latency limits, the throughput gate's - C(ttft_p99_ms) and C(tpot_p99_ms),
        each milliseconds or a factor of the incumbent's such as C(1.5x).
      - With O(concurrency_changes), C(ttft_ms) and C(tpot_ms) are held to a factor limit as their
        margin instead of O(request_margin); under an absolute limit (which the canary's gate held)
        or none they are not judged.
    type: dict
  concurrency_changes:
    description:
      - What the release changes of the settings that decide how many requests its engine runs at
        once (such as C(max_num_seqs 2 -> 8)); empty when it changes none.
    type: list
    elements: str
    default: []
  results_dir:
    description: Where the analysis is written; a relative folder is the project's.
    type: path
extends_documentation_fragment:
  - biv100.serving.controller_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.conn
  - ansible.builtin.action_common_attributes.flow
attributes:
  check_mode:
    support: full
    details: Judges as usual and writes no file.
  diff_mode:
    support: none
seealso:
  - module: biv100.serving.engine_bench
  - plugin: biv100.serving.canary_plan
    plugin_type: filter
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Judge the canary against the baseline measured beside it
  biv100.serving.canary_analysis:
    canary: {host: gpu1, release: sub511, benches: "{{ canary_benches }}"}
    baseline: {host: gpu2, release: sub510, benches: "{{ baseline_benches }}"}
    # Both hosts benched together before gpu1 changed.
    before: {canary: "{{ canary_benches_before }}", baseline: "{{ baseline_benches_before }}"}
    trials: 3
    quality_margin: 0.04
  register: analysis

- name: Stop unless the rollout may go on
  ansible.builtin.assert:
    that: analysis.promote
    fail_msg: "canary: {{ analysis.reasons | join('; ') }}"
"""

RETURN = r"""
verdict:
  description: C(pass), C(marginal), C(fail) or C(inconclusive).
  returned: success
  type: str
  sample: fail
score:
  description: The score out of 100; null when no metric had data.
  returned: success
  type: float
  sample: 0.0
promote:
  description: Whether the rollout may go on (a pass, or an accepted verdict).
  returned: success
  type: bool
accepted:
  description: Whether a verdict other than a pass was accepted (O(accept)).
  returned: success
  type: bool
reasons:
  description: What decided a verdict other than a pass, one line per metric.
  returned: success
  type: list
  elements: str
  sample: ["output_tps -6.8 % [-8.1, -5.2] < -5 %"]
thresholds:
  description: The pass and marginal scores.
  returned: success
  type: dict
  sample: {pass: 95, marginal: 75}
metrics:
  description: Per metric its group, direction, margin, classification, shift and interval in percent,
    the test's p-value, the trials after and before the change, and each side's quartiles.
  returned: success
  type: list
  elements: dict
canary:
  description: The canary's host and release.
  returned: success
  type: dict
baseline:
  description: The baseline's host (null for a historical one), kind and release.
  returned: success
  type: dict
  sample: {host: gpu2, kind: same window, release: sub510}
trials:
  description: The trials after the change.
  returned: success
  type: int
trials_before:
  description: The A/A trials before the change whose pairs the judge used.
  returned: success
  type: int
latency_judged:
  description: How TTFT and TPOT were judged when the release changed its engine's concurrency; null
    otherwise.
  returned: success
  type: str
simulated:
  description: Whether a figure was measured on the lab's engine stand-in.
  returned: success
  type: bool
results_file:
  description: The analysis written on the controller, with every pair; null in check mode.
  returned: success
  type: str
"""
