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
module: tune_search
short_description: Plan, record and decide a search of the engine's launch parameters and environment
version_added: 0.2.0
description:
  - The controller's side of C(tune.yml), one O(step) at a time; the role biv100.serving.tune
    starts the engine and measures. The search's state is kept in C(build/tune/<run>/) at the
    project root - C(run.json) (the host, instance, release, incumbent and space),
    C(memory.jsonl) and C(candidates.jsonl) (one JSON line per memory step and per candidate
    run, fsynced as they are written), C(final.json) and C(proposal.yml) - so that a run stopped
    at any point is resumed from what it wrote.
  - O(step=plan) loads the space (C(files/tune/<name>.yml) or a path, described in
    C(plugins/plugin_utils/_tune_space.py)), begins the run or, with O(resume), checks that the
    run resumed searched the same host, instance, release and incumbent; returns the starts of
    the memory step-down still to make.
  - O(step=round) returns the candidates of round O(round) still to measure, the invalid ones
    (refused by the deploy's own checks of the arguments and allocator options) recorded first
    and never started.
  - O(step=record) appends one candidate's record and shows one progress line with its figures
    and the best so far.
  - O(step=final) names the best candidates that cleared every gate, to measure again beside
    the incumbent, and the order of their trials - trial n of each in block n, each block in an
    order drawn from the run's name (the same when the run is resumed), without the trials whose
    results file is written already.
  - O(step=propose) judges those repeated trials against the incumbent's with the canary
    analysis' judge; a candidate is proposed only when the judge passes it and the whole
    confidence interval of its score's shift lies above 0. Writes C(proposal.yml) - the
    winner's settings, or the incumbent's when none beats it.
  - Needs C(scipy) on the controller for O(step=propose) (the project's C(requirements.txt)).
options:
  step:
    description: What to do.
    type: str
    required: true
    choices: [plan, round, record, final, propose]
  run_dir:
    description: The run's folder, as O(step=plan) returned it; required by every other step.
    type: str
  run:
    description: The name of a new run, which names its folder; required by O(step=plan).
    type: str
  resume:
    description: The name of an earlier run to go on with instead of beginning O(run).
    type: str
    default: ""
  space:
    description: The search space, a name under C(files/tune) or a path (relative to the playbook).
    type: str
    default: default
  host:
    description: The host tuned, for the run's record and its lines.
    type: str
  instance:
    description: The engine instance tuned.
    type: str
  release:
    description: The release the host runs.
    type: str
  incumbent:
    description: The instance's current settings, C(engine_args), C(engine_allocator) and C(engine_env).
    type: dict
  facts:
    description:
      - What each candidate is checked against before it may run - C(known_flags) (the host's
        CLI), C(gpus_free), C(max_position_embeddings), C(allow_long_max_model_len),
        C(torch_version). A fact left out is not judged.
    type: dict
    default: {}
  results_dir:
    description: The folder of the runs; a relative one is the project's.
    type: path
  probe_suites:
    description:
      - For O(step=plan) of a new run, the probe suites the candidates will be probed with (files or
        folders); a candidate whose C(max_num_seqs) is below the most choices (C(n)) a probe asks
        for is listed invalid and never started, since that probe fails it by construction.
    type: list
    elements: str
    default: []
  round:
    description:
      - The round of O(step=round), from 1.
      - With O(step=record), the round the candidate was measured in; none for a finalist that
        failed its final trials, which are no round.
    type: int
  file:
    description: Which file O(step=record) appends to - the rounds' or the memory step-down's.
    type: str
    choices: [candidates, memory]
    default: candidates
  candidate:
    description: The candidate recorded, as O(step=round) or O(step=plan) returned it.
    type: dict
  status:
    description: How the candidate ended.
    type: str
    choices: [measured, missed_gate, failed_to_start, started]
  factor:
    description: The fraction of the workload its bench measured.
    type: float
  bench:
    description: Its M(biv100.serving.engine_bench) result.
    type: dict
  quality:
    description: Its M(biv100.serving.engine_quality) result.
    type: dict
  probes:
    description: Its M(biv100.serving.engine_probe) result.
    type: dict
  failure:
    description: Why it missed a gate or failed to start.
    type: str
  log_tail:
    description: The end of the engine's log, for a failed start.
    type: str
  finalists:
    description:
      - How many of the best candidates O(step=final) names.
      - With O(step=round) and O(trials), for the cost of the whole search, said before it starts.
    type: int
    default: 2
  trials:
    description:
      - For O(step=propose), how many times each finalist and the incumbent were benched again
        (with O(step=final), how many times they are to be; with O(step=round), for the search's
        cost).
        Their figures are read from the results files of C(<run_dir>/trials/<id>-<n>/), n from 1
        to O(trials); a finalist whose final trials failed (its latest record is of no round) has
        none.
    type: int
  quality_margin:
    description:
      - For O(step=propose), the drop of the quality score the judge allows.
      - Default the quality gate's bound the incumbent was held to.
    type: float
  min_gain:
    description:
      - For O(step=propose), the least gain worth deploying, a fraction of the incumbent's score - a
        finalist is proposed only when the lower end of its score's interval clears it.
    type: float
    default: 0.02
  latency:
    description:
      - For O(step=propose), the objective's latency limits (the throughput gate's, which held
        every candidate), stated in the proposal's line.
    type: dict
extends_documentation_fragment:
  - biv100.serving.controller_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.conn
  - ansible.builtin.action_common_attributes.flow
attributes:
  check_mode:
    support: none
    details: A search starts engines; in check mode the step is skipped.
  diff_mode:
    support: none
seealso:
  - module: biv100.serving.canary_analysis
  - module: biv100.serving.engine_bench
author:
  - biv100.serving maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Begin a tuning run over the shipped space
  biv100.serving.tune_search:
    step: plan
    run: "{{ serving_run_id }}"
    space: default
    host: "{{ inventory_hostname }}"
    instance: vllm
    release: sub510
    incumbent: {engine_args: {max_num_seqs: 2}, engine_allocator: {}, engine_env: {}}
  register: tune_plan

- name: The first round's candidates still to measure
  biv100.serving.tune_search:
    step: round
    run_dir: "{{ tune_plan.run_dir }}"
    round: 1
  register: tune_round
"""

RETURN = r"""
msg:
  description: What the step found or decided, one line.
  returned: success
  type: str
run:
  description: The run's name (O(step=plan)).
  returned: O(step=plan)
  type: str
run_dir:
  description: The run's folder (O(step=plan)).
  returned: O(step=plan)
  type: str
incumbent:
  description: Candidate 0, the instance's current settings with its id.
  returned: O(step=plan), O(step=final)
  type: dict
memory_steps:
  description: The starts of the memory step-down still to make, highest gpu_memory_utilization first.
  returned: O(step=plan)
  type: list
  elements: dict
deadline:
  description: The controller's clock (seconds since the epoch) past which no new candidate starts.
  returned: O(step=plan)
  type: float
rounds:
  description: How many rounds the search has.
  returned: O(step=round)
  type: int
pending:
  description: The round's candidates still to measure, in order.
  returned: O(step=round)
  type: list
  elements: dict
factor:
  description: The fraction of the workload the round's benches measure.
  returned: O(step=round)
  type: float
record:
  description: The record appended.
  returned: O(step=record)
  type: dict
failed_finalists:
  description:
    - The ids of the finalists whose final trials failed (their latest record is a failure of no
      round), by the run's records; the role runs none of their other trials.
  returned: O(step=record)
  type: list
  elements: str
measure:
  description: The candidates to measure again, the incumbent first when it cleared every gate.
  returned: O(step=final)
  type: list
  elements: dict
schedule:
  description:
    - The final trials still to run, in their order, each C({candidate, trial}) - C(candidate)
      one of RV(measure), C(trial) its number from 1.
  returned: O(step=final)
  type: list
  elements: dict
proposed:
  description: Whether a candidate beat the incumbent.
  returned: O(step=propose)
  type: bool
proposal_file:
  description: The proposal, C(deploy.yml -e @<file>).
  returned: O(step=propose)
  type: str
changes:
  description: The settings the proposal changes, C(<section>.<key> <old> -> <new>).
  returned: O(step=propose)
  type: list
  elements: str
tune:
  description: What the ledger keeps of the run.
  returned: O(step=propose)
  type: dict
"""
