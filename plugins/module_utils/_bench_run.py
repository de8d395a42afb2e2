# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The measurement engine_bench makes on the host: the warm-up, then the measured requests sent
concurrency at a time (or over and over until duration_seconds), each answer's figures as vLLM's
own serving benchmark defines them, and a progress file the action follows.

Runs on the host: standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
import threading
import time
from urllib.parse import urlsplit

from ansible_collections.biv100.serving.plugins.module_utils._bench_figures import (
    compute,
    new_record,
    rounded,
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


def parameter_problems(params):
    """What is wrong with the measurement's parameters (concurrency already resolved), one
    sentence each."""
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
    return problems


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
