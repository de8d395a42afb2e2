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
module: serving_run
short_description: Write a phase boundary into the host's record of this run
version_added: 0.2.0
description:
  - Keeps one record per host and run, the host fact C(serving_run) - the phase the host is
    in, the engine instance the phase is about, what each phase proved (the staged release, the
    guard's finding, each instance's engine arguments, probes and gates' figures, the canary
    analysis, the release's state, the rollback, the tuning run) and the failure, if any.
  - Each playbook of the collection calls it at its phase boundaries, with the result of the
    module or role that ended the phase. The deploy's rescue names the failed phase from it,
    the release record takes what each instance was proven with from it, the canary analysis
    takes the canary's probes and quality from it, and the P(biv100.serving.ledger#callback)
    callback writes its lines from it.
  - A record of another run (a fact cache's) is started afresh; the run is C(serving_run_id).
  - Nothing runs on a host; check mode records as a normal run does.
options:
  phase:
    description:
      - The phase the host enters. Omitted, the phase stays the same.
      - A failure is named by the phase the record is in; C(lock) until the first phase.
    type: str
    choices: [lock, stage, guard, engine, probes, gates, canary, mark, rollback, tune, done]
  instance:
    description:
      - The engine instance the phase is about - its value (P(biv100.serving.engine_instances#filter)),
        whose label names it in a failure and whose C(record) is what the release records of its
        engine, or its name; an empty string for the host as a whole.
      - Omitted, the instance stays the same.
    type: raw
  staged:
    description: The result of P(biv100.serving.serving_overlay#module) (the stage role's C(stage_result)).
    type: dict
  guarded:
    description: The result of P(biv100.serving.model_guard#module) (the guard role's C(guard_result)).
    type: dict
  engine:
    description: The result of P(biv100.serving.engine_process#module) for O(instance) (the engine role's C(engine_run)).
    type: dict
  probed:
    description: The result of P(biv100.serving.engine_probe#module) for O(instance) (the probe role's C(probe_result)).
    type: dict
  gated:
    description: The gates role's C(gates_result) for O(instance) - its verdicts and the figures it measured.
    type: dict
  canary:
    description: The result of P(biv100.serving.canary_analysis#module).
    type: dict
  marked:
    description: A result of P(biv100.serving.serving_release#module) - the release it marked or read, and its state.
    type: dict
  rolled_back:
    description: The result of P(biv100.serving.serving_rollback#module); the host enters the rollback phase.
    type: dict
  verified:
    description:
      - verify.yml's checks of O(instance) - C(engine), the result of
        P(biv100.serving.engine_process#module) with state status, and C(probes), that of
        P(biv100.serving.engine_probe#module). The instance keeps its C(findings), one sentence
        each, and its C(healthy) line.
    type: dict
  tuned:
    description: The result of P(biv100.serving.tune_search#module) that proposed (or did not).
    type: dict
  failed:
    description:
      - The failed task's result (C(ansible_failed_result) in a rescue). Its first line becomes
        the record's C(failure), which names the host (or C(<host>/<instance>)), the phase and
        O(failed_task).
    type: dict
  failed_task:
    description: The failed task's name (C(ansible_failed_task.name)).
    type: str
extends_documentation_fragment:
  - biv100.serving.controller_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.conn
  - ansible.builtin.action_common_attributes.flow
attributes:
  check_mode:
    support: full
    details: Records as a normal run does; the record is the controller's, and nothing is written.
  diff_mode:
    support: none
seealso:
  - plugin: biv100.serving.ledger
    plugin_type: callback
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Enter the probes phase of an instance
  biv100.serving.serving_run:
    phase: probes
    instance: "{{ serving_instance }}"

- name: Keep what the probes proved, and enter the gates phase
  biv100.serving.serving_run:
    phase: gates
    probed: "{{ probe_result }}"

- name: Name what failed
  biv100.serving.serving_run:
    failed: "{{ ansible_failed_result }}"
    failed_task: "{{ ansible_failed_task.name }}"
"""

RETURN = r"""
record:
  description:
    - The host's record of this run, also set as the host fact C(serving_run).
    - C(instances) holds per instance its C(label), C(engine) (the settings the release records),
      C(restarted), C(engine_args) (an C(--api-key) value masked), C(probes) (one line),
      C(failed_probes), C(probe_verdicts) (each probe's C(name) and C(passed)), C(summary), and
      once gated C(gates), C(bench) and C(quality); once verified, C(findings) and C(healthy).
    - C(rollback) holds C(from), C(to) and C(files); C(rollback_proven) what the probes said of each
      instance the rollback brought back, by name.
  returned: always
  type: dict
  sample:
    run: 20261204T040000Z-123456
    host: gpu1
    phase: gates
    instance: vllm
    release: sub511
    state: pending
    changed: true
    payload_digest: 9f2c...
    files_changed: [vllm/entrypoints/openai/serving_chat.py]
    mappings: []
    guard: 12 protected files as recorded (after stage)
    instances:
      vllm:
        label: gpu1
        restarted: true
        engine_args: [--port, "8000", --api-key, "********"]
        probes: 75/75 probes passed, median 40 ms, slowest long-prompt 900 ms
        summary: 75/75 probes passed
        failed_probes: []
"""
