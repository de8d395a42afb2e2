# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller half of biv100.serving.engine_bench: the throughput gate.

The workload is expanded into request bodies here (a bad workload fails before anything is
sent). One call of the module starts the measurement as a worker detached from it on the host;
each call after waits there up to poll_seconds for the worker to end and otherwise answers the
run so far, which is shown as one line; the call that finds it ended brings its result back and
removes the job's folder. Should following the worker fail (a lost connection, the time limit,
an interrupt), a last call stops it. The gate's verdict is data: the task fails only when the
module failed or more than max_failed_fraction of the measured requests did.

With detach the task only starts the job and returns it; a later task given it as attach
follows it instead of starting one. Between the two, other tasks run - the bench of another
host among them - so that two hosts are measured at the same time from one task list.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import posixpath
import time

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.biv100.serving.plugins.module_utils import _bench_options
from ansible_collections.biv100.serving.plugins.module_utils._bench_options import MUTUALLY_EXCLUSIVE, REQUIRED_ONE_OF
from ansible_collections.biv100.serving.plugins.module_utils._state_store import TIMESTAMP_FORMAT, utc_timestamp
from ansible_collections.biv100.serving.plugins.plugin_utils import _bench_record as bench_record
from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic
from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import (
    WorkloadError,
    expand,
    load_workload,
    shortened,
    workload_path,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._objective import held, latency_problems, resolved_limits
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import project_root

display = Display()

MODULE = "biv100.serving.engine_bench"
# When the first progress line is shown, at the latest.
FIRST_LINE_SECONDS = 1.0
# Seconds the job may run beyond its requests' timeouts before the action stops it.
SLACK_SECONDS = 120
# A registered task result's own keys, left out of the quality verdict recorded.
TASK_RESULT_KEYS = ("changed", "failed", "skipped", "invocation", "warnings", "deprecations", "exception")
MODULE_OPTIONS = ("url", "api_key_env_file", "served_model_name", "requests", "warmup", "concurrency",
                  "duration_seconds", "timeout", "progress_file", "weights")


def argument_spec() -> dict:
    """The module's options, progress_file taken as text: a host path is expanded on the host,
    never on the controller."""
    spec = _bench_options.argument_spec()
    spec["progress_file"] = dict(type="str")
    return spec


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(
            argument_spec=argument_spec(),
            required_one_of=REQUIRED_ONE_OF,
            mutually_exclusive=MUTUALLY_EXCLUSIVE,
        )
        # The host measured: the one the task is delegated to (another host's engine benched
        # from this host's task list), else the play's.
        host = self._task.delegate_to or task_vars.get("inventory_hostname", "?")
        # How the progress, the messages and the results name the engine measured.
        label = args["label"] or host
        name = label[len(host) + 1:] if label.startswith(f"{host}/") else None
        if label != host and (not name or "/" in name or name.startswith(".")):
            raise AnsibleActionFail(f"label must be {host} or {host}/<instance> (a plain name such as vllm-1), "
                                    f"got {label!r}")
        if args["api_key"]:
            # Without pipelining, Ansible writes each module call, its arguments with it, to the host.
            raise AnsibleActionFail("engine_bench takes no key in its arguments, which Ansible may write to a file "
                                    "on the host: give api_key_env_file (the engine's env file, which holds "
                                    "VLLM_API_KEY) instead of api_key")
        if args["gate"] is None:
            raise AnsibleActionFail("gate is required: the score a release must reach (the gates role passes "
                                    "serving_competition's throughput score)")
        problems = latency_problems(args["latency"])
        if problems:
            raise AnsibleActionFail("; ".join(problems))
        if args["detach"] and args["attach"]:
            raise AnsibleActionFail("detach and attach exclude each other: detach starts a benchmark job and "
                                    "returns it, attach follows the job a detached task returned")
        if args["poll_seconds"] <= 0:
            raise AnsibleActionFail("poll_seconds must be above 0")
        if not 0 < args["workload_factor"] <= 1:
            raise AnsibleActionFail(f"workload_factor must be above 0 and at most 1, got {args['workload_factor']}")
        if not 0 <= args["max_failed_fraction"] <= 1:
            raise AnsibleActionFail("max_failed_fraction must be between 0 and 1")
        release = args["release"]
        if release is not None and (not release or "/" in release or release.startswith(".")):
            # It names a folder of the results: a path in it would write elsewhere.
            raise AnsibleActionFail(f"release must be a plain name such as sub510, got {release!r}")

        module_args = {key: args[key] for key in MODULE_OPTIONS if args.get(key) is not None}
        workload = None
        if args["workload"]:
            given = sorted({"warmup", "duration_seconds"} & set(self._task.args))
            if given:
                raise AnsibleActionFail(f"{', '.join(given)}: a workload says its own; set it in the workload file")
            try:
                workload = shortened(load_workload(workload_path(args["workload"], self._loader.path_dwim),
                                                   args["datasets"]), args["workload_factor"])
                concurrency = args["concurrency"] or workload.concurrency or args["max_num_seqs"]
                if concurrency:
                    module_args["requests"] = expand(workload, args["served_model_name"], concurrency,
                                                     args["datasets"], self._loader.path_dwim)
            except WorkloadError as error:
                raise AnsibleActionFail(str(error)) from None
            module_args.update(warmup=workload.warmup)
            if workload.duration_seconds:
                module_args["duration_seconds"] = workload.duration_seconds
        else:
            concurrency = args["concurrency"] or args["max_num_seqs"]
        if not concurrency or concurrency < 1:
            raise AnsibleActionFail("concurrency: give concurrency or max_num_seqs (the engine's), or set it in "
                                    "the workload")
        module_args["concurrency"] = concurrency

        if args["attach"]:
            job = attached_job(args["attach"], label)
        else:
            job = self._start_job(module_args, task_vars, label)
        if job.get("failed") or args["detach"]:
            answer = job
        else:
            answer = self._follow_job(job, module_args, task_vars, args["poll_seconds"])
        # The module's temporary folder on the host goes now, as ActionBase's own cleanup does it
        # (the polls shared it); the job's folder is removed by the poll that took its result.
        self.cleanup()
        if answer.get("failed"):
            answer["msg"] = f"{answer.get('msg', 'the benchmark failed')}{_mark(answer.get('simulated'))}"
            answer["changed"] = False  # a bench changes nothing, whatever stopped it
            return answer
        if args["detach"]:
            result.update(changed=False, job=job,
                          msg=f"{label}: the benchmark runs as job {posixpath.basename(job['dir'])} in worker "
                              f"{job['pid']}; a task given this job as attach takes its result")
            return result

        verdict = judge(answer, args, workload, label)
        verdict["started"], verdict["finished"] = job["started"], utc_timestamp()
        result.update({key: answer[key] for key in ("concurrency", "warmup", "failures", "progress_error")
                       if key in answer})
        result.update({key: value for key, value in verdict.items() if key not in ("host", "started", "finished")})
        result["record"] = bench_record.kept(verdict)
        result["changed"] = False
        result["results_file"] = None
        if args["release"] and not self._task.check_mode:
            # A relative folder is the project's (where ansible.cfg is), never the collection's.
            folder = project_root(C.CONFIG_FILE) / (args["results_dir"] or os.path.join("build", "bench"))
            path = str(folder / args["release"] / f"{label}.json")
            write_results(path, results_document(verdict, answer, args))
            result["results_file"] = path
        return result

    def _start_job(self, module_args: dict, task_vars: dict, label: str) -> dict:
        """Start the measurement as a worker on the host: the job (what a follow needs to find
        the worker), or the module's answer when it failed."""
        started = utc_timestamp()
        answer = self._execute_module(MODULE, module_args=dict(module_args, _job="start"), task_vars=task_vars)
        if answer.get("failed"):
            return answer
        return {"dir": answer["job_dir"], "pid": answer["pid"], "started": started, "label": label}

    def _follow_job(self, job: dict, module_args: dict, task_vars: dict, poll_seconds: float) -> dict:
        """The module's result, once the job's worker ended; its progress is shown while it runs.
        The time limit counts from the job's start, however long ago a detached call made it."""
        # The options every call requires; the calls that follow the job measure nothing.
        status = {"_job_dir": job["dir"], "served_model_name": module_args["served_model_name"],
                  "weights": module_args["weights"]}
        limit = time_limit(module_args)
        deadline = time.monotonic() + limit - seconds_since(job["started"])
        # The first line after a second at most; a run shorter than that needs none.
        wait = min(poll_seconds, FIRST_LINE_SECONDS)
        answer = None
        try:
            while True:
                answer = self._execute_module(MODULE, module_args=dict(status, _job="status", _job_wait=wait),
                                              task_vars=task_vars)
                if answer.get("finished") or answer.get("failed"):
                    break
                display.display(progress_line(job["label"], answer.get("progress"), module_args))
                if time.monotonic() > deadline:
                    raise AnsibleActionFail(f"{job['label']}: the benchmark job {posixpath.basename(job['dir'])} "
                                            f"did not end within {limit} s")
                wait = poll_seconds
        finally:
            if not (answer and answer.get("finished")):
                self._stop(job, status, task_vars)
        for key in ("finished", "invocation"):
            answer.pop(key, None)
        return answer

    def _stop(self, job: dict, status: dict, task_vars: dict) -> None:
        """End the worker whose following failed, and its folder; a warning if even that fails,
        since the task fails already for the reason it stopped."""
        try:
            stopped = self._execute_module(MODULE, module_args=dict(status, _job="stop"), task_vars=task_vars)
        except Exception as error:  # pylint: disable=broad-exception-caught
            stopped = {"failed": True, "msg": str(error)}
        if stopped.get("failed"):
            display.warning(f"{job['label']}: the benchmark worker {job['pid']} in {job['dir']} could not be stopped: "
                            f"{stopped.get('msg')}")


def attached_job(job: dict, label: str) -> dict:
    """The job a detached task returned, refused when it measures another engine than this
    task's label names (its figures would be recorded as that engine's)."""
    name = posixpath.basename(job["dir"])
    if job["label"] != label:
        raise AnsibleActionFail(f"attach: the benchmark job {name} measures {job['label']}, not {label} (this "
                                f"task's label): attach each job with the label its detached task had")
    try:
        seconds_since(job["started"])
    except ValueError:
        raise AnsibleActionFail(f"attach: the benchmark job {name}: started must be the UTC timestamp its "
                                f"detached task returned (such as 2026-01-31T12:00:00Z), got {job['started']!r}") \
            from None
    return job


def seconds_since(timestamp: str) -> float:
    """Seconds from a UTC timestamp of utc_timestamp() until now; ValueError for other text."""
    return max(time.time() - calendar.timegm(time.strptime(timestamp, TIMESTAMP_FORMAT)), 0.0)


def time_limit(module_args: dict) -> int:
    """Seconds the job may run: every wave of requests may take the timeout."""
    concurrency = module_args["concurrency"]
    timeout = module_args.get("timeout", 600)
    warmup = module_args.get("warmup", 0)
    measured = len(module_args["requests"]) - warmup
    waves = math.ceil(warmup / concurrency)
    if module_args.get("duration_seconds"):
        seconds = module_args["duration_seconds"] + timeout
    else:
        seconds = math.ceil(measured / concurrency) * timeout
    return int(math.ceil(waves * timeout + seconds)) + SLACK_SECONDS


def _mark(simulated) -> str:
    return " [simulated]" if simulated else ""


def progress_line(host: str, progress: dict | None, module_args: dict) -> str:
    """One line of the run so far, e.g. `gpu1: bench 12/24 requests, 3.1 s, output 2310 tok/s,
    input 9800 tok/s [simulated]`."""
    if not progress:
        return f"{host}: bench starting"
    mark = _mark(progress.get("simulated"))
    if progress.get("phase") == "warmup":
        warm = progress.get("warmup") or {}
        return f"{host}: bench warm-up {warm.get('done', 0)}/{warm.get('total', 0)} requests, " \
               f"{progress.get('elapsed_s', 0):.1f} s{mark}"
    requests = progress.get("requests") or {}
    done = requests.get("done", 0)
    if requests.get("total"):
        count = f"{done}/{requests['total']} requests"
        elapsed = f"{progress.get('elapsed_s', 0):.1f} s"
    else:
        count = f"{done} requests"
        elapsed = f"{progress.get('elapsed_s', 0):.1f}/{progress.get('duration_seconds') or 0:.0f} s"
    failed = f" ({requests['failed']} failed)" if requests.get("failed") else ""
    return (f"{host}: bench {count}{failed}, {elapsed}, output {progress.get('output_tps', 0):.0f} tok/s, "
            f"input {progress.get('input_tps', 0):.0f} tok/s{mark}")


def deltas(figures: dict, compare_with: dict) -> dict:
    """For each compared figure, before (the other release's), after, change and percent."""
    earlier, now = headline(compare_with.get("figures") or {}), headline(figures)
    found = {"release": compare_with.get("release")}
    for name, after in now.items():
        before = earlier[name]
        if before is None or after is None:
            found[name] = None
            continue
        found[name] = {"before": before, "after": after, "change": round(after - before, 3),
                       "percent": round((after - before) / before * 100, 2) if before else None}
    return found


def _signed(delta: dict | None, unit: str, digits: int) -> str:
    if not delta:
        return "n/a"
    text = f"{delta['change']:+.{digits}f}{unit}"
    return text + (f" ({delta['percent']:+.1f}%)" if delta["percent"] is not None else "")


def delta_text(found: dict) -> str:
    return (f"against {found['release']}: score {_signed(found['score'], '', 0)}, "
            f"output {_signed(found['output_tps'], ' tok/s', 0)}, input {_signed(found['input_tps'], ' tok/s', 0)}, "
            f"TTFT p99 {_signed(found['ttft_p99_ms'], ' ms', 1)}, TPOT p99 {_signed(found['tpot_p99_ms'], ' ms', 1)}")


def judge(answer: dict, args: dict, workload, host: str) -> dict:
    """The figures with the gate's verdict, the deltas and the message; failed only for failed
    requests beyond the allowed fraction."""
    figures = {key: answer[key] for key in bench_record.MEASURED}
    gate = float(args["gate"])
    incumbent = args["compare_with"] or {}
    latency = held(headline(figures), resolved_limits(args["latency"], headline(incumbent.get("figures") or {}),
                                                      incumbent.get("release")))
    passed = figures["score"] >= gate and latency["passed"]
    # The limits applied, only when the objective has any: the competition's gate is the score alone.
    verdict = dict(figures, gate={"score": gate, "passed": passed,
                                  **({"latency": latency["checks"]} if latency["checks"] else {})},
                   simulated=bool(answer.get("simulated")), host=host, release=args["release"],
                   workload=workload.summary() if workload else None)
    if figures["score"] >= gate:
        msg = (f"score {figures['score']:.0f} >= {gate:.0f} (output {figures['output_tps']:.0f} tok/s, "
               f"input {figures['input_tps']:.0f} tok/s)")
    else:
        msg = (f"score {figures['score']:.0f} < {gate:.0f}: output {figures['output_tps']:.0f} tok/s, "
               f"input {figures['input_tps']:.0f} tok/s")
    if latency["breaches"]:
        msg = "latency over its limit: " + "; ".join(latency["breaches"]) + "; " + msg
    if latency["unapplied"]:
        msg += "; " + "; ".join(latency["unapplied"])
    if args["compare_with"]:
        verdict["deltas"] = deltas(figures, args["compare_with"])
        msg += "; " + delta_text(verdict["deltas"])
    ok, failed = figures["requests"]["ok"], figures["requests"]["failed"]
    allowed = args["max_failed_fraction"]
    if not ok or failed / (ok + failed) > allowed:
        first = next((item["error"] for item in answer.get("failures") or [] if not item.get("warmup")), None)
        msg = (f"{failed} of {ok + failed} measured requests failed (at most {allowed:.0%} may), first: {first}; "
               + msg)
        verdict["failed"] = True
    verdict["msg"] = msg + _mark(verdict["simulated"])
    return verdict


def headline(figures: dict) -> dict:
    """The headline figures (score, throughputs, TTFT and TPOT p99) of a result or a record."""
    return {name: bench_record.figure(figures, path) for name, path in bench_record.HEADLINE}


def results_document(verdict: dict, answer: dict, args: dict) -> dict:
    """The results file: the figures, the verdict, and what they were measured with."""
    document = {key: verdict[key] for key in (*bench_record.KEPT, "host", "release", "started", "finished")}
    document.update(
        deltas=verdict.get("deltas"),
        url=args["url"],
        served_model_name=args["served_model_name"],
        concurrency=answer.get("concurrency"),
        failures=answer.get("failures") or [],
        # The quality gate's verdict when the task is given it; else null, for the quality gate
        # to fill in.
        quality=quality_record(args.get("quality")),
    )
    return document


def quality_record(quality: dict | None) -> dict | None:
    """The quality gate's registered result without the keys of Ansible's task result."""
    if not quality:
        return None
    return {key: value for key, value in quality.items()
            if key not in TASK_RESULT_KEYS and not key.startswith("_ansible")}


def write_results(path: str, document: dict) -> None:
    """Written whole or not at all; without a quality verdict of its own, one already recorded
    for this release and host is kept, since the quality gate may have written it first."""
    try:
        with open(path, encoding="utf-8") as stream:
            earlier = json.load(stream)
        if document["quality"] is None and isinstance(earlier, dict) and earlier.get("quality") is not None:
            document["quality"] = earlier["quality"]
    except (OSError, ValueError):
        pass
    write_atomic(path, json.dumps(document, indent=1, sort_keys=True) + "\n")
