"""The controller half of biv100.serving.engine_bench, driven through ActionModule.run().

The host is a folder: the async job's file and the progress file live there, the action's one
cheap command per poll really runs (with /bin/sh) against them, and async_status is answered
from the job file as ansible.legacy.async_status answers. The module's job is either canned (a
progress file per poll, then a result) or the real module run in-process in a thread against a
small streaming engine in this test.
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from gates_defaults import SCORE_GATE, WEIGHTS

from ansible_collections.biv100.serving.plugins.action import engine_bench as bench_action
from ansible_collections.biv100.serving.plugins.doc_fragments import engine_endpoint
from ansible_collections.biv100.serving.plugins.modules import engine_bench as bench_module
from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import expand, load_workload

HOST = "lab-h1"
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
        "weights": WEIGHTS, "score": WEIGHTS["output"] * output_tps + WEIGHTS["input"] * input_tps,
        "simulated": simulated, "concurrency": 2, "warmup": {"ok": 2, "failed": 0},
        "failures": list(failures), "progress_error": None, "msg": "module's own summary",
        "invocation": {"module_args": {"requests": "26 request bodies"}},
    }


class Host:
    """A host as a folder. `steps` are the progress files of successive polls, after which the
    job ends with `final`; or `live(module_args)` runs the module's work in a thread."""

    def __init__(self, root, final=None, steps=(), live=None):
        self.root = root
        self.job_file = root / "async" / "j42"
        self.job_file.parent.mkdir(parents=True)
        self.final, self.steps, self.live = final, list(steps), live
        self.calls = []
        self.commands = []
        self.async_val = None
        self.progress_file = None
        self.thread = None

    def attach(self, action):
        def make_tmp_path(*_args, **_kwargs):
            (self.root / "tmp").mkdir(exist_ok=True)
            action._connection._shell.tmpdir = str(self.root / "tmp")
            return action._connection._shell.tmpdir

        def execute_module(module_name=None, module_args=None, task_vars=None, wrap_async=False, **_):
            self.calls.append((module_name, dict(module_args), wrap_async))
            if module_name == bench_action.MODULE:
                assert wrap_async, "the module runs as an async job"
                self.async_val = action._task.async_val
                self.progress_file = module_args["progress_file"]
                self.write_job({"started": True, "finished": False, "ansible_job_id": "j42"})
                if self.live:
                    self.thread = threading.Thread(target=lambda: self.write_job(self.live(module_args)))
                    self.thread.start()
                action._connection._shell.tmpdir = None  # as _execute_module leaves it after wrap_async
                return {"started": True, "finished": False, "ansible_job_id": "j42",
                        "results_file": str(self.job_file), "changed": True}
            assert module_name == bench_action.ASYNC_STATUS
            assert module_args["jid"] == "j42" and module_args["_async_dir"] == str(self.job_file.parent)
            if module_args["mode"] == "cleanup":
                self.job_file.unlink()
                return {"ansible_job_id": "j42", "erased": str(self.job_file)}
            data = json.loads(self.job_file.read_text())
            if "started" not in data:
                data.update(finished=True, ansible_job_id="j42")
            return data

        def low_level_execute_command(cmd, sudoable=True, **_):
            if not self.live:
                self.advance()
            self.commands.append(cmd)
            ran = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=False)
            return {"rc": ran.returncode, "stdout": ran.stdout, "stderr": ran.stderr}

        action._make_tmp_path = make_tmp_path
        action._execute_module = execute_module
        action._low_level_execute_command = low_level_execute_command
        action._remove_tmp_path = lambda *_args, **_kwargs: None

    def write_job(self, data):
        staged = self.job_file.with_suffix(".tmp")
        staged.write_text(json.dumps(data))
        staged.replace(self.job_file)

    def advance(self):
        """The next poll's state: the next progress file, or the ended job."""
        if self.steps:
            with open(self.progress_file, "w") as stream:
                json.dump(self.steps.pop(0), stream)
        else:
            self.write_job(self.final)


@pytest.fixture
def shown(monkeypatch):
    lines = []
    monkeypatch.setattr(bench_action.display, "display", lambda message, *args, **kwargs: lines.append(message))
    return lines


@pytest.fixture
def playbook_dir(tmp_path):
    folder = tmp_path / "playbooks"
    folder.mkdir()
    return folder


# An option of args_for the task leaves out.
LEFT_OUT = object()


def run_action(args, host, playbook_dir, check_mode=False):
    """The action's result for a task of args, with the competition's weights and gate unless args
    has its own (the gates role passes them) or leaves them out."""
    args = {name: value for name, value in {"weights": WEIGHTS, "gate": SCORE_GATE, **args}.items()
            if value is not LEFT_OUT}
    task = SimpleNamespace(args=args, check_mode=check_mode, async_val=0, action=bench_action.MODULE,
                           environment=[], no_log=False, diff=False)
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None, join_path=posixpath.join))
    loader = DataLoader()
    loader.set_basedir(str(playbook_dir))
    action = bench_action.ActionModule(task, connection, None, loader, None)
    host.attach(action)
    result = action.run(task_vars={"inventory_hostname": HOST})
    if host.thread:
        host.thread.join()
    return result


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
    host = Host(tmp_path / "host", final=figures(5900, 20100), steps=steps)
    result = run_action(args_for(workload), host, playbook_dir)

    assert result["msg"] == "score 8314 >= 8000 (output 5900 tok/s, input 20100 tok/s) [simulated]", result["msg"]
    assert not result.get("failed") and result["changed"] is False
    assert result["gate"] == {"score": 8000.0, "passed": True}
    assert shown == [
        f"{HOST}: bench warm-up 1/2 requests, 0.8 s [simulated]",
        f"{HOST}: bench 12/24 requests, 3.1 s, output 2310 tok/s, input 9800 tok/s [simulated]",
        f"{HOST}: bench 24/24 requests, 6.0 s, output 5900 tok/s, input 20100 tok/s [simulated]",
    ]
    # The task's async was set for the job's start only, and the job file is removed at the end.
    assert host.async_val > 0 and not host.job_file.exists()
    called = [name for name, _args, _wrapped in host.calls]
    assert called == [bench_action.MODULE, bench_action.ASYNC_STATUS, bench_action.ASYNC_STATUS]
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
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    run_action(args_for(workload, url="http://127.0.0.1:8011", api_key_env_file="/etc/engine.env", timeout=30),
               host, playbook_dir)
    _name, module_args, _wrapped = host.calls[0]
    assert module_args["requests"] == expand(load_workload(workload), "qwen3_5", 2)
    assert module_args["warmup"] == 1 and module_args["concurrency"] == 2 and module_args["timeout"] == 30
    assert module_args["api_key_env_file"] == "/etc/engine.env" and "api_key" not in module_args
    assert module_args["progress_file"] == str(tmp_path / "host" / "tmp" / bench_action.PROGRESS_NAME)
    assert module_args["weights"] == WEIGHTS
    # The options the action reads stay on the controller.
    assert not {"workload", "datasets", "gate", "release", "results_dir", "compare_with", "poll_seconds",
                "max_num_seqs", "max_failed_fraction"} & set(module_args)
    # A wave of warm-up and three of measured requests (2 at a time), each up to the timeout, and the slack.
    assert host.async_val == (1 + 3) * 30 + bench_action.ASYNC_SLACK


def test_a_missed_gate_is_data_not_a_failure(tmp_path, workload, playbook_dir, shown):
    host = Host(tmp_path / "host", final=figures(5400, 12400, simulated=False))
    result = run_action(args_for(workload), host, playbook_dir)
    assert not result.get("failed")
    assert result["gate"] == {"score": 8000.0, "passed": False}
    assert result["msg"] == "score 6590 < 8000: output 5400 tok/s, input 12400 tok/s", result["msg"]
    assert result["simulated"] is False


def test_the_deltas_against_the_last_good_release(tmp_path, workload, playbook_dir, shown):
    earlier = json.loads(json.dumps(figures(5800, 20000)))
    earlier["ttft_ms"]["p99"], earlier["tpot_ms"]["p99"] = 250.0, 19.5
    host = Host(tmp_path / "host", final=figures(5900, 20100))
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
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    result = run_action(args_for(workload, compare_with={"release": "old", "figures": {"score": 8000}}), host,
                        playbook_dir)
    assert result["deltas"]["output_tps"] is None and result["deltas"]["score"]["change"] == pytest.approx(314.0)
    assert "output n/a" in result["msg"]


@pytest.mark.parametrize("ok, failed, fails", [(23, 1, False), (22, 2, True), (0, 0, True)])
def test_failed_requests_fail_the_task_beyond_the_allowed_fraction(tmp_path, workload, playbook_dir, shown,
                                                                   ok, failed, fails):
    failures = [{"index": 3, "warmup": True, "error": "HTTP 400: warm"}] + [
        {"index": 5 + n, "warmup": False, "error": "HTTP 500: CUDA out of memory"} for n in range(failed)]
    host = Host(tmp_path / "host", final=figures(9000, 9000, ok=ok, failed=failed, failures=failures))
    result = run_action(args_for(workload), host, playbook_dir)
    assert bool(result.get("failed")) is fails, result["msg"]
    if fails and failed:
        assert result["msg"].startswith(f"{failed} of {ok + failed} measured requests failed (at most 5% may), "
                                        "first: HTTP 500: CUDA out of memory; score "), result["msg"]
    assert result["msg"].endswith("[simulated]")
    # The figures are recorded either way.
    assert (playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").exists()


def test_a_failed_module_fails_the_task_with_its_message(tmp_path, workload, playbook_dir, shown):
    host = Host(tmp_path / "host", final={"failed": True, "msg": "Timeout exceeded", "child_pid": 7})
    result = run_action(args_for(workload), host, playbook_dir)
    assert result["failed"] and result["msg"] == "Timeout exceeded"
    assert not (playbook_dir / "build").exists()


def test_check_mode_measures_but_writes_no_results_file(tmp_path, workload, playbook_dir, shown):
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    result = run_action(args_for(workload), host, playbook_dir, check_mode=True)
    assert result["results_file"] is None and result["gate"]["passed"]
    assert not (playbook_dir / "build").exists()


def test_a_quality_verdict_already_recorded_is_kept(tmp_path, workload, playbook_dir, shown):
    path = tmp_path / "results" / "sub510" / f"{HOST}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"score": 1, "quality": {"passed": True, "accuracy": 0.91}}))
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    result = run_action(args_for(workload, results_dir=str(tmp_path / "results")), host, playbook_dir)
    assert result["results_file"] == str(path)
    document = json.loads(path.read_text())
    assert document["quality"] == {"passed": True, "accuracy": 0.91} and document["score"] == pytest.approx(8314)
    assert sorted(item.name for item in path.parent.iterdir()) == [f"{HOST}.json"]


def test_a_quality_verdict_given_is_recorded_without_the_task_results_keys(tmp_path, workload, playbook_dir,
                                                                           shown):
    verdict = {"changed": False, "invocation": {}, "score": 0.92, "passed": True, "simulated": True}
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    result = run_action(args_for(workload, quality=verdict), host, playbook_dir)
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    assert document["quality"] == {"score": 0.92, "passed": True, "simulated": True}
    assert "quality" not in result


def test_a_relative_results_dir_is_beside_the_playbook(tmp_path, workload, playbook_dir, shown):
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    result = run_action(args_for(workload, results_dir="out"), host, playbook_dir)
    assert result["results_file"] == str(playbook_dir / "out" / "sub510" / f"{HOST}.json")


def test_without_release_no_file_is_written(tmp_path, workload, playbook_dir, shown):
    args = args_for(workload)
    del args["release"]
    result = run_action(args, Host(tmp_path / "host", final=figures(5900, 20100)), playbook_dir)
    assert result["results_file"] is None and not (playbook_dir / "build").exists()


def test_requests_of_your_own_are_sent_as_they_are(tmp_path, playbook_dir, shown):
    host = Host(tmp_path / "host", final=figures(5900, 20100))
    bodies = [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}] * 3
    result = run_action({"requests": bodies, "served_model_name": "m", "concurrency": 3, "warmup": 1,
                         "duration_seconds": 5, "poll_seconds": 0.01, "release": "r1"}, host, playbook_dir)
    _name, module_args, _wrapped = host.calls[0]
    assert module_args["requests"] == bodies and module_args["warmup"] == 1
    assert module_args["duration_seconds"] == 5 and module_args["concurrency"] == 3
    assert result["workload"] is None and result["gate"]["passed"]


# ---- refusals before anything is sent ------------------------------------------------------

def refused(args, tmp_path, playbook_dir, match):
    host = Host(tmp_path / "host", final=figures(1, 1))
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
    # The competition's are the gates role's to pass (gates_competition).
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
    host = Host(tmp_path / "host", final=figures(1, 1))
    run_action(args_for(workload, concurrency=5), host, playbook_dir)
    assert host.calls[0][1]["concurrency"] == 5
    workload.write_text(textwrap.dedent(WORKLOAD) + "concurrency: 4\n")
    host = Host(tmp_path / "host2", final=figures(1, 1))
    run_action(args_for(workload), host, playbook_dir)
    assert host.calls[0][1]["concurrency"] == 4


# ---- the real module, in-process -----------------------------------------------------------

class Engine(BaseHTTPRequestHandler):
    """Streams `max_tokens` content chunks 20 ms apart, with the stand-in's header and usage."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("x-biv100-simulated", "1")
        self.end_headers()
        for number in range(body["max_tokens"]):
            time.sleep(0.02)
            self.event({"choices": [{"index": 0, "delta": {"content": f" t{number}"}}]})
        self.event({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": body["max_tokens"]}})
        self.wfile.write(b"data: [DONE]\n\n")

    def event(self, document):
        self.wfile.write(b"data: " + json.dumps(document).encode() + b"\n\n")

    def log_message(self, format, *args):
        pass


@pytest.fixture
def engine_url(loopback_server):
    url, server = loopback_server(Engine)
    server.received = []
    return url, server.received


def test_the_real_module_end_to_end(tmp_path, workload, playbook_dir, shown, engine_url, monkeypatch):
    monkeypatch.setattr(bench_module, "PROGRESS_INTERVAL", 0.02)
    url, received = engine_url

    def live(module_args):
        return bench_module.run_bench(dict(module_args))

    host = Host(tmp_path / "host", live=live)
    result = run_action(args_for(workload, url=url, poll_seconds=0.05), host, playbook_dir)

    assert not result.get("failed"), result
    assert result["requests"] == {"ok": 6, "failed": 0} and result["warmup"] == {"ok": 1, "failed": 0}
    assert result["input_tokens"] == 6 * 30 and result["output_tokens"] == 6 * 8
    assert result["simulated"] is True and result["gate"]["passed"] is False
    assert re.fullmatch(r"score \d+ < 8000: output \d+ tok/s, input \d+ tok/s \[simulated\]", result["msg"])
    # The engine got the workload's bodies, warm-up first.
    assert received[0] == expand(load_workload(workload), "qwen3_5", 2)[0]
    progress = [line for line in shown if re.fullmatch(
        rf"{HOST}: bench [1-6]/6 requests, [\d.]+ s, output \d+ tok/s, input \d+ tok/s \[simulated\]", line)]
    assert progress, shown
    document = json.loads((playbook_dir / "build" / "bench" / "sub510" / f"{HOST}.json").read_text())
    assert document["output_tokens"] == 48 and document["simulated"] is True and document["quality"] is None


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
