# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_quality
short_description: Score the engine's answers to an evaluation set against a baseline release
version_added: 0.2.0
description:
  - The quality gate. Sends each case of a quality set (a data file of prompts, reference
    answers and scorers; the format is described in C(plugins/plugin_utils/_quality.py)) to
    the engine at O(url) as a chat request, scores the answers on the controller, and compares
    the score with that of a baseline release.
  - The requests are sent from the host by M(biv100.serving.engine_probe), in one call, so the
    engine's port need not be reachable from the controller; this module's own work is done by
    its action plugin, on the controller.
  - The score is the share of cases answered right, from 0 to 1; a request that got no answer
    scores 0 for its case. The gate passes when the score deviates from the baseline's by at
    most O(bound), relative and both ways (the competition allows 4 %).
  - Missing the gate does not fail the task - RV(passed) says it, and the playbook decides; the
    task fails when the set is not valid (before any request is sent) and when the engine
    could not be asked (no request answered, or the key refused every time).
  - Only C(http://) URLs are asked (the engine's local address).
  - The requests are read-only for the engine, so they are also sent in check mode.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  served_model_name:
    description:
      - The model name the requests ask for (the engine's C(--served-model-name)).
      - Without it the requests name no model, and the engine answers with the one it serves.
    type: str
  set:
    description:
      - The quality set - a name of a file under the collection's C(files/quality) (without
        C(.yml)), or the path of a set file on the controller (anything with a C(/) or a
        C(.yml) or C(.yaml) suffix; a relative path is relative to the current folder).
    type: str
    default: default
  baseline:
    description:
      - The score of the release this one is held to - normally the last good release's, from
        its release record.
      - Without it there is nothing to deviate from, and the gate passes for any score above 0
        (the release's score becomes the baseline once the release is good).
    type: dict
    suboptions:
      release:
        description: The baseline release's id (C(sub168)), named in RV(msg).
        type: str
        required: true
      score:
        description: Its score, from 0 to 1.
        type: float
        required: true
  bound:
    description:
      - How far the score may deviate from O(baseline.score), relative to it and both ways -
        a score above the baseline's by more misses the gate too.
      - V(0.04) is the competition's 4 %, which the gates role passes from the serving role's
        C(serving_competition).
    type: float
    required: true
  timeout:
    description: Seconds each answer may take.
    type: float
    default: 60
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - biv100.serving.engine_endpoint
attributes:
  action:
    support: full
    details:
      - The action loads the set, scores the answers and compares on the controller; only
        M(biv100.serving.engine_probe) runs on the host.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details:
      - The requests read nothing but the engine's answers; they are sent in check mode too.
  diff_mode:
    support: none
notes:
  - The score moves in steps of one case. Against a perfect baseline, a bound of 4 % allows
    one wrong case only in a set of 25 cases or more, two only from 50 (the default set has
    41).
seealso:
  - module: biv100.serving.engine_probe
"""

EXAMPLES = r"""
- name: Score the engine on the default set against the last good release
  biv100.serving.engine_quality:
    url: "http://127.0.0.1:{{ engine_port }}"
    api_key: "{{ engine_api_key }}"
    served_model_name: "{{ engine_served_model_name }}"
    baseline:
      release: sub168
      score: 0.969
    bound: 0.04
  register: quality

- name: Hold the release to its baseline
  ansible.builtin.assert:
    that: quality.passed
    fail_msg: "{{ quality.msg }}; wrong: {{ quality.failed_cases | map(attribute='name') | join(', ') }}"
    success_msg: "{{ quality.msg }}"

- name: Score a team's own set, no baseline yet
  biv100.serving.engine_quality:
    set: "{{ playbook_dir }}/quality/team.yml"
    served_model_name: qwen3_5
    bound: 0.04
"""

RETURN = r"""
set:
  description: The set's name.
  returned: success
  type: str
  sample: default
score:
  description: The share of cases answered right, from 0 to 1.
  returned: success
  type: float
  sample: 0.9756
cases:
  description: How many cases the set has.
  returned: success
  type: int
  sample: 41
correct:
  description: How many of them were answered right.
  returned: success
  type: int
  sample: 40
failed_cases:
  description: The cases answered wrong, in the set's order.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The case's name.
      type: str
    expected:
      description: The reference, short (a pattern as C(/.../), a schema as C(JSON meeting ...)).
      type: str
    given:
      description: The answer, short; or, in parentheses, why none came (an HTTP status and its message, a timeout).
      type: str
  sample: [{name: compute-multiply, expected: "391", given: "17 * 23 = 401"}]
baseline:
  description: O(baseline) as given; null without one.
  returned: success
  type: dict
  sample: {release: sub168, score: 0.969}
deviation:
  description:
    - (score - baseline score) / baseline score; null without a baseline, or with a baseline
      score of 0 (which no score is within any bound of).
  returned: success
  type: float
  sample: -0.065
bound:
  description: O(bound).
  returned: success
  type: float
  sample: 0.04
passed:
  description:
    - Whether the gate is met - the deviation within O(bound), or, without a baseline, a score
      above 0.
  returned: success
  type: bool
simulated:
  description:
    - Whether any answer carried the C(x-biv100-simulated) header - the lab's engine stand-in
      answered, not a model, and the score says nothing of one.
  returned: success
  type: bool
msg:
  description: Both scores, the deviation and the verdict, on one line.
  returned: always
  type: str
  sample: "quality 0.906 vs 0.969 of sub168: -6.5 % beyond ±4 %"
"""
