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
  - 'The action of the same name makes the requests on the controller from O(workload) (a
    workload file; the format is described in C(plugins/plugin_utils/_bench_workload.py)) or
    takes O(requests) as given and calls the module to start the measurement as a worker of its
    own on the host, detached from the call; then, until the worker ends, it calls the module
    again every O(poll_seconds) and shows a line of the run so far (C(lab-h1: bench 12/24
    requests, 3.1 s, output 2310 tok/s, input 9800 tok/s)). The call that finds the worker ended
    takes its result and removes the job''s private folder on the host (the worker''s lock,
    pid, progress and result; never the requests or the key, which stay in the worker''s
    memory); a follow that fails stops the worker. The action then judges the score against
    O(gate), and with O(release) writes the figures to
    C(<results_dir>/<release>/<inventory_hostname>.json).'
  - 'Two engines are measured at the same time from one task list (the canary analysis benches
    the canary beside a baseline host) with O(detach) and O(attach): a task with O(detach) starts
    the measurement on its host and returns at once with its RV(job); a later task, given that
    job as O(attach), follows it as above instead of starting one. Between the two, another
    engine is benched - typically the play''s own host, while the detached job measures the
    host the two tasks are delegated to.'
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
        chunk (C(stream_options.include_usage)); a body without is timed as one chunk, so its
        TTFT is its latency and it has no ITL.
      - The action makes them from O(workload); give them only to measure requests of your own.
      - Give either O(requests) or O(workload).
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
      - The engine's C(max_num_seqs), the O(concurrency) when neither the task nor the workload
        sets one - as many requests as the engine schedules at once.
    type: int
  duration_seconds:
    description:
      - Stop sending new requests this many seconds after the measurement started; the
        requests in flight are waited for.
      - Then the measured requests are sent again and again until the time is up, each pass
        after the first with its first message marked by the pass number, so that no two
        requests share a prompt the engine could have cached.
      - Read only with O(requests) (a workload says its own).
    type: float
  timeout:
    description: Seconds one request may take, from sending to its last event.
    type: float
    default: 600
  api_key_env_file:
    description:
      - An environment file on the host (C(NAME=value) lines, as the engine role writes
        C(engine_env_file)) whose C(VLLM_API_KEY) is the bearer token, when O(api_key) is not
        given; it is read as systemd's C(EnvironmentFile=) reads it, as
        M(biv100.serving.engine_process) does, and a line that is not C(NAME=value) fails the
        task.
      - The task's way to give the key - its action refuses O(api_key), because Ansible may write
        a module's arguments to a file on the host - so that the key stays in the one file the
        engine reads it from; the worker reads it before it detaches and keeps it in memory.
    type: str
  progress_file:
    description:
      - A file on the host that the module rewrites about every second, by renaming a whole new
        file over it, with the requests done and failed, the seconds elapsed, the output and
        input tokens so far and the running tokens per second.
      - Without it the worker writes its progress in the job's own folder, which goes with the job.
    type: path
  weights:
    description:
      - The weights of the score - the competition's are C(output) 0.83 and C(input) 0.17, which
        the gates role passes from C(gates_competition) in its defaults.
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
      - The score a release must reach; RV(gate.passed) says whether it did. The competition's is
        8000, which the gates role passes from C(gates_competition) in its defaults.
      - Missing it does not fail the task.
      - Required by the action, which alone reads it.
    type: float
  max_failed_fraction:
    description:
      - The task fails when more than this fraction of the measured requests failed (or none
        succeeded).
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
      - The folder on the controller of the results files, C(<results_dir>/<release>/<inventory_hostname>.json),
        each written whole or not at all.
      - A relative path is under the project folder, where the C(ansible.cfg) in use is (the
        current folder without one), never inside the collection. Default C(build/bench).
      - Read by the action.
    type: path
  label:
    description:
      - How the progress, the messages and the results file name the engine measured - the
        engine instance's label, C(<inventory_hostname>) for a host of one engine,
        C(<inventory_hostname>/<instance>) for one of several; the figures go to
        C(<results_dir>/<release>/<label>.json).
      - Default C(inventory_hostname), or the host the task is delegated to with C(delegate_to)
        (the host measured, whose name the label must start with).
      - Read by the action.
    type: str
    version_added: 0.2.0
  compare_with:
    description:
      - The figures of the host's last good release; the result then has RV(deltas) and the
        message states them.
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
      - How often the action reads the host's progress and shows a line of it (the first time
        after at most a second).
      - Read by the action.
    type: float
    default: 5
  quality:
    description:
      - The quality gate's verdict for this release and host (the registered result of
        M(biv100.serving.engine_quality)), recorded as the results file's C(quality) without the
        keys of a task result (C(changed), C(invocation), ...).
      - Without it the file's C(quality) is null - or the verdict the file already holds, which
        the quality gate may have written.
      - Read by the action.
    type: dict
  detach:
    description:
      - Start the measurement on the host and return at once with RV(job), without following it -
        no progress line, no verdict, no results file; a later task given RV(job) as O(attach)
        follows it.
      - A job never attached runs to its end and leaves its folder in the host's temporary folder
        (its result, never the requests or the key); a play that may stop between the two tasks
        attaches in an C(always) section.
      - Excludes O(attach).
      - Read by the action.
    type: bool
    default: false
  attach:
    description:
      - The RV(job) a task with O(detach) returned, to follow instead of starting a measurement -
        the progress lines, the time limit (counted from the job's start), the worker stopped
        when following fails, the verdict and, with O(release), the results file, as without it.
      - The other options are given again as the detached task had them, since the verdict and
        the time limit are computed from them; a job of another O(label) than this task's is
        refused.
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
      description: Whether the score reached it.
      type: bool
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
    - 'It holds the figures (C(score), C(input_tps), C(output_tps), C(total_tps), C(request_tps),
      C(requests), C(input_tokens), C(output_tokens), C(duration_s), C(ttft_ms), C(tpot_ms),
      C(itl_ms), C(e2e_ms), C(weights)), C(gate), C(simulated), C(deltas), C(workload),
      C(release), C(host), C(url), C(served_model_name), C(concurrency), C(failures),
      C(started) and C(finished) (UTC), and C(quality) - O(quality), else null for the quality
      gate to fill in (a value already there is kept).'
  returned: unless O(detach)
  type: str
"""

import json
import os
import threading
import time
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.parameters import remove_values
from ansible_collections.biv100.serving.plugins.module_utils import _bench_job
from ansible_collections.biv100.serving.plugins.module_utils._bench_figures import (
    compute,
    new_record,
    rounded,
)
from ansible_collections.biv100.serving.plugins.module_utils._bench_options import (
    MUTUALLY_EXCLUSIVE,
    argument_spec,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_http import (
    EngineClient,
    EngineHttpError,
)
from ansible_collections.biv100.serving.plugins.module_utils._env_file import read_env_file
from ansible_collections.biv100.serving.plugins.module_utils._state_store import atomic_write

CHAT_PATH = "/v1/chat/completions"
SIMULATED_HEADER = "x-biv100-simulated"
# How often the progress file is rewritten; the action reads it every poll_seconds.
PROGRESS_INTERVAL = 1.0
KEPT_FAILURES = 10
EXCERPT_CHARS = 300


def client_for(url, api_key, timeout):
    if urlsplit(url).scheme != "http":
        raise ValueError("url %s: only http:// is measured (the engine's local address)" % url)
    return EngineClient(url, api_key, connect_timeout=timeout, read_timeout=timeout)


def for_pass(body, number):
    """The body as sent on pass `number` of a duration-bound run: from the second pass on, its
    first message starts with the pass number, so the engine cannot serve its prompt from the
    prefix cache that the first pass filled."""
    if number == 0:
        return body
    messages = body.get("messages")
    if not messages or not isinstance(messages[0], dict) or not isinstance(messages[0].get("content"), str):
        return body
    first = dict(messages[0], content="(pass %d) %s" % (number, messages[0]["content"]))
    return dict(body, messages=[first] + list(messages[1:]))


class Sender(object):
    """Sends one request and times what comes back into a record of _bench_figures."""

    def __init__(self, url, api_key, timeout, clock):
        self.client = client_for(url, api_key, timeout)
        self.timeout = timeout
        self.clock = clock
        self.simulated = False

    def send(self, body, record):
        stream = bool(body.get("stream"))
        accept = {"Accept": "text/event-stream" if stream else "application/json"}
        record["start"] = self.clock()
        deadline = record["start"] + self.timeout
        try:
            with self.client.open("POST", CHAT_PATH, json_body=body, headers=accept) as answer:
                if answer.header(SIMULATED_HEADER) is not None:
                    self.simulated = True
                if answer.status != 200:
                    detail = answer.error_detail(EXCERPT_CHARS)
                    record["error"] = ("HTTP %d: %s" % (answer.status, detail))[:EXCERPT_CHARS]
                elif stream:
                    self.read_events(answer, record, deadline)
                else:
                    self.read_body(answer, record)
        except EngineHttpError as error:
            record["error"] = error.reason[:EXCERPT_CHARS]
        except ValueError as error:
            record["error"] = str(error)[:EXCERPT_CHARS]
        if record["error"] is None:
            record["error"] = self.missing(record)

    def read_events(self, answer, record, deadline):
        """Server-sent events as vLLM's benchmark reads them: each event but [DONE] is timed
        when it arrived; one whose `choices` is not empty is a token chunk."""
        usage = None
        for event in answer.events(self.clock):
            now = event.arrival
            if now > deadline:
                record["error"] = "timed out after %g s" % self.timeout
                return
            try:
                document = json.loads(event.data)
            except ValueError:
                record["error"] = ("an event that is not JSON: %s" % event.data)[:EXCERPT_CHARS]
                return
            record["last_event"] = now
            if not isinstance(document, dict):
                continue
            if document.get("error"):
                error = document["error"]
                message = error.get("message") if isinstance(error, dict) else error
                record["error"] = ("error event: %s" % message)[:EXCERPT_CHARS]
                return
            if document.get("choices"):
                record["chunks"].append(now)
            if document.get("usage"):
                usage = document["usage"]
        self.take_usage(record, usage)

    def read_body(self, answer, record):
        data = answer.read()
        now = self.clock()
        document = json.loads(data.decode("utf-8"))
        record["chunks"].append(now)
        record["last_event"] = now
        self.take_usage(record, document.get("usage") if isinstance(document, dict) else None)

    @staticmethod
    def take_usage(record, usage):
        if isinstance(usage, dict):
            record["prompt_tokens"] = usage.get("prompt_tokens")
            record["completion_tokens"] = usage.get("completion_tokens")

    @staticmethod
    def missing(record):
        """Why an answer that came cannot be counted; None when it can."""
        if not record["chunks"]:
            return "no token chunk in the answer"
        if not isinstance(record["prompt_tokens"], int) or not isinstance(record["completion_tokens"], int):
            return ("no usage in the answer: the server's prompt and completion token counts are "
                    "needed (a stream must ask for them with stream_options.include_usage)")
        return None


class Progress(object):
    """The run so far, rewritten to the progress file about every PROGRESS_INTERVAL seconds."""

    def __init__(self, path, warmup, planned, duration_seconds, clock):
        self.path = path
        self.clock = clock
        self.lock = threading.Lock()
        self.phase = "warmup" if warmup else "measuring"
        self.started = clock()
        self.measure_started = None if warmup else self.started
        self.warmup = {"done": 0, "failed": 0, "total": warmup}
        self.requests = {"done": 0, "ok": 0, "failed": 0, "total": planned}
        self.duration_seconds = duration_seconds
        self.tokens = {"input": 0, "output": 0}
        self.simulated = False
        self.error = None
        self.stopped = threading.Event()
        self.thread = None

    def start(self):
        if not self.path:
            return
        self.write()
        self.thread = threading.Thread(target=self.loop)
        self.thread.daemon = True
        self.thread.start()

    def loop(self):
        while not self.stopped.wait(PROGRESS_INTERVAL):
            self.write()

    def measuring(self, started):
        with self.lock:
            self.phase = "measuring"
            self.measure_started = started

    def count(self, record, simulated):
        with self.lock:
            self.simulated = self.simulated or simulated
            counter = self.warmup if record["warmup"] else self.requests
            counter["done"] += 1
            if record["error"] is not None:
                counter["failed"] += 1
                return
            if not record["warmup"]:
                counter["ok"] += 1
                self.tokens["input"] += record["prompt_tokens"]
                self.tokens["output"] += record["completion_tokens"]

    def finish(self):
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        with self.lock:
            self.phase = "done"
        if self.path:
            self.write()

    def document(self):
        with self.lock:
            now = self.clock()
            since = self.measure_started if self.measure_started is not None else self.started
            elapsed = max(now - since, 0.0)

            def rate(amount):
                return round(amount / elapsed, 1) if elapsed > 0 and self.measure_started is not None else 0.0

            return {
                "phase": self.phase,
                "warmup": dict(self.warmup),
                "requests": dict(self.requests),
                "duration_seconds": self.duration_seconds,
                "elapsed_s": round(elapsed, 2),
                "input_tokens": self.tokens["input"],
                "output_tokens": self.tokens["output"],
                "input_tps": rate(self.tokens["input"]),
                "output_tps": rate(self.tokens["output"]),
                "simulated": self.simulated,
                "updated": time.time(),
            }

    def write(self):
        """Whole or not at all (the state store's atomic write), so that a reader never sees a part."""
        try:
            atomic_write(self.path, json.dumps(self.document()).encode("utf-8"))
        except OSError as error:
            # The progress is for people watching; the measurement goes on without it.
            self.error = self.error or "%s: %s" % (self.path, error)


class Jobs(object):
    """The requests of one phase, handed to the workers one at a time: each once, or with a
    deadline pass after pass until it comes."""

    def __init__(self, bodies, warmup, deadline, repeat, clock):
        self.bodies = bodies
        self.warmup = warmup
        self.deadline = deadline
        self.repeat = repeat
        self.clock = clock
        self.lock = threading.Lock()
        self.sent = 0

    def next(self):
        with self.lock:
            if self.deadline is not None and self.clock() >= self.deadline:
                return None
            number, index = divmod(self.sent, len(self.bodies))
            if number and not self.repeat:
                return None
            self.sent += 1
            return index, for_pass(self.bodies[index], number)


def run_phase(jobs, concurrency, sender, progress, records, offset):
    """Send the phase's requests, `concurrency` at a time, until none is left."""

    def worker():
        while True:
            job = jobs.next()
            if job is None:
                return
            index, body = job
            record = new_record(jobs.warmup)
            record["index"] = offset + index
            sender.send(body, record)
            records.append(record)
            progress.count(record, sender.simulated)

    workers = min(concurrency, len(jobs.bodies)) if not jobs.repeat else concurrency
    threads = [threading.Thread(target=worker) for _slot in range(workers)]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()


def key_from_env_file(path):
    """VLLM_API_KEY's value in the engine's env file, or None."""
    return read_env_file(path).get("VLLM_API_KEY")


def run_bench(params, api_key=None, clock=time.perf_counter):
    """The measurement: warm-up, then the measured requests; the module's result."""
    model = params["served_model_name"]
    bodies = [body if body.get("model") else dict(body, model=model) for body in params["requests"]]
    warmup = params["warmup"] or 0
    concurrency = params["concurrency"]
    duration = params.get("duration_seconds")
    measured = bodies[warmup:]
    sender = Sender(params["url"], api_key, params["timeout"], clock)
    progress = Progress(params.get("progress_file"), warmup, None if duration else len(measured), duration, clock)
    records = []
    progress.start()
    try:
        if warmup:
            run_phase(Jobs(bodies[:warmup], True, None, False, clock), concurrency, sender, progress, records, 0)
        started = clock()
        progress.measuring(started)
        deadline = started + duration if duration else None
        run_phase(Jobs(measured, False, deadline, bool(duration), clock), concurrency, sender, progress,
                  records, warmup)
        ended = clock()
    finally:
        progress.finish()
    figures = rounded(compute(records, ended - started, params.get("weights")))
    warm = [record for record in records if record["warmup"]]
    failed = [record for record in records if record["error"] is not None]
    # The measured requests' failures first: they are the ones the verdict counts.
    failed.sort(key=lambda record: (record["warmup"], record["start"]))
    result = dict(
        figures,
        changed=False,
        simulated=sender.simulated,
        concurrency=concurrency,
        warmup={"ok": sum(1 for record in warm if record["error"] is None),
                "failed": sum(1 for record in warm if record["error"] is not None)},
        failures=[{"index": record["index"], "warmup": record["warmup"], "error": record["error"]}
                  for record in failed[:KEPT_FAILURES]],
        progress_error=progress.error,
    )
    result["msg"] = "%d of %d requests ok in %.1f s: output %.0f tok/s, input %.0f tok/s, score %.0f%s" % (
        figures["requests"]["ok"], figures["requests"]["ok"] + figures["requests"]["failed"],
        figures["duration_s"], figures["output_tps"], figures["input_tps"], figures["score"],
        " [simulated]" if sender.simulated else "")
    return result


def follow(module):
    """_job status or stop: the job's progress, its result once it ended, or its end."""
    params = module.params
    if not params["_job_dir"]:
        module.fail_json(msg="_job %s needs _job_dir, the folder _job start returned" % params["_job"])
    try:
        if params["_job"] == "stop":
            stopped = _bench_job.stop(params["_job_dir"])
            module.exit_json(changed=stopped, stopped=stopped,
                             msg="the benchmark worker was stopped" if stopped else "no benchmark worker ran")
        found = _bench_job.status(params["_job_dir"], params["_job_wait"] or 0)
    except _bench_job.JobError as error:
        # A worker that ended without a result leaves no job to follow.
        module.fail_json(msg=str(error), finished=not os.path.lexists(params["_job_dir"]))
    if not found["finished"]:
        module.exit_json(changed=False, finished=False, progress=found["progress"])
    result = dict(found["result"], finished=True)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


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
        follow(module)
    if params["_job"] not in (None, "start"):
        module.fail_json(msg="_job must be start, status or stop, got %s" % params["_job"])
    if params["workload"] is not None:
        module.fail_json(msg="engine_bench makes the requests of a workload in its action plugin; "
                             "run it as a task, which sends the host half the requests")
    params["concurrency"] = params["concurrency"] or params["max_num_seqs"]
    problems = []
    if not params["requests"]:
        problems.append("requests is empty")
    if not params["concurrency"] or params["concurrency"] < 1:
        problems.append("concurrency (or max_num_seqs) must be 1 or more")
    if params["warmup"] < 0 or params["warmup"] >= len(params["requests"] or []):
        problems.append("warmup (%d) must leave at least one of the %d requests to measure"
                        % (params["warmup"], len(params["requests"] or [])))
    if params["duration_seconds"] is not None and params["duration_seconds"] <= 0:
        problems.append("duration_seconds must be above 0")
    if params["timeout"] <= 0:
        problems.append("timeout must be above 0")
    try:
        client_for(params["url"], None, 1)
    except ValueError as error:
        problems.append(str(error))
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
