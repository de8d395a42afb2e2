"""biv100.serving.engine_bench against a small streaming engine in the test: the figures come from
the server's usage and the chunks' arrival, warm-up stays out, concurrency holds, the simulated
header is reported, failures are named, the progress file is kept (the module run in-process);
and the worker that _job start leaves detaches from the module's process, status calls follow
its progress to its result, stop ends it, and its folder never holds the key or the requests
(each call a process of its own, as on a host)."""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
from ansible.module_utils.common.parameters import PASS_VARS
from gates_defaults import WEIGHTS
from json_engine import JsonEngine

from ansible_collections.biv100.serving.plugins.module_utils import _bench_job
from ansible_collections.biv100.serving.plugins.module_utils import _bench_run as bench_run
from ansible_collections.biv100.serving.plugins.modules import engine_bench

SECRET = "sk-biv100-bench-5e6f7a81"
# What Ansible passes a module when the task asks for its invocation back: ansible-core 2.21
# returns it only then (2.19 always does), so the tests ask, to check it on both lines.
WITH_INVOCATION = {"_ansible_inject_invocation": True} if "inject_invocation" in PASS_VARS else {}


class Engine(JsonEngine):
    """Streams a vLLM-shaped chat answer: a role chunk, `x_chunks` content chunks `delay` apart,
    then the usage chunk and [DONE]. The usage says what the test wants (`x_prompt_tokens`, and
    max_tokens as the completion tokens), so that a client counting for itself would be seen.
    The request numbered `held` (the first is 1) and those after it are not answered before
    `release` is set: a test that must find a worker still measuring holds it there, whatever
    the machine's speed."""

    server_version = "engine-under-test"

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        state = self.server.state
        with state["lock"]:
            state["received"].append({"body": body, "authorization": self.headers.get("Authorization"),
                                      "at": time.monotonic()})
            state["in_flight"] += 1
            state["most_in_flight"] = max(state["most_in_flight"], state["in_flight"])
            held = state["held"] is not None and len(state["received"]) >= state["held"]
        if held:
            state["release"].wait(60)
        self.body, self.left = body, False
        try:
            self.answer(body, state)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a client stopped while it was answered (a stopped worker)
        finally:
            self.leave()

    def leave(self):
        """The request no longer counts as in flight: called before its last bytes are written,
        since the client may send its next request as soon as they arrive."""
        if self.left:
            return
        self.left = True
        state = self.server.state
        with state["lock"]:
            state["in_flight"] -= 1
            state["ended"].append((self.body["messages"][0]["content"], time.monotonic()))

    def answer(self, body, state):
        if body.get("x_status"):
            self.reply(body["x_status"], {"error": {"message": "CUDA out of memory", "code": body["x_status"]}})
            return
        usage = {"prompt_tokens": body.get("x_prompt_tokens", 1000), "completion_tokens": body["max_tokens"]}
        if not body.get("stream"):
            time.sleep(state["delay"])
            self.reply(200, {"choices": [{"index": 0, "message": {"content": "hi"}}], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if state["simulated"]:
            self.send_header("x-biv100-simulated", "1")
        self.end_headers()
        self.event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for number in range(body.get("x_chunks", 3)):
            time.sleep(state["delay"])
            self.event({"choices": [{"index": 0, "delta": {"content": " w%d" % number}}]})
        if body.get("x_error_event"):
            self.event({"error": {"message": "engine died", "code": 500}})
            return
        self.wfile.write(b": ping\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            self.event({"choices": [], "usage": usage})
        self.leave()
        self.wfile.write(b"data: [DONE]\n\n")

    def event(self, document):
        self.wfile.write(b"data: " + json.dumps(document).encode() + b"\n\n")
        self.wfile.flush()

    def reply(self, status, document):
        self.send_json(document, status, {"x-biv100-simulated": "1"} if self.server.state["simulated"] else None,
                       before_body=self.leave)


@pytest.fixture
def engine(loopback_server):
    """engine(simulated=False, delay=0.01, held=None) -> (url, state); the state records what
    came, and state["release"] frees the requests held (all of them at teardown)."""
    releases = []

    def start(simulated=False, delay=0.01, held=None):
        url, server = loopback_server(Engine)
        server.state = {"lock": threading.Lock(), "received": [], "ended": [], "in_flight": 0,
                        "most_in_flight": 0, "simulated": simulated, "delay": delay, "held": held,
                        "release": threading.Event()}
        releases.append(server.state["release"])
        return url, server.state

    yield start
    for release in releases:
        release.set()


def chat(label, max_tokens=5, stream=True, **extra):
    body = {"messages": [{"role": "user", "content": label}], "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True, "temperature": 0}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def bench_args(url, requests, **options):
    return dict({"url": url, "served_model_name": "qwen3_5", "requests": requests, "concurrency": 2,
                 "timeout": 10, "weights": WEIGHTS}, **options)


def test_the_figures_are_the_servers_counts_over_the_measured_requests(engine, run_module, tmp_path):
    url, state = engine()
    requests = [chat("warm-%d" % n, max_tokens=50, x_prompt_tokens=90000) for n in range(2)]
    requests += [chat("measured-%d" % n, max_tokens=5, x_prompt_tokens=1000 + n) for n in range(6)]
    failed, result = run_module(engine_bench, bench_args(url, requests, warmup=2,
                                                         progress_file=str(tmp_path / "progress.json"),
                                                         **WITH_INVOCATION))

    assert not failed, result
    assert result["requests"] == {"ok": 6, "failed": 0} and result["warmup"] == {"ok": 2, "failed": 0}
    # The server's usage: 5 completion tokens each although only 3 content chunks came, and the
    # warm-up's 90000-token prompts are nowhere.
    assert result["output_tokens"] == 30 and result["input_tokens"] == sum(1000 + n for n in range(6))
    assert result["simulated"] is False and "[simulated]" not in result["msg"]
    assert result["changed"] is False and result["concurrency"] == 2
    assert 0 < result["duration_s"] < 5
    assert result["output_tps"] == pytest.approx(30 / result["duration_s"], rel=1e-2)  # duration_s is rounded
    assert result["weights"] == WEIGHTS
    weighted = WEIGHTS["output"] * result["output_tps"] + WEIGHTS["input"] * result["input_tps"]
    assert result["score"] == pytest.approx(weighted, rel=1e-3)
    # Four chunks (the role chunk too, as vLLM's benchmark counts) 10 ms apart: gaps of ~10 ms.
    assert 5 <= result["itl_ms"]["p50"] < 200 and result["ttft_ms"]["p50"] < result["e2e_ms"]["p50"]
    assert set(result["ttft_ms"]) == {"mean", "p50", "p90", "p99"}
    # Two at a time, and every warm-up request ended before the first measured one was sent.
    assert state["most_in_flight"] == 2
    measured_sent = min(item["at"] for item in state["received"] if item["body"]["messages"][0]["content"]
                        .startswith("measured"))
    assert all(at <= measured_sent for content, at in state["ended"] if content.startswith("warm"))
    # Every body got the served model; the result does not carry the bodies back.
    assert {item["body"]["model"] for item in state["received"]} == {"qwen3_5"}
    assert result["invocation"]["module_args"]["requests"] == "8 request bodies"
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["phase"] == "done"
    assert progress["requests"] == {"done": 6, "ok": 6, "failed": 0, "total": 6}
    assert progress["output_tokens"] == 30 and progress["warmup"]["done"] == 2


def test_answers_with_the_simulated_header_mark_every_figure(engine, run_module):
    url, _state = engine(simulated=True)
    failed, result = run_module(engine_bench, bench_args(url, [chat("a"), chat("b")]))
    assert not failed and result["simulated"] is True
    assert result["msg"].endswith("[simulated]"), result["msg"]


def test_failed_requests_are_counted_apart_and_say_why(engine, run_module):
    url, _state = engine()
    requests = [
        chat("ok"),
        chat("no-usage", stream_options={"include_usage": False}),
        chat("error-status", x_status=500),
        chat("error-event", x_error_event=True),
        chat("no-tokens", x_chunks=0, x_status=None),
    ]
    failed, result = run_module(engine_bench, bench_args(url, requests))
    assert not failed, result
    # The role chunk counts as a chunk, as in vLLM's benchmark, so "no-tokens" succeeds.
    assert result["requests"] == {"ok": 2, "failed": 3}
    errors = {requests[item["index"]]["messages"][0]["content"]: item["error"] for item in result["failures"]}
    assert errors["no-usage"].startswith("no usage in the answer")
    assert errors["error-status"] == "HTTP 500: CUDA out of memory"
    assert errors["error-event"] == "error event: engine died"
    assert result["output_tokens"] == 10


def test_the_progress_file_is_rewritten_while_the_run_goes(engine, run_module, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_run, "PROGRESS_INTERVAL", 0.01)
    url, _state = engine(delay=0.02)
    path = tmp_path / "progress.json"
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                seen.append(json.loads(path.read_text()))  # never a part: each version is renamed in
            except FileNotFoundError:
                pass
            time.sleep(0.003)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        failed, result = run_module(engine_bench, bench_args(
            url, [chat("w0"), chat("m0"), chat("m1"), chat("m2"), chat("m3")], warmup=1, concurrency=1,
            progress_file=str(path)))
    finally:
        stop.set()
        watcher.join()
    seen.append(json.loads(path.read_text()))
    assert not failed and result["progress_error"] is None
    phases = [item["phase"] for item in seen]
    assert phases[0] == "warmup" and "measuring" in phases and phases[-1] == "done"
    counts = [item["requests"]["done"] for item in seen if item["phase"] == "measuring"]
    assert counts == sorted(counts) and len(set(counts)) > 1  # it moved while measuring
    middle = [item for item in seen if item["phase"] == "measuring" and item["output_tokens"]]
    assert middle and all(item["output_tps"] > 0 and item["elapsed_s"] > 0 for item in middle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]  # no staged file left


def test_an_unwritable_progress_file_does_not_stop_the_measurement(engine, run_module, tmp_path):
    url, _state = engine()
    (tmp_path / "a-file").write_text("not a folder\n")
    failed, result = run_module(engine_bench, bench_args(
        url, [chat("a"), chat("b")], progress_file=str(tmp_path / "a-file" / "progress.json")))
    assert not failed and result["requests"]["ok"] == 2
    assert "a-file/progress.json" in result["progress_error"]


def test_with_a_duration_the_requests_are_sent_pass_after_pass_until_it_is_up(engine, run_module):
    url, state = engine(delay=0.01)
    failed, result = run_module(engine_bench, bench_args(url, [chat("alpha"), chat("beta")], duration_seconds=0.4))
    assert not failed, result
    contents = [item["body"]["messages"][0]["content"] for item in state["received"]]
    assert sorted(contents[:2]) == ["alpha", "beta"] and "(pass 1) alpha" in contents
    assert len(contents) == len(set(contents)) > 4  # never the same prompt twice
    assert result["requests"]["ok"] == len(contents)
    assert 0.4 <= result["duration_s"] < 2


def test_a_request_over_its_timeout_fails(engine, run_module):
    url, _state = engine(delay=0.3)
    failed, result = run_module(engine_bench, bench_args(url, [chat("slow", x_chunks=5)], timeout=0.5))
    assert not failed and result["requests"] == {"ok": 0, "failed": 1}
    assert result["failures"][0]["error"] == "timed out after 0.5 s"


def test_a_whole_answer_is_one_chunk(engine, run_module):
    url, _state = engine()
    failed, result = run_module(engine_bench, bench_args(url, [chat("plain", stream=False)]))
    assert not failed and result["requests"]["ok"] == 1
    assert result["ttft_ms"] == result["e2e_ms"] and result["itl_ms"]["p99"] == 0


def test_the_key_is_sent_as_the_bearer_token_and_returned_nowhere_also_in_check_mode(engine, run_module):
    url, state = engine()
    failed, result = run_module(engine_bench, dict(bench_args(url, [chat("a")]), api_key=SECRET,
                                                   _ansible_check_mode=True))
    assert not failed and result["requests"]["ok"] == 1
    assert state["received"][0]["authorization"] == "Bearer " + SECRET
    assert SECRET not in json.dumps(result)


def test_the_key_can_come_from_the_engines_env_file_on_the_host(engine, run_module, tmp_path):
    url, state = engine()
    env_file = tmp_path / "engine.env"
    env_file.write_text("# Written by biv100.serving\nPYTHONPATH=/x\nVLLM_API_KEY=%s\n" % SECRET)
    failed, result = run_module(engine_bench, dict(bench_args(url, [chat("a")]), api_key_env_file=str(env_file)))
    assert not failed and state["received"][0]["authorization"] == "Bearer " + SECRET
    assert SECRET not in json.dumps(result)


def test_the_key_is_read_from_the_env_file_as_the_engine_reads_it(engine, run_module, tmp_path):
    url, state = engine()
    env_file = tmp_path / "engine.env"
    # As the engine role writes a key with a quote and a backslash; systemd unquotes it.
    env_file.write_text('VLLM_API_KEY="sk-\\"team\\"-\\\\k"\n')
    failed, result = run_module(engine_bench, dict(bench_args(url, [chat("a")]), api_key_env_file=str(env_file)))
    assert not failed and state["received"][0]["authorization"] == 'Bearer sk-"team"-\\k'


def test_an_env_file_that_is_not_name_value_fails_naming_it(engine, run_module, tmp_path):
    url, state = engine()
    env_file = tmp_path / "engine.env"
    env_file.write_text("VLLM_API_KEY %s\n" % SECRET)
    failed, result = run_module(engine_bench, dict(bench_args(url, [chat("a")]), api_key_env_file=str(env_file)))
    assert failed and result["msg"] == "api_key_env_file %s: %s line 1 is not KEY=VALUE: it has no =" % (
        env_file, env_file)
    assert state["received"] == [] and SECRET not in json.dumps(result)


def test_concurrency_falls_back_to_max_num_seqs(engine, run_module):
    url, state = engine(delay=0.02)
    args = bench_args(url, [chat(str(n)) for n in range(6)], max_num_seqs=3)
    del args["concurrency"]
    failed, result = run_module(engine_bench, args)
    assert not failed and result["concurrency"] == 3 and state["most_in_flight"] == 3


@pytest.mark.parametrize("options, message", [
    ({"warmup": 2}, "warmup (2) must leave at least one of the 2 requests to measure"),
    ({"url": "https://127.0.0.1:8000"}, "only http:// is measured"),
    ({"concurrency": 0}, "concurrency (or max_num_seqs) must be 1 or more"),
    ({"duration_seconds": 0}, "duration_seconds must be above 0"),
])
def test_what_cannot_be_measured_is_refused_before_any_request(engine, run_module, options, message):
    url, state = engine()
    failed, result = run_module(engine_bench, dict(bench_args(url, [chat("a"), chat("b")]), **options))
    assert failed and message in result["msg"], result["msg"]
    assert state["received"] == []


@pytest.mark.parametrize("weights, message", [(None, "missing required arguments: weights"),
                                              ({"output": 1.0}, "missing required arguments: input")])
def test_the_weights_have_no_default_of_their_own(engine, run_module, weights, message):
    # The competition's are the gates role's to pass (serving_competition, the serving role's).
    url, state = engine()
    args = bench_args(url, [chat("a")], weights=weights)
    if weights is None:
        del args["weights"]
    failed, result = run_module(engine_bench, args)
    assert failed and message in result["msg"], result["msg"]
    assert state["received"] == []


def test_a_workload_is_the_actions_to_expand(run_module):
    failed, result = run_module(engine_bench, {"served_model_name": "qwen3_5", "workload": "default",
                                               "weights": WEIGHTS})
    assert failed and "action plugin" in result["msg"]


# ---- the detached worker: _job start, status and stop, each call a process of its own ---------

MODULE = "ansible_collections.biv100.serving.plugins.modules.engine_bench"


def job_files(job_dir):
    """{name: content} of the job's folder now (a file may go between the listing and the read)."""
    found = {}
    for path in job_dir.iterdir() if job_dir.exists() else ():
        try:
            found[path.name] = path.read_text()
        except FileNotFoundError:
            pass
    return found


def alive(pid):
    """Whether pid runs (a zombie, ended but not yet reaped by init, does not)."""
    try:
        with open("/proc/%d/stat" % pid) as stream:
            return stream.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pid, seconds=30.0):
    """Whether pid ends within seconds: a loaded machine may take some, and only a failure waits
    them out."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_a_started_worker_detaches_and_status_calls_follow_it_to_its_result(engine, module_process, tmp_path):
    # The fourth request waits for the test: until then the worker can only be measuring, three
    # done, however slowly the status calls' processes start on a loaded machine.
    url, state = engine(delay=0.01, held=4)
    env_file = tmp_path / "engine.env"
    env_file.write_text("VLLM_API_KEY=%s\n" % SECRET)
    requests = [chat("measured-%d" % n, max_tokens=5) for n in range(8)]
    args = dict(bench_args(url, requests, concurrency=1, timeout=60), api_key_env_file=str(env_file))
    # In check mode too: the requests change nothing but the engine's caches.
    failed, started = module_process(MODULE, dict(args, _job="start", _ansible_check_mode=True, **WITH_INVOCATION))
    assert not failed, started
    job_dir, pid = Path(started["job_dir"]), started["pid"]
    assert started["changed"] is False and started["invocation"]["module_args"]["requests"] == "8 request bodies"

    # The module's process has ended and its output closed (module_process read it to its end)
    # while the worker still measures, in a session of its own, holding nothing of the module's.
    assert alive(pid) and len(state["received"]) < len(requests)
    assert os.getsid(pid) != os.getsid(0)
    assert [os.readlink("/proc/%d/fd/%d" % (pid, fd)) for fd in (0, 1, 2)] == [os.devnull] * 3
    held = [os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%d/fd" % pid)]
    assert not [target for target in held if target.startswith("pipe:")], held
    assert job_dir.parent == tmp_path  # the host's temporary folder (TMPDIR)
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700 and job_dir.stat().st_uid == os.geteuid()

    seen, snapshots = [], []

    def status():
        snapshots.append(job_files(job_dir))
        failed, result = module_process(MODULE, {"served_model_name": "qwen3_5", "weights": WEIGHTS, "_job": "status",
                                                 "_job_dir": str(job_dir), "_job_wait": 0.2})
        assert not failed, result
        if not result["finished"]:
            assert result["changed"] is False
            seen.append(result["progress"])
        return result

    # Followed up to the request held, and no further until it is released.
    for _poll in range(100):
        result = status()
        assert result["finished"] is False, result
        if (result["progress"] or {}).get("requests", {}).get("done") == 3:
            break
    state["release"].set()
    for _poll in range(100):
        result = status()
        if result["finished"]:
            break
    assert result["finished"] is True
    # The run so far, as it went; then the result, as a call of the module without _job gives it.
    counts = [item["requests"]["done"] for item in seen if item and item["phase"] == "measuring"]
    assert 3 in counts and counts == sorted(counts) and counts[-1] < len(requests), seen
    assert result["requests"] == {"ok": 8, "failed": 0} and result["output_tokens"] == 40
    assert result["changed"] is False and result["concurrency"] == 1 and result["progress_error"] is None
    assert [item["authorization"] for item in state["received"]] == ["Bearer " + SECRET] * 8
    # The key and the request bodies were never on disk; the folder went with the result.
    assert snapshots and all(SECRET not in text and "measured-" not in text
                             for files in snapshots for text in files.values()), snapshots
    assert {name for files in snapshots for name in files} >= {"running", "worker.json", "progress.json"}
    assert SECRET not in json.dumps(result)
    assert not job_dir.exists() and gone(pid)


def test_stop_ends_a_running_worker_and_removes_its_folder(engine, module_process):
    url, state = engine(held=2)  # the worker measures until it is stopped
    failed, started = module_process(MODULE, dict(bench_args(url, [chat("slow-%d" % n) for n in range(20)]),
                                                  _job="start"))
    assert not failed, started
    job = {"served_model_name": "qwen3_5", "weights": WEIGHTS, "_job_dir": started["job_dir"]}
    failed, stopped = module_process(MODULE, dict(job, _job="stop"))
    assert not failed and stopped["stopped"] is True and stopped["changed"] is True
    assert gone(started["pid"]) and not os.path.exists(started["job_dir"])
    assert len(state["received"]) < 20
    # A job already gone is nothing to stop.
    failed, again = module_process(MODULE, dict(job, _job="stop"))
    assert not failed and again["stopped"] is False and again["changed"] is False


def test_a_worker_killed_before_its_result_is_reported_and_its_folder_removed(engine, module_process):
    url, _state = engine(held=1)  # the worker has no result when it is killed
    failed, started = module_process(MODULE, dict(bench_args(url, [chat("slow-%d" % n) for n in range(20)]),
                                                  _job="start"))
    assert not failed, started
    os.kill(started["pid"], signal.SIGKILL)
    assert gone(started["pid"])
    failed, result = module_process(MODULE, {"served_model_name": "qwen3_5", "weights": WEIGHTS, "_job": "status",
                                             "_job_dir": started["job_dir"], "_job_wait": 0})
    assert failed and result["finished"] is True
    assert result["msg"] == "the benchmark worker (pid %d) ended without a result" % started["pid"]
    assert not os.path.exists(started["job_dir"])


def test_a_folder_that_is_not_a_job_of_this_user_is_refused_and_left_alone(module_process, tmp_path):
    shared = tmp_path / (_bench_job.JOB_PREFIX + "shared")
    shared.mkdir(mode=0o755)
    (shared / "keep").write_text("x")
    for job_dir, message in ((str(tmp_path), "is not the folder of an engine_bench job"),
                             (str(shared), "is not a private folder of this user's")):
        for call in ("status", "stop"):
            failed, result = module_process(MODULE, {"served_model_name": "m", "weights": WEIGHTS, "_job": call,
                                                     "_job_dir": job_dir})
            assert failed and message in result["msg"], result
    assert (shared / "keep").read_text() == "x"
