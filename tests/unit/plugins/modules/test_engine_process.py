"""biv100.serving.engine_process with real processes: a small HTTP server stands in for vLLM."""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import socket
import sys
import textwrap
import time

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    group_members,
    is_alive,
    process_stat,
)
from ansible_collections.biv100.serving.plugins.modules import engine_process

# The engine stand-in of these tests: vLLM's /health (503 while "loading", --ready-after seconds
# from the first poll) and /v1/models, one worker child in its process group as vLLM's
# tensor-parallel workers are, and on request a SIGTERM it ignores.
SERVER = textwrap.dedent("""
    import argparse, json, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="qwen3_5")
    parser.add_argument("--max-model-len", type=int, default=256000)
    parser.add_argument("--max-num-seqs", type=int, default=2)
    parser.add_argument("--ready-after", type=float, default=0)
    parser.add_argument("--api-key")
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    ready_at = []  # set by the first poll: the wait is as long however late a loaded machine started this

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                if not ready_at:
                    ready_at.append(time.monotonic() + args.ready_after)
                self.answer(200 if time.monotonic() >= ready_at[0] else 503, {})
            elif self.path != "/v1/models":
                self.answer(404, {"error": "not found"})
            elif args.api_key and self.headers.get("Authorization") != "Bearer " + args.api_key:
                self.answer(401, {"error": "Unauthorized"})
            else:
                card = {"id": args.served_model_name, "object": "model",
                        "max_model_len": args.max_model_len}
                self.answer(200, {"object": "list", "data": [card]})

        def answer(self, status, document):
            body = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = HTTPServer(("127.0.0.1", args.port), Handler)
    print("serving on port %d, worker %d" % (args.port, worker.pid), flush=True)
    server.serve_forever()
    """)

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def end_process_group(pid):
    """SIGKILL pid's group if pid still leads it, and reap pid if it is a child of the tests."""
    stat = process_stat(pid)
    if stat and stat["pgrp"] == pid:
        os.killpg(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


@pytest.fixture
def server_script(tmp_path):
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return path


@pytest.fixture
def engine(tmp_path, server_script, run_module):
    """engine(state=..., **args) runs the module on files under tmp_path; every engine it
    started is killed at teardown."""
    port = free_port()
    started = []

    def run(*extra_arguments, **args):
        defaults = dict(
            name="vllm",
            manager="pidfile",
            command=[sys.executable, str(server_script), "--port", str(port)]
            + list(extra_arguments),
            pid_file=str(tmp_path / "run" / "vllm.pid"),
            log_file=str(tmp_path / "log" / "vllm.log"),
            start_check_seconds=0.3,
        )
        outcome = run_module(engine_process, dict(defaults, **args))
        if outcome.result.get("pid"):
            started.append(outcome.result["pid"])
        return outcome

    run.port = port
    run.pid_file = tmp_path / "run" / "vllm.pid"
    run.log_file = tmp_path / "log" / "vllm.log"
    yield run
    for pid in started:
        end_process_group(pid)


@pytest.fixture
def foreign_process(started_process):
    """A process that is not the engine: a sleep under another command line."""
    return started_process(["sleep", "60"])


def environ_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as stream:
        entries = stream.read().decode().split("\0")[:-1]
    return dict(entry.split("=", 1) for entry in entries)


def wait_for_log_line(path, text, seconds=30):
    """Wait for the stand-in to log text: seconds on a loaded machine, which starts Python slowly."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError("%s never showed up in %s" % (text, path))


def test_started_launches_a_lasting_engine_in_a_session_of_its_own(engine, tmp_path):
    env_file = tmp_path / "vllm.env"
    env_file.write_text(
        "# the tuned allocator\n"
        "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'\n"
        "\n"
        "CUDA_VISIBLE_DEVICES=0,1\n"
    )
    failed, result = engine(env_file=str(env_file), env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})

    assert not failed and result["changed"] and result["action"] == "start"
    pid = result["pid"]
    assert engine.pid_file.read_text() == "%d\n" % pid
    assert is_alive(pid) and os.getsid(pid) == pid
    wanted_env = {
        "PATH": BASE_PATH,
        "HOME": pwd.getpwuid(os.geteuid()).pw_dir,
        "LANG": "C.UTF-8",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    assert environ_of(pid) == wanted_env and result["env"] == wanted_env
    assert result["command"][-2:] == ["--port", str(engine.port)] and result["drift"] == []
    assert result["running"] and result["started_at"].endswith("Z")
    wait_for_log_line(engine.log_file, "serving on port %d" % engine.port)
    # Its output goes to the log and nowhere of the module's: Ansible waits for those to close.
    outputs = [os.readlink("/proc/%d/fd/%d" % (pid, fd)) for fd in (0, 1, 2)]
    assert outputs == ["/dev/null", str(engine.log_file), str(engine.log_file)]


def test_an_engine_as_desired_is_left_alone_and_reports_no_drift(engine):
    first = engine("--max-num-seqs", "2").result
    again = engine("--max-num-seqs=2").result
    status = engine("--max-num-seqs", "2", state="status").result

    assert (again["changed"], again["action"], again["pid"]) == (False, "none", first["pid"])
    assert (status["changed"], status["running"], status["drift"]) == (False, True, [])
    assert status["pid"] == first["pid"] and status["command"] == first["command"]


def test_drift_is_reported_by_status_and_restarts_a_started_engine(engine):
    first = engine(
        "--max-num-seqs", "4", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    ).result
    desired = dict(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    expected_drift = [
        "argument --max-num-seqs: running 4, desired 2",
        "env PYTORCH_CUDA_ALLOC_CONF: running expandable_segments:False, desired expandable_segments:True",
    ]

    status = engine("--max-num-seqs", "2", state="status", **desired).result
    assert (status["changed"], status["drift"], status["pid"]) == (
        False,
        expected_drift,
        first["pid"],
    )

    restarted = engine("--max-num-seqs", "2", **desired).result
    assert (restarted["changed"], restarted["action"]) == (True, "restart")
    assert restarted["drift"] == expected_drift and restarted["pid"] != first["pid"]
    assert not is_alive(first["pid"]) and "--max-num-seqs" in restarted["command"]
    assert restarted["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_a_launcher_that_execs_the_engine_is_no_drift_and_a_changed_launcher_is(engine, server_script):
    # env, like chroot, numactl or the lab's in-engine-root, execs the command: the kernel's argv
    # is the engine's own, without the launcher's words.
    engine_command = [sys.executable, str(server_script), "--port", str(engine.port)]
    # The start check as long as the module's default: env has exec'd the engine by the time the
    # module reads its command line, even on a loaded machine.
    first = engine(command=["/usr/bin/env"] + engine_command, start_check_seconds=2).result
    assert first["command"] == engine_command

    again = engine(command=["/usr/bin/env"] + engine_command).result
    assert (again["changed"], again["action"], again["drift"], again["pid"]) == (False, "none", [], first["pid"])

    other = engine(command=["/usr/bin/env", "-u", "NOTHING_SET"] + engine_command, state="status").result
    assert other["drift"] == ["launcher: running /usr/bin/env, desired /usr/bin/env -u NOTHING_SET"]


def test_a_flag_and_an_unset_variable_are_drift_too(engine):
    engine(env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    status = engine("--ignore-sigterm", state="status", env={"OTHER": "1"}).result

    assert status["drift"] == [
        "argument --ignore-sigterm: running absent, desired set",
        "env OTHER: running unset, desired 1",
        "env VLLM_LOGGING_LEVEL: running DEBUG, desired unset",
    ]
    assert status["env"]["OTHER"] is None and status["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_stopped_ends_the_whole_process_group_once(engine):
    started = engine().result
    wait_for_log_line(engine.log_file, "worker")
    assert len(group_members(started["pid"])) == 2

    stopped = engine(state="stopped")
    assert not stopped.failed and (stopped.result["changed"], stopped.result["action"]) == (
        True,
        "stop",
    )
    assert group_members(started["pid"]) == [] and not engine.pid_file.exists()
    assert stopped.result["running"] is False and stopped.result["pid"] is None

    again = engine(state="stopped").result
    assert (again["changed"], again["action"]) == (False, "none")


def test_an_engine_ignoring_sigterm_is_killed_after_the_grace_period(engine):
    started = engine("--ignore-sigterm").result
    wait_for_log_line(engine.log_file, "worker")
    begun = time.monotonic()

    stopped = engine(state="stopped", stop_timeout=1)

    assert not stopped.failed and stopped.result["changed"]
    # Killed after its 1 s, not the default 30 s: an upper bound far above a loaded machine's 1.5 s.
    assert 1 <= time.monotonic() - begun < 15 and group_members(started["pid"]) == []


def test_a_pid_file_naming_a_foreign_process_is_stale_and_never_signalled(engine, foreign_process):
    engine.pid_file.parent.mkdir(parents=True)
    engine.pid_file.write_text("%d\n" % foreign_process.pid)

    stopped = engine(state="stopped")
    assert not stopped.failed and stopped.result["changed"] is False
    assert (
        "names process %d (sleep 60)" % foreign_process.pid
        in stopped.result["warnings"][0]["event"]["msg"]
    )
    assert not engine.pid_file.exists() and foreign_process.poll() is None

    engine.pid_file.write_text("%d\n" % foreign_process.pid)
    started = engine().result
    assert started["action"] == "start" and started["pid"] != foreign_process.pid
    time.sleep(0.2)
    assert foreign_process.poll() is None


def test_the_launch_record_tells_a_reused_pid_from_the_engine(engine, foreign_process):
    first = engine().result
    engine(state="stopped")
    # The engine ended and its pid file was left behind, now naming a process that is not it.
    record = engine.pid_file.with_suffix(".json")
    record.write_text('{"pid": %d, "start_ticks": 1, "command": []}' % foreign_process.pid)
    engine.pid_file.write_text("%d\n" % foreign_process.pid)

    status = engine(state="status").result

    assert status["running"] is False and first["pid"] != foreign_process.pid
    assert foreign_process.poll() is None and engine.pid_file.exists()


def test_a_large_log_is_rotated_at_start(engine):
    engine.log_file.parent.mkdir(parents=True)
    engine.log_file.write_text("old run\n" * 100)
    engine.log_file.with_name("vllm.log.1").write_text("older run\n")

    assert not engine(log_max_bytes=500, log_backups=2).failed

    assert engine.log_file.with_name("vllm.log.1").read_text() == "old run\n" * 100
    assert engine.log_file.with_name("vllm.log.2").read_text() == "older run\n"
    assert "old run" not in engine.log_file.read_text()


def test_an_engine_that_exits_at_once_fails_with_its_own_log_tail(engine, tmp_path):
    engine.log_file.parent.mkdir(parents=True)
    engine.log_file.write_text("INFO an earlier engine's request\n")
    crash = [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"]

    # A start check long enough for a loaded machine's slow interpreter start: it ends at the exit.
    failed, result = engine(command=crash, start_check_seconds=10)

    assert failed and result["rc"] == 3
    assert result["msg"] == ("vllm exited with status 3 within 10.0 s of its start; "
                             "log tail (2 lines of %s) in log_tail" % engine.log_file)
    # From this start's header on: the earlier engine's lines say nothing about this failure.
    tail = result["log_tail"]
    assert len(tail) == 2 and " vllm starts: " in tail[0] and tail[-1] == "CUDA out of memory"
    assert "earlier engine" not in json.dumps(result)
    assert not engine.pid_file.exists()


def test_check_mode_reports_and_starts_or_stops_nothing(engine):
    would_start = engine(_ansible_check_mode=True, _ansible_diff=True).result
    assert (would_start["changed"], would_start["action"], would_start["running"]) == (
        True,
        "start",
        False,
    )
    assert would_start["diff"]["after"]["running"] is True and not engine.pid_file.exists()

    running = engine("--max-num-seqs", "4").result
    would_restart = engine("--max-num-seqs", "2", _ansible_check_mode=True).result
    would_stop = engine(state="stopped", _ansible_check_mode=True).result

    assert (would_restart["action"], would_restart["pid"]) == ("restart", running["pid"])
    assert would_restart["drift"] == ["argument --max-num-seqs: running 4, desired 2"]
    assert (would_stop["changed"], would_stop["action"]) == (True, "stop")
    assert is_alive(running["pid"]) and engine.pid_file.exists()


def test_an_env_file_line_that_is_not_key_value_fails_naming_it(engine, tmp_path):
    env_file = tmp_path / "vllm.env"
    env_file.write_text("LANG=C.UTF-8\nexpandable_segments:True\n")

    failed, result = engine(env_file=str(env_file))

    assert failed and "vllm.env line 2 is not KEY=VALUE" in result["msg"]
    assert not engine.pid_file.exists()


def test_the_launched_engine_gets_the_env_file_as_systemd_would_read_it(engine, tmp_path):
    env_file = tmp_path / "vllm.env"
    env_file.write_text(
        "; systemd's other comment\n"
        "QUOTED=\"a \\\"b\\\" c\\\\d\"\n"
        "JOINED='x' \"y\"z\n"
        "ESCAPED=one\\ two\\\\  \n"
    )

    failed, result = engine(env_file=str(env_file))

    assert not failed, result["msg"]
    wanted = {"QUOTED": 'a "b" c\\d', "JOINED": "xyz", "ESCAPED": "one two\\"}
    running = environ_of(result["pid"])
    assert {name: running.get(name) for name in wanted} == wanted and result["drift"] == []


def test_restarted_replaces_the_engine_and_shows_the_change(engine):
    first = engine().result

    restarted = engine(state="restarted", env={"VLLM_LOGGING_LEVEL": "DEBUG"}, _ansible_diff=True)

    assert not restarted.failed and restarted.result["action"] == "restart"
    assert restarted.result["pid"] != first["pid"] and not is_alive(first["pid"])
    before, after = restarted.result["diff"]["before"], restarted.result["diff"]["after"]
    assert (
        before["env"]["VLLM_LOGGING_LEVEL"] is None
        and after["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
    )
    assert before["running"] is after["running"] is True


def test_an_env_file_yet_to_be_written_fails_outside_check_mode_only(engine, tmp_path):
    missing = str(tmp_path / "vllm.env")

    checked = engine(env_file=missing, _ansible_check_mode=True)
    assert not checked.failed and checked.result["action"] == "start"
    assert "does not exist yet" in checked.result["warnings"][0]["event"]["msg"]

    failed, result = engine(env_file=missing)
    assert failed and result["msg"] == "env_file %s does not exist" % missing
    assert not engine(state="stopped", env_file=missing).failed


def test_the_env_file_is_written_when_it_differs_and_its_change_restarts_the_engine(engine, tmp_path):
    env_file = tmp_path / "etc" / "engine.env"
    first = engine(env_file=str(env_file), env_file_content="ALLOC=a\n").result
    assert first["changed"] and first["env_file_matches"] is False
    assert env_file.read_text() == "ALLOC=a\n" and stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert environ_of(first["pid"])["ALLOC"] == "a"

    same = engine(env_file=str(env_file), env_file_content="ALLOC=a\n").result
    assert (same["changed"], same["env_file_matches"], same["pid"]) == (False, True, first["pid"])

    status = engine(env_file=str(env_file), env_file_content="ALLOC=b\n", state="status").result
    assert status["env_file_matches"] is False and env_file.read_text() == "ALLOC=a\n"
    assert status["drift"] == ["env ALLOC: running a, desired b"]
    checked = engine(env_file=str(env_file), env_file_content="ALLOC=b\n", _ansible_check_mode=True).result
    assert checked["changed"] and env_file.read_text() == "ALLOC=a\n"

    moved = engine(env_file=str(env_file), env_file_content="ALLOC=b\n").result
    assert (moved["action"], moved["env"]["ALLOC"]) == ("restart", "b") and env_file.read_text() == "ALLOC=b\n"


# --- the clients' key (VLLM_API_KEY) ----------------------------------------------------------

SECRET = "sk-biv100-0f1e2d3c4b5a6978"
ROTATED = "sk-biv100-rotated-8a7b6c5d"


def test_the_api_key_reaches_the_engine_and_nothing_the_module_returns(engine, tmp_path):
    env_file = tmp_path / "etc" / "engine.env"
    content = "ALLOC=a\nVLLM_API_KEY=%s\n" % SECRET

    started = engine(env_file=str(env_file), env_file_content=content, _ansible_diff=True).result

    assert environ_of(started["pid"])["VLLM_API_KEY"] == SECRET
    assert SECRET not in " ".join(started["command"])
    assert SECRET not in json.dumps(started)
    # Only the secret is masked: the other variables are reported as they are.
    assert started["env"]["ALLOC"] == "a" and started["env"]["VLLM_API_KEY"] != SECRET
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


def test_a_changed_api_key_is_drift_reported_without_either_value(engine, tmp_path):
    env_file = str(tmp_path / "engine.env")
    first = engine(env_file=env_file, env_file_content="VLLM_API_KEY=%s\n" % SECRET).result
    rotated = "VLLM_API_KEY=%s\n" % ROTATED

    status = engine(env_file=env_file, env_file_content=rotated, state="status").result
    checked = engine(env_file=env_file, env_file_content=rotated, _ansible_check_mode=True,
                     _ansible_diff=True).result
    moved = engine(env_file=env_file, env_file_content=rotated, _ansible_diff=True).result

    assert status["drift"] == ["env VLLM_API_KEY: running ********, desired ********"]
    assert (checked["action"], moved["action"]) == ("restart", "restart")
    assert environ_of(moved["pid"])["VLLM_API_KEY"] == ROTATED and not is_alive(first["pid"])
    for result in (first, status, checked, moved):
        assert SECRET not in json.dumps(result) and ROTATED not in json.dumps(result)


def test_a_failed_start_that_logs_the_key_shows_its_tail_with_the_key_masked(engine, tmp_path):
    telling = [sys.executable, "-c",
               "import os, sys; print('RuntimeError: refused key ' + os.environ['VLLM_API_KEY']); "
               "sys.exit(1)"]

    failed, result = engine(command=telling, env_file=str(tmp_path / "engine.env"),
                            env_file_content="VLLM_API_KEY=%s\n" % SECRET, start_check_seconds=10)

    assert failed and result["log_tail"][-1] == "RuntimeError: refused key ********"
    assert SECRET not in json.dumps(result)


def test_a_restart_for_a_run_that_lost_the_hosts_lock_changes_nothing_and_names_the_holder(engine, tmp_path,
                                                                                           monkeypatch):
    # Started by run A, whose lock run B took over before A's restart came.
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "lock").write_text(json.dumps({"run_id": "run-A", "user": "deploy", "controller": "ctl1"}))
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-A")
    first = engine(state_dir=str(state_dir)).result
    (state_dir / "lock").write_text(json.dumps({"run_id": "run-B", "user": "alice", "controller": "ctl2",
                                                "acquired_at": "2026-12-07T23:00:00Z"}))

    refused = engine(state="restarted", env={"VLLM_LOGGING_LEVEL": "DEBUG"}, state_dir=str(state_dir))

    assert refused.failed and refused.result["action"] == "none"
    assert refused.result["msg"] == (
        f"restarting vllm refused, nothing changed on this host: run run-A no longer holds its lock, {state_dir}/lock "
        "is held by run run-B (alice@ctl2) since 2026-12-07T23:00:00Z")
    assert is_alive(first["pid"]) and int(engine.pid_file.read_text().split()[0]) == first["pid"]
    # An engine left as it is needs no lock: nothing is written.
    assert not engine(state_dir=str(state_dir)).failed
