#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_bench
short_description: Measure the engine's serving throughput from the host, as vLLM's own benchmark does
version_added: 0.2.0
description:
  - Sends chat completion requests to the engine at O(url) from the host itself (over loopback,
    so the engine's port need not be reachable from the controller and the network does not
    count), O(concurrency) at a time, and returns the throughput and latency figures as vLLM's
    C(vllm bench serve) defines them - TTFT, ITL (the gaps between successive token chunks),
    TPOT (latency less TTFT over the output tokens but one), end-to-end latency, their mean,
    p50, p90 and p99, and the tokens per second over the measured wall time - with the
    weighted score C(weights.output * output_tps + weights.input * input_tps).
  - Token counts are the server's own (C(usage.prompt_tokens), C(usage.completion_tokens) of the
    final usage chunk a stream sends when asked with C(stream_options.include_usage)), never
    counted on the client; a request whose answer carries no usage counts as failed.
  - The first O(warmup) requests are sent before the measurement starts and are left out of
    every figure and of the duration.
  - 'The action makes the requests on the controller from O(workload) (the format is in
    C(plugins/plugin_utils/_bench_workload.py)), or takes O(requests), and starts the
    measurement as a worker on the host, detached from the call; until the worker ends it polls
    it every O(poll_seconds) and shows the run so far (C(lab-h1: bench 12/24 requests, 3.1 s,
    output 2310 tok/s, input 9800 tok/s)). The poll that finds the worker ended takes its result
    and removes the job''s folder on the host (never the requests or the key, which stay in the
    worker''s memory); a poll that fails stops the worker. The action then judges the score
    against O(gate), and with O(release) writes the figures to
    C(<results_dir>/<release>/<label>.json).'
  - 'Two engines are measured at once (the canary beside its baseline) with O(detach) and
    O(attach): a task with O(detach) starts the measurement and returns its RV(job) at once; a
    later task given that job as O(attach) follows it as above, while another engine is benched
    between the two.'
  - The task fails when more than O(max_failed_fraction) of the measured requests failed or
    the host half failed - not when the score misses the gate, which is returned as data
    (RV(gate.passed)) for the playbook to decide on.
  - Only C(http://) URLs are measured (the engine's local address).
  - Every figure measured against the lab's engine stand-in, which marks its answers with the
    C(x-biv100-simulated) header, is marked RV(simulated), and every message says so.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  served_model_name:
    description:
      - The model name the engine serves; it is the C(model) of every request that has none.
    type: str
    required: true
  workload:
    description:
      - The workload - a file of C(files/bench/) of this collection named without its C(.yml)
        (C(default), C(competition)), or the path of a workload file on the controller (a
        relative path is found beside the playbook).
      - Give either O(workload) or O(requests).
      - Read by the action.
    type: str
  datasets:
    description:
      - 'The datasets workload files may name (C({dataset: <name>})), as C(name: path) of JSON
        Lines files on the controller (a relative path is found beside the playbook); each line
        has C(prompt), a text, and may have C(output_tokens).'
      - Read only with O(workload).
    type: dict
    default: {}
  workload_factor:
    description:
      - The fraction of the O(workload) to measure - of its measured requests (at least one) or
        of its duration - with its warm-up, seed and mix kept; the short benches of
        C(tune.yml)'s successive halving.
      - Above 0 and at most 1. Read only with O(workload).
    type: float
    default: 1.0
  requests:
    description:
      - The requests, as chat completion request bodies, each sent as a C(POST) to
        C(/v1/chat/completions); a body without C(model) gets O(served_model_name).
      - A body with C(stream) true is read as server-sent events and should ask for the usage
        chunk (C(stream_options.include_usage)); a body without is timed as one chunk (its TTFT is
        its latency, it has no ITL).
      - Give either O(requests) (requests of your own) or O(workload).
    type: list
    elements: dict
  warmup:
    description:
      - How many of the leading O(requests) warm the engine up; they are sent first, and the
        measurement starts when they have all ended.
      - Read only with O(requests) (a workload says its own).
    type: int
    default: 0
  concurrency:
    description:
      - How many requests are in flight at once.
      - Default the workload's C(concurrency), else O(max_num_seqs); one of the three is
        required.
    type: int
  max_num_seqs:
    description:
      - The engine's C(max_num_seqs), the O(concurrency) when neither the task nor the workload sets one.
    type: int
  duration_seconds:
    description:
      - Send the measured requests again and again until this many seconds after the
        measurement started, then wait for those in flight; each pass after the first marks its
        first message with the pass number, so that the engine cannot serve a prompt from its cache.
      - Read only with O(requests) (a workload says its own).
    type: float
  timeout:
    description: Seconds one request may take, from sending to its last event.
    type: float
    default: 600
  api_key_env_file:
    description:
      - The engine's env file on the host, whose C(VLLM_API_KEY) is the bearer token, read as
        systemd's C(EnvironmentFile=) reads it (a line that is not C(NAME=value) fails the task).
      - The task's way to give the key (its action refuses O(api_key), as Ansible may write a
        module's arguments to a file on the host); the worker reads it before it detaches.
    type: str
  progress_file:
    description:
      - A file on the host rewritten whole about every second with the requests done and failed,
        the seconds elapsed, the tokens so far and the running tokens per second; default one in
        the job's own folder, which goes with the job.
    type: path
  weights:
    description:
      - The weights of the score; the competition's are C(output) 0.83 and C(input) 0.17.
    type: dict
    required: true
    suboptions:
      output:
        description: The weight of the output tokens per second.
        type: float
        required: true
      input:
        description: The weight of the input tokens per second.
        type: float
        required: true
  gate:
    description:
      - The score a release must reach (the competition's is 8000); RV(gate.passed) says whether it
        did. Missing it does not fail the task.
      - Required by the action, which alone reads it.
    type: float
  max_failed_fraction:
    description:
      - The task fails when more than this fraction of the measured requests failed, or none succeeded.
      - Read by the action.
    type: float
    default: 0.05
  release:
    description:
      - The release measured, which names the results file; without it no file is written.
      - Read by the action.
    type: str
  results_dir:
    description:
      - The folder on the controller of the results files, C(<results_dir>/<release>/<label>.json),
        each written whole or not at all. A relative path is under the project folder (that of
        the C(ansible.cfg) in use, else the current one). Default C(build/bench).
      - Read by the action.
    type: path
  label:
    description:
      - How the progress, the messages and the results file name the engine measured - the
        engine instance's label, C(<inventory_hostname>) or C(<inventory_hostname>/<instance>).
      - Default C(inventory_hostname), or the host the task is delegated to (the host measured,
        whose name the label must start with).
      - Read by the action.
    type: str
    version_added: 0.2.0
  latency:
    description:
      - The throughput gate's latency limits - C(ttft_p99_ms) and C(tpot_p99_ms), each
        milliseconds (such as C(250)) or a factor of the incumbent's figure (such as C(1.5x)), the
        incumbent being O(compare_with). RV(gate.passed) is true only when the score reaches
        O(gate) and every limit holds; a factor without O(compare_with) figures is not applied,
        and the message says so.
      - Read by the action.
    type: dict
    version_added: 0.2.0
  compare_with:
    description:
      - The figures of the host's last good release; the result and the message then have RV(deltas).
      - Read by the action.
    type: dict
    suboptions:
      release:
        description: The release the figures are of.
        type: str
        required: true
      figures:
        description:
          - Its figures, as a results file of this action holds them (C(score), C(output_tps),
            C(input_tps), C(ttft_ms.p99), C(tpot_ms.p99)); a figure missing has a null delta.
        type: dict
        required: true
  poll_seconds:
    description:
      - How often the action shows a line of the host's progress (the first after at most a second).
      - Read by the action.
    type: float
    default: 5
  quality:
    description:
      - The quality gate's verdict for this release and host (M(biv100.serving.engine_quality)'s
        result), the results file's C(quality) without the keys of a task result; without it,
        null or the verdict the file already holds.
      - Read by the action.
    type: dict
  detach:
    description:
      - Start the measurement on the host and return at once with RV(job), without following it -
        no progress line, no verdict, no results file; a later task given RV(job) as O(attach)
        follows it.
      - A job never attached runs to its end and leaves its result in the host's temporary
        folder; a play that may stop between the two tasks attaches in an C(always) section.
      - Excludes O(attach).
      - Read by the action.
    type: bool
    default: false
  attach:
    description:
      - The RV(job) a task with O(detach) returned, to follow instead of starting a measurement -
        the progress lines, the time limit (counted from the job's start), the worker stopped
        when following fails, the verdict and, with O(release), the results file, as without it.
      - The other options are given again as the detached task had them (the verdict and the
        time limit are computed from them); a job of another O(label) is refused.
      - Excludes O(detach).
      - Read by the action.
    type: dict
    suboptions:
      dir:
        description: The job's folder on the host.
        type: str
        required: true
      pid:
        description: The process id of the job's worker.
        type: int
        required: true
      started:
        description: When the job started, in UTC (C(2026-01-31T12:00:00Z)).
        type: str
        required: true
      label:
        description: The O(label) of the task that started it.
        type: str
        required: true
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - biv100.serving.engine_endpoint
attributes:
  action:
    support: full
    details:
      - The action of the same name makes the requests from the workload, runs the host half,
        shows its progress, judges the gate and writes the results file.
  async:
    support: none
    details:
      - The action runs the host half as a detached worker and follows it itself, to show its
        progress while it runs; the task's own C(async) is refused.
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details:
      - The requests change nothing but the engine's caches, so they are sent in check mode
        too; the action writes no results file then. A task with O(detach) starts its job in
        check mode as well, and the task that attaches to it writes no results file.
  diff_mode:
    support: none
notes:
  - Synthetic prompts are sized in the lab stand-in's tokens; the figures use the server's
    counts, so a real tokenizer's different count changes the prompt lengths, not the
    arithmetic.
  - Every synthetic request asks for C(ignore_eos), vLLM's extension that makes the engine
    generate exactly C(max_tokens) tokens, as vLLM's benchmark does for synthetic data.
seealso:
  - module: biv100.serving.engine_probe
  - module: biv100.serving.engine_quality
  - module: biv100.serving.engine_health
"""

EXAMPLES = r"""
- name: Measure the engine with the lab's short workload and judge the gate
  biv100.serving.engine_bench:
    workload: default
    served_model_name: qwen3_5
    max_num_seqs: 2
    weights: {output: 0.83, input: 0.17}
    gate: 8000
    url: http://127.0.0.1:8000
    api_key_env_file: /etc/biv100-serving/engine.env
    release: sub510
  register: bench

- name: The competition's mix, against the last good release's figures
  biv100.serving.engine_bench:
    workload: competition
    datasets:
      longbench: "{{ playbook_dir }}/datasets/longbench.jsonl"
    served_model_name: qwen3_5
    max_num_seqs: 2
    weights: {output: 0.83, input: 0.17}
    gate: 8000
    release: sub511
    compare_with:
      release: sub510
      figures: "{{ lookup('file', playbook_dir ~ '/build/bench/sub510/' ~ inventory_hostname ~ '.json') | from_json }}"

- name: Time requests of your own, four at a time for a minute, scored by output tokens alone
  biv100.serving.engine_bench:
    served_model_name: qwen3_5
    weights: {output: 1, input: 0}
    gate: 0
    concurrency: 4
    duration_seconds: 60
    requests:
      - messages: [{role: user, content: Write a haiku about GPUs.}]
        max_tokens: 64
        stream: true
        stream_options: {include_usage: true}

# The canary and a baseline host measured side by side, from the canary's task list.
- name: Start the baseline host's bench and return at once
  biv100.serving.engine_bench:
    workload: default
    served_model_name: qwen3_5
    max_num_seqs: 2
    weights: {output: 0.83, input: 0.17}
    gate: 8000
    detach: true
  delegate_to: "{{ canary_baseline_host }}"
  register: baseline_job

- name: Measure the canary while the baseline host's bench runs
  biv100.serving.engine_bench:
    workload: default
    served_model_name: qwen3_5
    max_num_seqs: 2
    weights: {output: 0.83, input: 0.17}
    gate: 8000
  register: canary_bench

- name: Take the baseline host's figures, with the same options as its start
  biv100.serving.engine_bench:
    workload: default
    served_model_name: qwen3_5
    max_num_seqs: 2
    weights: {output: 0.83, input: 0.17}
    gate: 8000
    attach: "{{ baseline_job.job }}"
  delegate_to: "{{ canary_baseline_host }}"
  register: baseline_bench
"""

RETURN = r"""
msg:
  description:
    - What was measured, and with the action the gate's verdict and the deltas; C([simulated])
      when the figures are the stand-in's.
    - With O(detach), the label and the job started.
  returned: always
  type: str
  sample: score 8437 >= 8000 (output 5900 tok/s, input 20100 tok/s) [simulated]
job:
  description:
    - The job started, for a later task's O(attach).
  returned: with O(detach)
  type: dict
  sample: {dir: /tmp/biv100-engine-bench-k2x9q1ab, pid: 48211, started: "2026-01-31T12:00:00Z", label: lab-h2}
  contains:
    dir:
      description: The job's folder on the host.
      type: str
    pid:
      description: The process id of the job's worker.
      type: int
    started:
      description: When the job started, in UTC.
      type: str
    label:
      description: The engine measured, as O(label).
      type: str
simulated:
  description: Whether any answer carried the C(x-biv100-simulated) header of the lab's stand-in.
  returned: unless O(detach)
  type: bool
requests:
  description: The measured requests that succeeded and failed (warm-up left out).
  returned: unless O(detach)
  type: dict
  contains:
    ok:
      description: Requests answered in full, with the usage.
      type: int
    failed:
      description: Requests that failed (an error status, an error event, no token, no usage, a timeout).
      type: int
input_tokens:
  description: The successful measured requests' C(usage.prompt_tokens), summed.
  returned: unless O(detach)
  type: int
output_tokens:
  description: The successful measured requests' C(usage.completion_tokens), summed.
  returned: unless O(detach)
  type: int
duration_s:
  description: The measured wall time, from the first measured request's start to the last one's end.
  returned: unless O(detach)
  type: float
request_tps:
  description: Successful requests per second.
  returned: unless O(detach)
  type: float
input_tps:
  description: Input tokens per second.
  returned: unless O(detach)
  type: float
output_tps:
  description: Output tokens per second.
  returned: unless O(detach)
  type: float
total_tps:
  description: Input and output tokens per second.
  returned: unless O(detach)
  type: float
ttft_ms:
  description: Time to the first token chunk, in milliseconds - C(mean), C(p50), C(p90), C(p99).
  returned: unless O(detach)
  type: dict
  sample: {mean: 210.4, p50: 198.2, p90: 260.1, p99: 301.7}
tpot_ms:
  description: Time per output token after the first (requests of more than one), as RV(ttft_ms).
  returned: unless O(detach)
  type: dict
itl_ms:
  description: Gaps between successive token chunks, as RV(ttft_ms).
  returned: unless O(detach)
  type: dict
e2e_ms:
  description: Whole request latency, as RV(ttft_ms).
  returned: unless O(detach)
  type: dict
samples:
  description:
    - Each successful measured request's own figures, in the order the requests started, so that
      two runs can be compared by their distributions (the canary analysis), not only by their
      summaries.
    - C(output_tps) is a request's output tokens over its E2E latency; C(ttft_ms), C(tpot_ms)
      (requests of more than one output token) and C(e2e_ms) are as above.
  returned: unless O(detach)
  type: dict
  sample: {output_tps: [512.4, 498.0], ttft_ms: [30.2, 31.5], tpot_ms: [1.9, 2.0], e2e_ms: [499.6, 514.1]}
weights:
  description: The weights of the score.
  returned: unless O(detach)
  type: dict
  sample: {output: 0.83, input: 0.17}
score:
  description: C(weights.output * output_tps + weights.input * input_tps).
  returned: unless O(detach)
  type: float
concurrency:
  description: The requests in flight at once.
  returned: unless O(detach)
  type: int
warmup:
  description: The warm-up requests that succeeded and failed.
  returned: unless O(detach)
  type: dict
failures:
  description:
    - The first 10 failed requests, the measured ones first, each C(index) (in O(requests)),
      C(warmup) and C(error).
  returned: unless O(detach)
  type: list
  elements: dict
progress_error:
  description: Why the progress file could not be written; null when it could.
  returned: unless O(detach)
  type: str
gate:
  description: The gate and the verdict.
  returned: unless O(detach)
  type: dict
  contains:
    score:
      description: The score the gate asks for.
      type: float
    passed:
      description: Whether the score reached it and every O(latency) limit held.
      type: bool
    latency:
      description: Each O(latency) limit applied - C(figure), C(value), C(limit_ms), C(passed);
        absent when none was.
      type: list
      elements: dict
deltas:
  description:
    - Against O(compare_with) - for C(score), C(output_tps), C(input_tps), C(ttft_p99_ms),
      C(tpot_p99_ms), each C(before), C(after), C(change) and C(percent) (null where before
      is missing or zero); C(release) names the release compared with.
  returned: with O(compare_with), unless O(detach)
  type: dict
workload:
  description:
    - The workload measured - C(name), C(file), C(seed), C(requests), C(warmup),
      C(duration_seconds), C(stream); null with O(requests).
  returned: unless O(detach)
  type: dict
record:
  description:
    - What a record of this bench keeps - the release record's C(gates.bench), the results file
      and (less C(samples)) the ledger line - the figures above with C(samples), C(gate),
      C(simulated) and C(workload).
  returned: unless O(detach)
  type: dict
release:
  description: The O(release) measured.
  returned: unless O(detach)
  type: str
results_file:
  description:
    - The results file written on the controller; null without O(release) or in check mode.
    - 'It holds RV(record), C(deltas), C(release), C(host), C(url), C(served_model_name),
      C(concurrency), C(failures), C(started) and C(finished) (UTC), and C(quality) - O(quality),
      else null for the quality gate to fill in (a value already there is kept).'
  returned: unless O(detach)
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.parameters import remove_values
from ansible_collections.biv100.serving.plugins.module_utils import _bench_job
from ansible_collections.biv100.serving.plugins.module_utils._bench_options import (
    MUTUALLY_EXCLUSIVE,
    argument_spec,
)
from ansible_collections.biv100.serving.plugins.module_utils._bench_run import (
    key_from_env_file,
    parameter_problems,
    run_bench,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            argument_spec(),
            # What the action tells the host half (as ansible.builtin.copy's _original_basename):
            # start the measurement as a detached worker (start), or follow the worker that
            # start left in _job_dir (status, waiting up to _job_wait seconds for it to end), or
            # end it (stop). Without _job the module measures within the call.
            _job=dict(type="str"),
            _job_dir=dict(type="path"),
            _job_wait=dict(type="float"),
        ),
        # The calls that follow a job send neither requests nor workload.
        required_if=[("_job", "start", ("requests", "workload"), True)],
        mutually_exclusive=MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )
    params = module.params
    if params["_job"] in ("status", "stop"):
        _bench_job.follow(module)
    if params["_job"] not in (None, "start"):
        module.fail_json(msg="_job must be start, status or stop, got %s" % params["_job"])
    if params["workload"] is not None:
        module.fail_json(msg="engine_bench makes the requests of a workload in its action plugin; "
                             "run it as a task, which sends the host half the requests")
    params["concurrency"] = params["concurrency"] or params["max_num_seqs"]
    problems = parameter_problems(params)
    if problems:
        module.fail_json(msg="; ".join(problems))
    api_key = params["api_key"]
    if not api_key and params["api_key_env_file"]:
        try:
            api_key = key_from_env_file(params["api_key_env_file"])
        except (OSError, ValueError) as error:
            module.fail_json(msg="api_key_env_file %s: %s" % (params["api_key_env_file"], error))
        if api_key:
            # Masked wherever the module reports, as an option marked no_log would be.
            module.no_log_values.add(api_key)
    # The request bodies are the workload's prompts - megabytes for long-context workloads -
    # and would otherwise travel back in the invocation of the result.
    shown = dict(params, requests="%d request bodies" % len(params["requests"]))
    if params["_job"] == "start":
        def measure(progress_file):
            result = run_bench(dict(params, progress_file=progress_file), api_key)
            # Masked before it is written to the job's folder, as exit_json would mask it.
            return remove_values(result, {api_key}) if api_key else result

        try:
            job_dir, pid = _bench_job.start(measure, params["progress_file"])
        except _bench_job.JobError as error:
            module.fail_json(msg=str(error))
        module.exit_json(changed=False, job_dir=job_dir, pid=pid, invocation={"module_args": shown},
                         msg="the benchmark runs in worker %d" % pid)
    result = run_bench(params, api_key)
    module.exit_json(invocation={"module_args": shown}, **result)


if __name__ == "__main__":
    main()
