"""biv100.serving.engine_process under a service manager: a real supervisord of the tests' own,
and the systemd unit it would write."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.module_utils import _engine_managers, _engine_systemd
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    group_members,
    is_alive,
)
from ansible_collections.biv100.serving.plugins.modules import engine_process, engine_retire

from test_engine_process import SERVER, end_process_group, environ_of, free_port

VENV_BIN = Path(sys.executable).parent
# A value that supervisor's %-expansion, its quoting and systemd's specifiers would all mangle.
AWKWARD = 'a "quoted", 100% $HOME\\value'


@pytest.fixture
def supervisord(tmp_path):
    """A supervisord of this test's own (socket, pid file and includes under tmp_path), and a
    supervisorctl that reaches it; stopped by its recorded pid at teardown."""
    root = tmp_path / "supervisor"
    (root / "conf.d").mkdir(parents=True)
    config = root / "supervisord.conf"
    config.write_text(
        "[unix_http_server]\n"
        f"file={root}/supervisor.sock\n"
        "chmod=0700\n"
        "[supervisord]\n"
        f"pidfile={root}/supervisord.pid\n"
        f"logfile={root}/supervisord.log\n"
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n"
        "[supervisorctl]\n"
        f"serverurl=unix://{root}/supervisor.sock\n"
        "[include]\n"
        f"files = {root}/conf.d/*.conf\n"
    )
    control = root / "supervisorctl"
    control.write_text(f'#!/bin/sh\nexec {VENV_BIN}/supervisorctl -c {config} "$@"\n')
    control.chmod(0o755)
    subprocess.run([str(VENV_BIN / "supervisord"), "-c", str(config)], check=True)
    pid_file = root / "supervisord.pid"
    # Generous: a loaded machine takes seconds for supervisord's start and each supervisorctl's.
    deadline = time.monotonic() + 60
    while subprocess.run([str(control), "pid"], capture_output=True, check=False).returncode != 0:
        assert time.monotonic() < deadline, "supervisord did not answer"
        time.sleep(0.05)
    daemon = int(pid_file.read_text())
    yield {"control": str(control), "conf_dir": str(root / "conf.d")}
    os.kill(daemon, signal.SIGTERM)  # it stops its programs first
    deadline = time.monotonic() + 15
    while is_alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def managed(tmp_path, run_module, supervisord):
    """managed(*extra_arguments, **module_args): the module with manager auto, which finds the
    tests' supervisord through its supervisorctl."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    port = free_port()
    started = []

    def command(*extra_arguments):
        return [sys.executable, str(script), "--port", str(port), *extra_arguments]

    def run(*extra_arguments, **args):
        defaults = dict(
            name="vllm",
            command=command(*extra_arguments),
            pid_file=str(tmp_path / "run" / "vllm.pid"),
            log_file=str(tmp_path / "log" / "vllm.log"),
            supervisorctl=supervisord["control"],
            supervisor_conf_dir=supervisord["conf_dir"],
            start_check_seconds=1,
        )
        outcome = run_module(engine_process, dict(defaults, **args))
        if outcome.result.get("pid"):
            started.append(outcome.result["pid"])
        return outcome

    def retire(**args):
        """engine_retire on the same supervisord."""
        return run_module(engine_retire, dict(supervisorctl=supervisord["control"],
                                              supervisor_conf_dir=supervisord["conf_dir"], **args))

    run.retire = retire
    run.command = command
    run.program_file = Path(supervisord["conf_dir"]) / "biv100-serving-vllm.conf"
    run.pid_file = tmp_path / "run" / "vllm.pid"
    run.control = supervisord["control"]
    yield run
    for pid in started:
        end_process_group(pid)


def supervisor_pid(control):
    return int(subprocess.run([control, "pid", "biv100-serving-vllm"], capture_output=True,
                              text=True, check=False).stdout.strip() or 0)


def test_auto_runs_the_engine_under_a_supervisord_that_answers(managed):
    first = managed("--served-model-name", AWKWARD, env={"ODD": AWKWARD})
    assert not first.failed, first.result.get("msg")
    result = first.result

    assert (result["manager"], result["action"], result["changed"]) == ("supervisord", "start", True)
    assert result["pid"] == supervisor_pid(managed.control) and is_alive(result["pid"])
    assert managed.pid_file.read_text() == "%d\n" % result["pid"]
    assert stat.S_IMODE(managed.program_file.stat().st_mode) == 0o600
    # supervisord read back exactly what was meant: the argv and the awkward value.
    assert result["command"] == managed.command("--served-model-name", AWKWARD)
    assert environ_of(result["pid"])["ODD"] == AWKWARD
    assert os.getpgid(result["pid"]) == result["pid"]  # its workers go with it

    again = managed("--served-model-name", AWKWARD, env={"ODD": AWKWARD}).result
    assert (again["changed"], again["action"], again["pid"], again["drift"]) == (
        False, "none", result["pid"], [])


def test_a_changed_argument_rewrites_the_program_and_restarts_the_engine(managed):
    first = managed("--max-num-seqs", "4").result
    restarted = managed("--max-num-seqs", "2").result

    assert (restarted["changed"], restarted["action"]) == (True, "restart")
    assert restarted["drift"] == [
        "argument --max-num-seqs: running 4, desired 2",
        f"{managed.program_file} differs from the desired one",
    ]
    assert not is_alive(first["pid"]) and restarted["pid"] == supervisor_pid(managed.control)
    assert "--max-num-seqs" in restarted["command"] and "2" in restarted["command"]


def test_stopped_ends_the_supervised_group(managed):
    started = managed().result
    stopped = managed(state="stopped").result

    assert (stopped["changed"], stopped["action"], stopped["running"]) == (True, "stop", False)
    assert group_members(started["pid"]) == [] and supervisor_pid(managed.control) == 0
    assert not managed.pid_file.exists()
    assert managed(state="stopped").result["changed"] is False


def test_a_retired_supervised_engine_leaves_no_program_behind(managed, tmp_path):
    started = managed().result

    retired = managed.retire(name="vllm", pid_dir=str(tmp_path / "run")).result

    assert (retired["changed"], retired["manager"]) == (True, "supervisord")
    assert retired["retired"] == [{"name": "vllm", "manager": "supervisord", "pid": started["pid"],
                                   "action": "retire", "removed": str(managed.program_file)}]
    assert group_members(started["pid"]) == [] and not managed.program_file.exists()
    assert not managed.pid_file.exists() and not managed.pid_file.with_suffix(".json").exists()
    # supervisord forgot the program: nothing it restarts, nothing it lists.
    listed = subprocess.run([managed.control, "status"], capture_output=True, text=True, check=False)
    assert "biv100-serving-vllm" not in listed.stdout
    assert managed.retire(name="vllm", pid_dir=str(tmp_path / "run")).result["changed"] is False


def test_the_launchers_engine_makes_way_for_the_supervised_one(managed):
    launched = managed(manager="pidfile").result
    assert launched["manager"] == "pidfile"

    taken_over = managed().result

    assert (taken_over["manager"], taken_over["action"]) == ("supervisord", "start")
    assert not is_alive(launched["pid"]) and taken_over["pid"] != launched["pid"]
    assert managed.pid_file.read_text() == "%d\n" % taken_over["pid"]


def test_an_engine_that_exits_at_once_fails_with_its_log(managed):
    # A start check (and startsecs) long enough for a loaded machine's slow interpreter start: it
    # ends as the engine exits.
    failed, result = managed("--port", "not-a-number", start_check_seconds=10)

    assert failed and result["msg"].endswith(" in log_tail")
    # argparse's refusal is where the tail starts.
    assert result["log_tail"][0].endswith("error: argument --port: invalid int value: 'not-a-number'")


# --- systemd: what it would be told ----------------------------------------------------------


def test_the_systemd_unit_quotes_what_systemd_would_expand():
    manager = _engine_systemd.SystemdManager(
        dict(name="vllm", cwd="/", env_file="/etc/biv100-serving/engine.env",
             log_file="/var/log/biv100-serving/engine.log", stop_timeout=30, systemctl=None),
        run_command=None)
    unit = manager.definition(
        ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--served-model-name",
         AWKWARD], {}, {"PATH": "/usr/bin", "ODD": AWKWARD})

    assert manager.definition_path == "/etc/systemd/system/biv100-serving-vllm.service"
    assert ('ExecStart="/usr/bin/python3" "-m" "vllm.entrypoints.openai.api_server" '
            '"--served-model-name" "a \\"quoted\\", 100%% $$HOME\\\\value"') in unit.splitlines()
    assert 'Environment="ODD=a \\"quoted\\", 100%% $$HOME\\\\value"' in unit.splitlines()
    assert "EnvironmentFile=/etc/biv100-serving/engine.env" in unit.splitlines()
    assert "Restart=no" in unit and "KillMode=control-group" in unit


def test_auto_takes_systemd_where_it_booted_the_host(tmp_path, monkeypatch, run_module):
    booted = tmp_path / "run-systemd-system"
    booted.mkdir()
    monkeypatch.setattr(_engine_managers, "SYSTEMD_RUNTIME_DIR", str(booted))
    systemctl = tmp_path / "systemctl"
    # Answers only what a check run asks: the service's main pid, none yet.
    systemctl.write_text("#!/bin/sh\n[ \"$1\" = show ] && echo MainPID=0\n")
    systemctl.chmod(0o755)

    check = run_module(engine_process, dict(
        name="vllm", command=["/usr/bin/python3", "-m", "x"], systemctl=str(systemctl),
        pid_file=str(tmp_path / "vllm.pid"), _ansible_check_mode=True)).result

    assert (check["manager"], check["action"], check["changed"]) == ("systemd", "start", True)


def test_systemd_refuses_a_variable_set_in_both_env_and_env_file(tmp_path, monkeypatch, run_module):
    monkeypatch.setattr(_engine_managers, "SYSTEMD_RUNTIME_DIR", str(tmp_path))
    env_file = tmp_path / "engine.env"
    env_file.write_text("CUDA_VISIBLE_DEVICES=0,1\n")
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho MainPID=0\n")
    systemctl.chmod(0o755)

    failed, result = run_module(engine_process, dict(
        name="vllm", command=["/usr/bin/python3"], systemctl=str(systemctl),
        env_file=str(env_file), env={"CUDA_VISIBLE_DEVICES": "2,3"},
        pid_file=str(tmp_path / "vllm.pid")))

    assert failed and "both set CUDA_VISIBLE_DEVICES" in result["msg"]
    assert str(env_file) in result["msg"]


def test_systemd_refuses_a_secret_in_env_which_its_unit_file_would_show(tmp_path, monkeypatch, run_module):
    monkeypatch.setattr(_engine_managers, "SYSTEMD_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(_engine_systemd, "SYSTEMD_UNIT_DIR", str(tmp_path / "units"))
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho MainPID=0\n")
    systemctl.chmod(0o755)

    failed, result = run_module(engine_process, dict(
        name="vllm", command=["/usr/bin/python3"], systemctl=str(systemctl),
        env={"VLLM_API_KEY": "sk-biv100-in-the-unit"}, pid_file=str(tmp_path / "vllm.pid")))

    assert failed and result["msg"].startswith("env sets the secret VLLM_API_KEY")
    assert "sk-biv100-in-the-unit" not in str(result)
    assert not (tmp_path / "units").exists()
