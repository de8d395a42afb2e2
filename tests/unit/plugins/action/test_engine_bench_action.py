"""The controller half of biv100.serving.engine_bench, driven through ActionModule.run().

The action reaches the host only through calls of its module (_job start, then status until the
job ended, stop when the following fails). Those calls are either canned (the start's answer, a
progress per status call, then the result) or the real module, each call run as a process of its
own as on a host, against a small streaming engine in this test.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.parsing.dataloader import DataLoader
from gates_defaults import SCORE_GATE, WEIGHTS

from ansible_collections.biv100.serving.plugins.action import engine_bench as bench_action
from ansible_collections.biv100.serving.plugins.doc_fragments import engine_endpoint
from ansible_collections.biv100.serving.plugins.module_utils._state_store import utc_timestamp
from ansible_collections.biv100.serving.plugins.modules import engine_bench as bench_module
from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import expand, load_workload

HOST = "lab-h1"
MODULE_IMPORT = "ansible_collections.biv100.serving.plugins.modules.engine_bench"
SECRET = "sk-biv100-bench-action-93b1"
WORKLOAD = """
name: tiny
requests: 6
warmup: 1
seed: 3
mix:
  - prompt_tokens: {fixed: 20}
    output_tokens: {fixed: 8}
"""


def figures(output_tps, input_tps, ok=24, failed=0, simulated=True, failures=()):
    """A module result with the given throughputs."""
    latency = {"mean": 10.0, "p50": 9.0, "p90": 12.0, "p99": 15.0}
    return {
        "changed": False, "requests": {"ok": ok, "failed": failed}, "input_tokens": int(input_tps * 3),
        "output_tokens": int(output_tps * 3), "duration_s": 3.0, "request_tps": ok / 3.0,
        "input_tps": float(input_tps), "output_tps": float(output_tps),
        "total_tps": float(input_tps + output_tps), "ttft_ms": dict(latency, p99=200.0),
        "tpot_ms": dict(latency, p99=20.0), "itl_ms": latency, "e2e_ms": latency,
        "samples": {"output_tps": [output_tps / 2] * ok, "ttft_ms": [9.0] * ok, "tpot_ms": [9.0] * ok,
                    "e2e_ms": [9.0] * ok},
        "weights": WEIGHTS, "score": WEIGHTS["output"] * output_tps + WEIGHTS["input"] * input_tps,
        "simulated": simulated, "concurrency": 2, "warmup": {"ok": 2, "failed": 0},
        "failures": list(failures), "progress_error": None, "msg": "module's own summary",
        "invocation": {"module_args": {"_job": "status"}},
    }


class Host:
    """The host as the action's module calls reach it. Canned: the start answers a job, each
    status call the next of `steps` (the run so far), then `final` (the result); or, with
    `module_process`, every call runs the real module. The calls numbered in `fail_calls` (the
    first is 1) fail as over a lost connection."""

    def __init__(self, final=None, steps=(), module_process=None, fail_calls=(), after_status=None):
        self.final, self.steps, self.module_process, self.fail_calls = final, list(steps), module_process, fail_calls
        self.after_status = after_status  # called with the number of status calls answered so far, and the answer
        self.calls = []
        self.started = None
        self.job_files = []  # what the job's folder held before each status call

    def attach(self, action):
        def execute_module(module_name=None, module_args=None, task_vars=None, **kwargs):
            assert module_name == bench_action.MODULE and not kwargs, (module_name, kwargs)
            self.calls.append(dict(module_args))
            if len(self.calls) in self.fail_calls:
                raise AnsibleConnectionFailure("ssh: connection lost")
            answer = self.real(action, module_args) if self.module_process else self.canned(module_args)
            if module_args["_job"] == "start":
                self.started = answer
            return answer

        def low_level_execute_command(*_args, **_kwargs):
            raise AssertionError("the action reaches the host only through its module")

        action._execute_module = execute_module
        action._low_level_execute_command = low_level_execute_command
        action._remove_tmp_path = lambda *_args, **_kwargs: None

    def canned(self, module_args):
        job = module_args["_job"]
        if job == "start":
            return {"changed": False, "job_dir": "/tmp/biv100-engine-bench-c4nn3d", "pid": 4242}
        assert module_args["_job_dir"] == "/tmp/biv100-engine-bench-c4nn3d"
        if job == "stop":
            return {"changed": True, "stopped": True}
        if self.steps:
            return {"changed": False, "finished": False, "progress": self.steps.pop(0)}
        return dict(self.final, finished=True)

    def real(self, action, module_args):
        if module_args["_job"] == "status":
            folder = Path(module_args["_job_dir"])
            self.job_files.append({path.name: path.read_bytes() for path in folder.iterdir()}
                                  if folder.exists() else {})
        args = dict(module_args, _ansible_check_mode=action._task.check_mode)
        _failed, answer = self.module_process(MODULE_IMPORT, args)
        if module_args["_job"] == "status" and self.after_status:
            self.after_status(self.jobs().count("status"), answer)
        return answer

    def jobs(self):
        return [call["_job"] for call in self.calls]


@pytest.fixture
def shown(monkeypatch):
    lines = []
    monkeypatch.setattr(bench_action.display, "display", lambda message, *args, **kwargs: lines.append(message))
    return lines


@pytest.fixture
def playbook_dir(tmp_path, monkeypatch):
    """The project folder, where ansible.cfg is: the results go under it."""
    folder = tmp_path / "playbooks"
    folder.mkdir()
    (folder / "ansible.cfg").write_text("[defaults]\n")
    monkeypatch.setattr(bench_action.C, "CONFIG_FILE", str(folder / "ansible.cfg"))
    return folder


# An option of args_for the task leaves out.
LEFT_OUT = object()


def run_action(args, host, playbook_dir, check_mode=False, delegate_to=None):
    """The action's result for a task of args, with the competition's weights and gate unless args
    has its own (the gates role passes them) or leaves them out."""
    args = {name: value for name, value in {"weights": WEIGHTS, "gate": SCORE_GATE, **args}.items()
            if value is not LEFT_OUT}
    task = SimpleNamespace(args=args, check_mode=check_mode, async_val=0, action=bench_action.MODULE,
                           environment=[], no_log=False, diff=False, delegate_to=delegate_to)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    loader = DataLoader()
    loader.set_basedir(str(playbook_dir))
    action = bench_action.ActionModule(task, connection, None, loader, None)
    host.attach(action)
    try:
        return action.run(task_vars={"inventory_hostname": HOST})
    finally:
        # The task's async settings are the task's own.
        assert task.async_val == 0


def args_for(workload, **options):
    return dict({"workload": str(workload), "served_model_name": "qwen3_5", "max_num_seqs": 2, "poll_seconds": 0.01,
                 "release": "sub510"}, **options)


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "tiny.yml"
    path.write_text(textwrap.dedent(WORKLOAD))
    return path


def measuring(done, total, elapsed, output_tps, input_tps, failed=0, simulated=True):
    return {"phase": "measuring", "warmup": {"done": 2, "failed": 0, "total": 2},
            "requests": {"done": done, "ok": done - failed, "failed": failed, "total": total},
            "elapsed_s": elapsed, "output_tps": output_tps, "input_tps": input_tps, "simulated": simulated}


# ---- a canned job -------------------------------------------------------------------------

def test_a_passed_gate_the_progress_lines_and_the_results_file(tmp_path, workload, playbook_dir, shown):
    steps = [
        {"phase": "warmup", "warmup": {"done": 1, "failed": 0, "total": 2}, "requests": {"done": 0, "total": 24},
         "elapsed_s": 0.8, "simulated": True},
        measuring(12, 24, 3.1, 2310.4, 9800.2),
        measuring(24, 24, 6.0, 5900.0, 20100.0),
    ]
    host = Host(final=figures(5900, 20100), steps=steps)
    result = run_action(args_for(workload, poll_seconds=2), host, playbook_dir)

    assert result["msg"] == "score 8314 >= 8000 (output 5900 tok/s, input 20100 tok/s) [simulated]", result["msg"]
    assert not result.get("failed") and result["changed"] is False
    assert result["gate"] == {"score": 8000.0, "passed": True}
    assert shown == [
        f"{HOST}: bench warm-up 1/2 requests, 0.8 s [simulated]",
        f"{HOST}: bench 12/24 requests, 3.1 s, output 2310 tok/s, input 9800 tok/s [simulated]",
        f"{HOST}: bench 24/24 requests, 6.0 s, output 5900 tok/s, input 20100 tok/s [simulated]",
    ]
    # One start, a status call per line and the one that took the result: nothing to stop. The
    # first call waits on the host a second at most, the others poll_seconds.
    assert host.jobs() == ["start", "status", "status", "status", "status"]
    assert [call["_job_wait"] for call in host.calls[1:]] == [1.0, 2, 2, 2]
    assert all(set(call) == {"_job", "_job_dir", "_job_wait", "served_model_name", "weights"} for call in host.calls[1:])
    path = playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json"
    assert result["results_file"] == str(path)
    document = json.loads(path.read_text())
    assert document["score"] == pytest.approx(8314.0) and document["gate"] == {"score": 8000.0, "passed": True}
    assert document["output_tps"] == 5900.0 and document["input_tps"] == 20100.0
    assert document["requests"] == {"ok": 24, "failed": 0} and document["simulated"] is True
    assert document["ttft_ms"]["p99"] == 200.0 and set(document["tpot_ms"]) >= {"p50", "p90", "p99"}
    assert document["weights"] == {"output": 0.83, "input": 0.17}
    assert document["host"] == HOST and document["release"] == "sub510" and document["quality"] is None
    assert document["workload"]["name"] == "tiny" and document["workload"]["file"] == str(workload)
    assert document["deltas"] is None and "invocation" not in document and "invocation" not in result


def test_the_workload_is_expanded_on_the_controller_and_the_bodies_travel(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    run_action(args_for(workload, url="http://127.0.0.1:8011", api_key_env_file="/etc/engine.env", timeout=30),
               host, playbook_dir)
    module_args = host.calls[0]
    assert module_args["_job"] == "start"
    assert module_args["requests"] == expand(load_workload(workload), "qwen3_5", 2)
    assert module_args["warmup"] == 1 and module_args["concurrency"] == 2 and module_args["timeout"] == 30
    assert module_args["api_key_env_file"] == "/etc/engine.env" and "api_key" not in module_args
    assert module_args["weights"] == WEIGHTS
    # The worker writes its progress in the job's own folder.
    assert "progress_file" not in module_args
    # The options the action reads stay on the controller.
    assert not {"workload", "datasets", "gate", "release", "results_dir", "compare_with", "poll_seconds",
                "max_num_seqs", "max_failed_fraction"} & set(module_args)
    # A wave of warm-up and three of measured requests (2 at a time), each up to the timeout, and the slack.
    assert bench_action.time_limit(module_args) == (1 + 3) * 30 + bench_action.SLACK_SECONDS


def test_a_missed_gate_is_data_not_a_failure(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5400, 12400, simulated=False))
    result = run_action(args_for(workload), host, playbook_dir)
    assert not result.get("failed")
    assert result["gate"] == {"score": 8000.0, "passed": False}
    assert result["msg"] == "score 6590 < 8000: output 5400 tok/s, input 12400 tok/s", result["msg"]
    assert result["simulated"] is False


def test_the_latency_limits_hold_the_gate_as_the_score_does(tmp_path, workload, playbook_dir, shown):
    earlier = json.loads(json.dumps(figures(5800, 20000)))
    earlier["ttft_ms"]["p99"], earlier["tpot_ms"]["p99"] = 250.0, 10.0
    limits = {"ttft_p99_ms": 300, "tpot_p99_ms": "1.5x"}
    # TTFT p99 200 ms within 300; TPOT p99 20 ms above 1.5 x sub168's 10 ms.
    result = run_action(args_for(workload, latency=limits, compare_with={"release": "sub168", "figures": earlier}),
                        Host(final=figures(5900, 20100)), playbook_dir)
    assert not result.get("failed") and result["gate"]["passed"] is False and result["score"] >= 8000
    assert [(check["figure"], check["limit_ms"], check["passed"]) for check in result["gate"]["latency"]] == [
        ("ttft_p99_ms", 300.0, True), ("tpot_p99_ms", 15.0, False)]
    assert result["msg"].startswith("latency over its limit: TPOT p99 20.0 ms > 15.0 ms (1.5x sub168's 10.0 ms); "
                                    "score 8314 >= 8000")
    # Without a last good release a factor has nothing to scale: only the absolute limit holds.
    alone = run_action(args_for(workload, latency=limits), Host(final=figures(5900, 20100)), playbook_dir)
    assert alone["gate"]["passed"] is True
    assert "TPOT p99 limit 1.5x not applied: 1.5x the incumbent's, which recorded none" in alone["msg"]


def test_a_latency_limit_that_is_not_one_is_refused_before_measuring(tmp_path, workload, playbook_dir):
    refused(args_for(workload, latency={"tpot_p99_ms": "quick"}), tmp_path, playbook_dir,
            "serving_gates.throughput.latency.tpot_p99_ms must be milliseconds")


def test_the_deltas_against_the_last_good_release(tmp_path, workload, playbook_dir, shown):
    earlier = json.loads(json.dumps(figures(5800, 20000)))
    earlier["ttft_ms"]["p99"], earlier["tpot_ms"]["p99"] = 250.0, 19.5
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, compare_with={"release": "sub168", "figures": earlier}), host,
                        playbook_dir)
    deltas = result["deltas"]
    assert deltas["release"] == "sub168"
    assert deltas["score"]["change"] == pytest.approx(0.83 * 100 + 0.17 * 100)
    assert deltas["output_tps"] == {"before": 5800.0, "after": 5900.0, "change": 100.0, "percent": 1.72}
    assert deltas["ttft_p99_ms"] == {"before": 250.0, "after": 200.0, "change": -50.0, "percent": -20.0}
    assert deltas["tpot_p99_ms"]["change"] == 0.5
    assert result["msg"] == (
        "score 8314 >= 8000 (output 5900 tok/s, input 20100 tok/s); against sub168: score +100 (+1.2%), "
        "output +100 tok/s (+1.7%), input +100 tok/s (+0.5%), TTFT p99 -50.0 ms (-20.0%), "
        "TPOT p99 +0.5 ms (+2.6%) [simulated]"), result["msg"]
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    assert document["deltas"] == deltas


def test_a_figure_missing_from_the_earlier_release_has_no_delta(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, compare_with={"release": "old", "figures": {"score": 8000}}), host,
                        playbook_dir)
    assert result["deltas"]["output_tps"] is None and result["deltas"]["score"]["change"] == pytest.approx(314.0)
    assert "output n/a" in result["msg"]


@pytest.mark.parametrize("ok, failed, fails", [(23, 1, False), (22, 2, True), (0, 0, True)])
def test_failed_requests_fail_the_task_beyond_the_allowed_fraction(tmp_path, workload, playbook_dir, shown,
                                                                   ok, failed, fails):
    failures = [{"index": 3, "warmup": True, "error": "HTTP 400: warm"}] + [
        {"index": 5 + n, "warmup": False, "error": "HTTP 500: CUDA out of memory"} for n in range(failed)]
    host = Host(final=figures(9000, 9000, ok=ok, failed=failed, failures=failures))
    result = run_action(args_for(workload), host, playbook_dir)
    assert bool(result.get("failed")) is fails, result["msg"]
    if fails and failed:
        assert result["msg"].startswith(f"{failed} of {ok + failed} measured requests failed (at most 5% may), "
                                        "first: HTTP 500: CUDA out of memory; score "), result["msg"]
    assert result["msg"].endswith("[simulated]")
    # The figures are recorded either way.
    assert (playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").exists()


def test_a_failed_module_fails_the_task_with_its_message(tmp_path, workload, playbook_dir, shown):
    host = Host(final={"failed": True, "msg": "the benchmark worker (pid 4242) ended without a result"})
    result = run_action(args_for(workload), host, playbook_dir)
    assert result["failed"] and result["msg"] == "the benchmark worker (pid 4242) ended without a result"
    assert result["changed"] is False and "finished" not in result
    assert host.jobs() == ["start", "status"]  # the job had ended: nothing to stop
    assert not (playbook_dir / "build").exists()


def test_a_worker_that_cannot_start_fails_the_task_and_nothing_is_followed(tmp_path, workload, playbook_dir, shown):
    host = Host()
    host.canned = lambda module_args: {"failed": True, "msg": "the benchmark worker did not start"}
    result = run_action(args_for(workload), host, playbook_dir)
    assert result["failed"] and result["msg"] == "the benchmark worker did not start"
    assert host.jobs() == ["start"] and not (playbook_dir / "build").exists()


def test_a_job_beyond_its_time_limit_is_stopped_and_fails_the_task(tmp_path, workload, playbook_dir, shown,
                                                                   monkeypatch):
    monkeypatch.setattr(bench_action, "time_limit", lambda module_args: 0)
    host = Host(final=figures(5900, 20100), steps=[measuring(1, 6, 0.5, 100, 200)] * 3)
    with pytest.raises(AnsibleActionFail, match=re.escape(
            f"{HOST}: the benchmark job biv100-engine-bench-c4nn3d did not end within 0 s")):
        run_action(args_for(workload), host, playbook_dir)
    assert host.jobs() == ["start", "status", "stop"]
    assert not (playbook_dir / "build").exists()


def test_check_mode_measures_but_writes_no_results_file(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload), host, playbook_dir, check_mode=True)
    assert result["results_file"] is None and result["gate"]["passed"]
    assert not (playbook_dir / "build").exists()


def test_a_quality_verdict_already_recorded_is_kept(tmp_path, workload, playbook_dir, shown):
    path = tmp_path / "results" / "sub510" / f"{HOST}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"score": 1, "quality": {"passed": True, "accuracy": 0.91}}))
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, results_dir=str(tmp_path / "results")), host, playbook_dir)
    assert result["results_file"] == str(path)
    document = json.loads(path.read_text())
    assert document["quality"] == {"passed": True, "accuracy": 0.91} and document["score"] == pytest.approx(8314)
    assert sorted(item.name for item in path.parent.iterdir()) == [f"{HOST}.json"]


def test_a_quality_verdict_given_is_recorded_without_the_task_results_keys(tmp_path, workload, playbook_dir,
                                                                           shown):
    verdict = {"changed": False, "invocation": {}, "score": 0.92, "passed": True, "simulated": True}
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, quality=verdict), host, playbook_dir)
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    assert document["quality"] == {"score": 0.92, "passed": True, "simulated": True}
    assert "quality" not in result


def test_a_relative_results_dir_is_under_the_project_folder(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, results_dir="out"), host, playbook_dir)
    assert result["results_file"] == str(playbook_dir / "out" / "sub510" / f"{HOST}.json")


def test_an_instance_of_a_host_of_several_is_named_by_its_label(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, label=f"{HOST}/vllm-2"), host, playbook_dir)
    assert result["results_file"] == str(playbook_dir / "build" / "bench" / "sub510" / HOST / "vllm-2.json")
    assert all(line.startswith(f"{HOST}/vllm-2: ") for line in shown)


@pytest.mark.parametrize("label", ["lab-h2/vllm-1", f"{HOST}/", f"{HOST}/a/b", f"{HOST}/.hidden"])
def test_a_label_of_another_host_or_not_a_plain_instance_is_refused(workload, playbook_dir, label):
    with pytest.raises(AnsibleActionFail, match="label must be lab-h1 or lab-h1/<instance>"):
        run_action(args_for(workload, label=label), Host(final=figures(5900, 20100)), playbook_dir)


def test_without_release_no_file_is_written(tmp_path, workload, playbook_dir, shown):
    args = args_for(workload)
    del args["release"]
    result = run_action(args, Host(final=figures(5900, 20100)), playbook_dir)
    assert result["results_file"] is None and not (playbook_dir / "build").exists()


def test_requests_of_your_own_are_sent_as_they_are(tmp_path, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    bodies = [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}] * 3
    result = run_action({"requests": bodies, "served_model_name": "m", "concurrency": 3, "warmup": 1,
                         "duration_seconds": 5, "poll_seconds": 0.01, "release": "r1"}, host, playbook_dir)
    module_args = host.calls[0]
    assert module_args["requests"] == bodies and module_args["warmup"] == 1
    assert module_args["duration_seconds"] == 5 and module_args["concurrency"] == 3
    assert result["workload"] is None and result["gate"]["passed"]


# ---- detach and attach: two hosts measured at the same time -------------------------------

CANNED_JOB_DIR = "/tmp/biv100-engine-bench-c4nn3d"


def test_detach_starts_the_job_and_returns_it_without_following_it(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100), steps=[measuring(1, 6, 0.5, 100, 200)])
    before = utc_timestamp()
    result = run_action(args_for(workload, detach=True), host, playbook_dir)
    assert host.jobs() == ["start"] and shown == []
    assert result == {
        "changed": False,
        "job": {"dir": CANNED_JOB_DIR, "pid": 4242, "started": result["job"]["started"], "label": HOST},
        "msg": f"{HOST}: the benchmark runs as job biv100-engine-bench-c4nn3d in worker 4242; a task given this "
               "job as attach takes its result",
    }, result
    assert before <= result["job"]["started"] <= utc_timestamp()
    assert not (playbook_dir / "build").exists()


def test_detach_in_check_mode_starts_the_job_as_a_bench_in_check_mode_does(tmp_path, workload, playbook_dir,
                                                                           shown):
    host = Host(final=figures(5900, 20100))
    result = run_action(args_for(workload, detach=True), host, playbook_dir, check_mode=True)
    assert host.jobs() == ["start"] and result["job"]["pid"] == 4242 and not result.get("failed")


def test_a_detached_start_that_fails_fails_the_task(tmp_path, workload, playbook_dir, shown):
    host = Host()
    host.canned = lambda module_args: {"failed": True, "msg": "the benchmark worker did not start"}
    result = run_action(args_for(workload, detach=True), host, playbook_dir)
    assert result["failed"] and result["msg"] == "the benchmark worker did not start" and "job" not in result
    assert host.jobs() == ["start"]


def detached_job(label=HOST, started=None):
    return {"dir": CANNED_JOB_DIR, "pid": 4242, "started": started or utc_timestamp(), "label": label}


def test_attach_follows_the_job_given_and_starts_none(tmp_path, workload, playbook_dir, shown):
    job = detached_job()
    host = Host(final=figures(5900, 20100), steps=[measuring(12, 24, 3.1, 2310.4, 9800.2)])
    result = run_action(args_for(workload, attach=job, poll_seconds=2), host, playbook_dir)
    assert host.jobs() == ["status", "status"] and [call["_job_wait"] for call in host.calls] == [1.0, 2]
    assert all(call["_job_dir"] == CANNED_JOB_DIR for call in host.calls)
    assert shown == [f"{HOST}: bench 12/24 requests, 3.1 s, output 2310 tok/s, input 9800 tok/s [simulated]"]
    assert result["msg"] == "score 8314 >= 8000 (output 5900 tok/s, input 20100 tok/s) [simulated]", result["msg"]
    assert "job" not in result
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    # The measurement started when the detached task started it.
    assert document["started"] == job["started"] <= document["finished"]
    assert document["score"] == pytest.approx(8314.0) and document["samples"]["ttft_ms"] == [9.0] * 24


def test_the_time_limit_of_an_attached_job_counts_from_its_start(tmp_path, workload, playbook_dir, shown,
                                                                 monkeypatch):
    monkeypatch.setattr(bench_action, "time_limit", lambda module_args: 600)
    an_hour_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    host = Host(final=figures(5900, 20100), steps=[measuring(1, 6, 0.5, 100, 200)] * 3)
    with pytest.raises(AnsibleActionFail, match=re.escape(
            f"{HOST}: the benchmark job biv100-engine-bench-c4nn3d did not end within 600 s")):
        run_action(args_for(workload, attach=detached_job(started=an_hour_ago)), host, playbook_dir)
    assert host.jobs() == ["status", "stop"]


def test_an_attached_job_whose_following_fails_is_stopped(tmp_path, workload, playbook_dir, shown, monkeypatch):
    warned = []
    monkeypatch.setattr(bench_action.display, "warning", lambda message, *args, **kwargs: warned.append(message))
    host = Host(final=figures(5900, 20100), steps=[measuring(1, 6, 0.5, 100, 200)] * 3, fail_calls=(2,))
    with pytest.raises(AnsibleConnectionFailure, match="connection lost"):
        run_action(args_for(workload, attach=detached_job()), host, playbook_dir)
    assert host.jobs() == ["status", "status", "stop"] and host.calls[-1]["_job_dir"] == CANNED_JOB_DIR
    assert warned == [] and not (playbook_dir / "build").exists()


def test_a_job_of_another_label_is_refused_naming_both(tmp_path, workload, playbook_dir):
    job = detached_job(label=f"{HOST}/vllm-2")
    refused(args_for(workload, attach=job, label=f"{HOST}/vllm-1"), tmp_path, playbook_dir, re.escape(
        f"attach: the benchmark job biv100-engine-bench-c4nn3d measures {HOST}/vllm-2, not {HOST}/vllm-1 "
        "(this task's label)"))
    refused(args_for(workload, attach=job), tmp_path, playbook_dir, re.escape(f"measures {HOST}/vllm-2, not {HOST} "))


def test_a_job_whose_start_is_not_a_utc_timestamp_is_refused(tmp_path, workload, playbook_dir):
    refused(args_for(workload, attach=detached_job(started="yesterday")), tmp_path, playbook_dir, re.escape(
        "attach: the benchmark job biv100-engine-bench-c4nn3d: started must be the UTC timestamp its detached "
        "task returned (such as 2026-01-31T12:00:00Z), got 'yesterday'"))


@pytest.mark.parametrize("detach", [True, False])
def test_detach_and_attach_together_are_refused(tmp_path, workload, playbook_dir, detach):
    args = args_for(workload, detach=detach, attach=detached_job())
    if detach:
        refused(args, tmp_path, playbook_dir, "detach and attach exclude each other")
    else:
        # detach false is no detach: the job is followed.
        host = Host(final=figures(5900, 20100))
        run_action(args, host, playbook_dir)
        assert host.jobs() == ["status"]


def test_a_job_that_is_not_a_detached_tasks_is_refused(tmp_path, workload, playbook_dir):
    refused(args_for(workload, attach={"dir": CANNED_JOB_DIR, "pid": 4242}), tmp_path, playbook_dir,
            "missing required arguments: label, started found in attach")


def test_a_delegated_task_measures_and_names_the_host_it_is_delegated_to(tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(5900, 20100))
    started = run_action(args_for(workload, detach=True), host, playbook_dir, delegate_to="lab-h2")
    assert started["job"]["label"] == "lab-h2" and started["msg"].startswith("lab-h2: ")
    result = run_action(args_for(workload, attach=started["job"]), host, playbook_dir, delegate_to="lab-h2")
    assert host.jobs() == ["start", "status"]
    assert result["results_file"] == str(playbook_dir / "build" / "bench" / "sub510" / "lab-h2.json")
    # The play's host is not the one measured.
    with pytest.raises(AnsibleActionFail, match=re.escape("label must be lab-h2 or lab-h2/<instance> (a plain name "
                                                          f"such as vllm-1), got '{HOST}'")):
        run_action(args_for(workload, label=HOST), Host(final=figures(1, 1)), playbook_dir, delegate_to="lab-h2")


# ---- refusals before anything is sent ------------------------------------------------------

def refused(args, tmp_path, playbook_dir, match):
    host = Host(final=figures(1, 1))
    with pytest.raises(AnsibleActionFail, match=match):
        run_action(args, host, playbook_dir)
    assert host.calls == []


def test_a_bad_workload_is_refused_naming_the_file_and_key(tmp_path, playbook_dir):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: bad\nrequests: 3\nmix: [{prompt_tokens: {uniform: [5, 1]}, output_tokens: {fixed: 1}}]\n")
    refused(args_for(bad), tmp_path, playbook_dir, re.escape(f"{bad}: mix[0].prompt_tokens.uniform: must be [lo, hi]"))


def test_no_concurrency_is_refused(tmp_path, workload, playbook_dir):
    args = args_for(workload)
    del args["max_num_seqs"]
    refused(args, tmp_path, playbook_dir, "concurrency: give concurrency or max_num_seqs")


@pytest.mark.parametrize("option, message", [("gate", "gate is required"),
                                             ("weights", "missing required arguments: weights")])
def test_the_gate_and_the_weights_have_no_default_of_their_own(tmp_path, workload, playbook_dir, option, message):
    # The competition's are the gates role's to pass (serving_competition, the serving role's).
    refused(args_for(workload, **{option: LEFT_OUT}), tmp_path, playbook_dir, message)


def test_the_key_itself_is_refused_so_that_it_is_never_written_to_the_host(tmp_path, workload, playbook_dir):
    refused(args_for(workload, api_key="sk-secret"), tmp_path, playbook_dir, "give api_key_env_file")


def test_warmup_beside_a_workload_is_refused(tmp_path, workload, playbook_dir):
    refused(args_for(workload, warmup=3), tmp_path, playbook_dir, "warmup: a workload says its own")


def test_workload_and_requests_together_are_refused(tmp_path, workload, playbook_dir):
    refused(args_for(workload, requests=[{}]), tmp_path, playbook_dir, "mutually exclusive: workload|requests")


def test_a_named_workload_is_one_of_files_bench(tmp_path, playbook_dir):
    refused(args_for("nosuch"), tmp_path, playbook_dir, r"'nosuch' is not one of files/bench")


def test_the_concurrency_comes_from_the_task_then_the_workload_then_max_num_seqs(
        tmp_path, workload, playbook_dir, shown):
    host = Host(final=figures(1, 1))
    run_action(args_for(workload, concurrency=5), host, playbook_dir)
    assert host.calls[0]["concurrency"] == 5
    workload.write_text(textwrap.dedent(WORKLOAD) + "concurrency: 4\n")
    host = Host(final=figures(1, 1))
    run_action(args_for(workload), host, playbook_dir)
    assert host.calls[0]["concurrency"] == 4


# ---- the real module, each call a process of its own -------------------------------------------

class Engine(BaseHTTPRequestHandler):
    """Streams `max_tokens` content chunks `server.delay` apart, with the stand-in's header and
    usage; records each body and its bearer token. The request numbered `server.held` (the first
    is 1) is not answered before `server.release` is set: a test that must see the bench running
    holds it there, whatever the machine's speed."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append((body, self.headers.get("Authorization")))
        if len(self.server.received) == self.server.held:
            self.server.release.wait(60)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("x-biv100-simulated", "1")
        self.end_headers()
        try:
            for number in range(body["max_tokens"]):
                time.sleep(self.server.delay)
                self.event({"choices": [{"index": 0, "delta": {"content": f" t{number}"}}]})
            self.event({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": body["max_tokens"]}})
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # a client stopped while it was answered (a stopped worker)

    def event(self, document):
        self.wfile.write(b"data: " + json.dumps(document).encode() + b"\n\n")

    def log_message(self, format, *args):
        pass


@pytest.fixture
def engine(loopback_server):
    """engine(delay, held=None) -> (url, server): 8 chunks `delay` apart make one request of the
    workload; server.received has the requests, server.release frees the one held."""

    def start(delay, held=None):
        url, server = loopback_server(Engine)
        server.received, server.delay, server.held, server.release = [], delay, held, threading.Event()
        return url, server

    return start


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "engine.env"
    path.write_text(f"PYTHONPATH=/x\nVLLM_API_KEY={SECRET}\n")
    return path


def worker_gone(pid, seconds=30.0):
    deadline = time.monotonic() + seconds
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stream:
            if stream.read().rpartition(")")[2].split()[0] == "Z":
                return True  # ended, waiting for init to reap it
        time.sleep(0.02)
    return not os.path.exists(f"/proc/{pid}")


def test_the_real_module_end_to_end(tmp_path, workload, playbook_dir, shown, engine, env_file, module_process):
    # A warm-up wave and three measured ones; the last request waits for a second status call
    # that found the worker measuring, so that the run is followed while it measures however
    # slowly the module's processes start.
    url, server = engine(delay=0.02, held=7)
    received = server.received
    host = Host(module_process=module_process, after_status=lambda answered, answer: answered >= 2 and (
        answer.get("progress") or {}).get("phase") == "measuring" and server.release.set())
    result = run_action(args_for(workload, url=url, poll_seconds=0.5, api_key_env_file=str(env_file)), host,
                        playbook_dir)

    assert not result.get("failed"), result
    assert result["requests"] == {"ok": 6, "failed": 0} and result["warmup"] == {"ok": 1, "failed": 0}
    assert result["input_tokens"] == 6 * 30 and result["output_tokens"] == 6 * 8
    assert result["simulated"] is True and result["gate"]["passed"] is False and result["changed"] is False
    assert re.fullmatch(r"score \d+ < 8000: output \d+ tok/s, input \d+ tok/s \[simulated\]", result["msg"])
    # The engine got the workload's bodies, warm-up first, with the key from the env file.
    assert received[0][0] == expand(load_workload(workload), "qwen3_5", 2)[0]
    assert {token for _body, token in received} == {f"Bearer {SECRET}"}
    # The start returned while the worker measured: status calls followed it, one line each.
    assert host.jobs()[0] == "start" and host.jobs()[-1] == "status" and "stop" not in host.jobs()
    assert len(shown) == host.jobs().count("status") - 1 >= 1, shown
    progress = [line for line in shown if re.fullmatch(
        rf"{HOST}: bench [0-6]/6 requests, [\d.]+ s, output \d+ tok/s, input \d+ tok/s \[simulated\]", line)]
    assert progress, shown
    # The job's folder held the worker's lock, record and progress, never the key nor a request;
    # it is gone, and so is the worker.
    written = {name for files in host.job_files for name in files}
    assert {"running", "worker.json", "progress.json"} <= written <= {"running", "worker.json", "progress.json",
                                                                      "result.json"}, written
    prompt = received[1][0]["messages"][-1]["content"][:40].encode()
    assert not [name for files in host.job_files for name, data in files.items()
                if SECRET.encode() in data or prompt in data]
    assert not os.path.exists(host.started["job_dir"]) and worker_gone(host.started["pid"])
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    assert document["output_tokens"] == 48 and document["simulated"] is True and document["quality"] is None
    assert SECRET not in json.dumps(result) and SECRET not in json.dumps(document)


def test_a_follow_that_fails_stops_the_worker_and_removes_its_job(tmp_path, workload, playbook_dir, shown, engine,
                                                                  module_process):
    # The warm-up request is never answered: the bench is still on it when the connection fails.
    url, server = engine(delay=0.02, held=1)
    # The start, one status call, then the connection is lost.
    host = Host(module_process=module_process, fail_calls=(3,))
    with pytest.raises(AnsibleConnectionFailure, match="connection lost"):
        run_action(args_for(workload, url=url, poll_seconds=0.2), host, playbook_dir)
    assert host.jobs() == ["start", "status", "status", "stop"]
    assert worker_gone(host.started["pid"]) and not os.path.exists(host.started["job_dir"])
    server.release.set()
    assert len(server.received) == 1 and not (playbook_dir / "build").exists()


def test_a_detached_job_of_the_real_module_runs_between_tasks_and_attach_takes_it(
        tmp_path, workload, playbook_dir, shown, engine, module_process):
    url, server = engine(delay=0.05)
    received = server.received
    starting = Host(module_process=module_process)
    detached = run_action(args_for(workload, url=url, detach=True), starting, playbook_dir)
    job = detached["job"]
    assert starting.jobs() == ["start"] and shown == [] and os.path.isdir(job["dir"])
    # The worker measures with no task following it (its process slow to start on a loaded
    # machine: the deadline only bounds a failure).
    deadline = time.monotonic() + 60
    while len(received) < 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(received) == 7  # the warm-up request and the six measured
    following = Host(module_process=module_process)
    result = run_action(args_for(workload, url=url, attach=job), following, playbook_dir)
    assert not result.get("failed"), result
    assert "start" not in following.jobs() and "stop" not in following.jobs()
    assert result["requests"] == {"ok": 6, "failed": 0} and result["output_tokens"] == 6 * 8
    assert len(received) == 7  # nothing sent twice
    assert not os.path.exists(job["dir"]) and worker_gone(job["pid"])
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    assert document["started"] == job["started"] and len(document["samples"]["e2e_ms"]) == 6


def test_a_worker_that_cannot_be_stopped_is_named_in_a_warning(tmp_path, workload, playbook_dir, shown,
                                                               monkeypatch):
    warned = []
    monkeypatch.setattr(bench_action.display, "warning", lambda message, *args, **kwargs: warned.append(message))
    # The second status call fails, and so does the stop after it: the task fails for the first reason.
    host = Host(final=figures(1, 1), steps=[measuring(1, 6, 0.5, 100, 200)] * 3, fail_calls=(3, 4))
    with pytest.raises(AnsibleConnectionFailure):
        run_action(args_for(workload), host, playbook_dir)
    assert host.jobs() == ["start", "status", "status", "stop"]
    assert warned == [f"{HOST}: the benchmark worker 4242 in /tmp/biv100-engine-bench-c4nn3d could not be stopped: "
                      "ssh: connection lost"], warned


def test_a_release_that_is_a_path_is_refused(tmp_path, workload, playbook_dir):
    refused(args_for(workload, release="../../etc"), tmp_path, playbook_dir, "release must be a plain name")


def test_the_action_accepts_exactly_the_options_the_module_documents():
    documented = yaml.safe_load(bench_module.DOCUMENTATION)["options"]
    documented.update(yaml.safe_load(engine_endpoint.ModuleDocFragment.DOCUMENTATION)["options"])

    def shape(options):
        return {name: (option.get("type", "str"), option.get("default"), bool(option.get("required")),
                       shape(option.get("suboptions") or option.get("options") or {}))
                for name, option in options.items()}

    accepted = shape(bench_action.argument_spec())
    # A host path is expanded on the host, never on the controller.
    assert accepted.pop("progress_file")[0] == "str" and shape(documented).pop("progress_file")[0] == "path"
    expected = shape(documented)
    expected.pop("progress_file")
    assert accepted == expected
