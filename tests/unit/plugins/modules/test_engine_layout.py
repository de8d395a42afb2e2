"""Keeping a host to its engine layout: engine_process's start makes way by stopping the
collection's other engines that hold its port or its GPUs (retiring those the layout does not
name), and engine_retire retires engines, by name or all those a layout does not name.
Real engines (the HTTP stand-in of test_engine_process) on real ports; the systemd case is told
what systemctl would be asked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.module_utils import _engine_systemd
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import group_members, is_alive
from ansible_collections.biv100.serving.plugins.modules import engine_process, engine_retire

from test_engine_process import SERVER, end_process_group, free_port, wait_for_log_line

GPUS = {"vllm": "0,1,2,3", "vllm-1": "0,1,2,3", "vllm-2": "4,5,6,7"}


@pytest.fixture
def host(tmp_path, run_module):
    """host(name, port=..., **module_args) runs the module for the engine `name` of a host whose
    pid folder is tmp_path/run, on the port given (each engine's own by default) and the GPUs of
    GPUS; host.absent(**module_args) runs engine_retire. Every engine started is killed at
    teardown."""
    server_script = tmp_path / "server.py"
    server_script.write_text(SERVER)
    ports = {}
    started = []

    def run(name, port=None, **args):
        ports.setdefault(name, free_port())
        port = port or ports[name]
        defaults = dict(
            name=name,
            manager="pidfile",
            command=[sys.executable, str(server_script), "--port", str(port)],
            env={"CUDA_VISIBLE_DEVICES": GPUS.get(name, "")},
            port=port,
            pid_dir=str(tmp_path / "run"),
            log_file=str(tmp_path / "log" / (name + ".log")),
            start_check_seconds=0.3,
        )
        outcome = run_module(engine_process, dict(defaults, **args))
        if outcome.result.get("pid"):
            started.append(outcome.result["pid"])
            wait_for_log_line(tmp_path / "log" / (name + ".log"), "serving on port")
        return outcome

    def absent(**args):
        """engine_retire, as the layout's last step or for one engine by name."""
        return run_module(engine_retire, dict(manager="pidfile", pid_dir=str(tmp_path / "run"), **args))

    run.ports = ports
    run.pid_dir = tmp_path / "run"
    run.absent = absent
    yield run
    for pid in started:
        end_process_group(pid)


def test_a_start_retires_the_engine_on_its_port_and_gpus_and_leaves_the_others_serving(host):
    old = host("vllm").result
    second = host("vllm-2").result

    # vllm-1 takes vllm's port and GPUs: vllm, which the layout no longer names, goes first.
    first = host("vllm-1", port=host.ports["vllm"], layout=["vllm-1", "vllm-2"], _ansible_diff=True)

    assert not first.failed, first.result["msg"]
    result = first.result
    assert (result["changed"], result["action"]) == (True, "start")
    assert result["retired"] == [{"name": "vllm", "manager": "pidfile", "pid": old["pid"], "action": "retire",
                                  "removed": None, "held": ["port %d" % host.ports["vllm"], "GPU 0,1,2,3"]}]
    assert result["msg"] == ("vllm-1 was started by pidfile; to make way, retired vllm (pid %d, pidfile), "
                             "which held port %d, GPU 0,1,2,3" % (old["pid"], host.ports["vllm"]))
    assert result["diff"]["after"]["others"] == {"vllm": "retired"}
    assert group_members(old["pid"]) == [] and sorted(path.name for path in host.pid_dir.iterdir()) == [
        "vllm-1.json", "vllm-1.pid", "vllm-2.json", "vllm-2.pid"]
    # vllm-2 holds nothing vllm-1 needs: it kept serving, untouched.
    assert is_alive(second["pid"])

    again = host("vllm-1", port=host.ports["vllm"], layout=["vllm-1", "vllm-2"]).result
    assert (again["changed"], again["retired"]) == (False, [])


def test_an_engine_of_the_layout_in_the_way_is_stopped_and_started_again_at_its_turn(host):
    second = host("vllm-2").result

    # vllm-1 is given GPUs vllm-2 sees; vllm-2, which the layout names, is stopped to make way.
    first = host("vllm-1", env={"CUDA_VISIBLE_DEVICES": "2,3,4,5"}, layout=["vllm-1", "vllm-2"]).result
    assert [(done["name"], done["action"], done["held"]) for done in first["retired"]] == [
        ("vllm-2", "stop", ["GPU 4,5"])]
    assert not is_alive(second["pid"])

    again = host("vllm-2", env={"CUDA_VISIBLE_DEVICES": "6,7"}, layout=["vllm-1", "vllm-2"]).result
    assert (again["action"], again["retired"]) == ("start", [])


def test_check_mode_names_the_engines_in_the_way_and_stops_none(host):
    old = host("vllm").result

    check = host("vllm-1", port=host.ports["vllm"], layout=["vllm-1"], _ansible_check_mode=True).result

    assert (check["changed"], check["action"]) == (True, "start")
    assert [(done["name"], done["pid"]) for done in check["retired"]] == [("vllm", old["pid"])]
    assert "to make way, would retire vllm (pid %d, pidfile)" % old["pid"] in check["msg"]
    assert is_alive(old["pid"]) and (host.pid_dir / "vllm.pid").exists()


def test_without_a_layout_a_start_stops_nothing(host):
    old = host("vllm").result
    # The port is taken: the new engine fails on it, and vllm keeps serving. The start check is
    # long enough for a loaded machine's slow interpreter start; it ends as the engine exits.
    failed, result = host("vllm-1", port=host.ports["vllm"], start_check_seconds=10)
    assert failed and is_alive(old["pid"]) and result.get("retired") is None


def test_a_layout_that_does_not_name_the_engine_is_refused(host):
    failed, result = host("vllm-1", layout=["vllm-2"])
    assert failed and result["msg"] == "layout vllm-2 does not name vllm-1, the engine to run"
    assert not host.pid_dir.exists()


def test_retire_takes_every_engine_the_layout_does_not_name_then_changes_nothing(host):
    old, kept = host("vllm").result, host("vllm-1", port=None).result
    # A pid file left by an engine that ended: a trace, retired without it being a change.
    (host.pid_dir / "gone.pid").write_text("999999999\n")

    check = host.absent(layout=["vllm-1"], _ansible_check_mode=True).result
    assert check["changed"] and is_alive(old["pid"])

    retired = host.absent(layout=["vllm-1"], _ansible_diff=True).result

    assert (retired["changed"], retired["action"], retired["name"]) == (True, "retire", None)
    assert [(done["name"], done["pid"]) for done in retired["retired"]] == [("vllm", old["pid"])]
    assert retired["msg"] == "retired vllm (pid %d, pidfile); kept vllm-1" % old["pid"]
    assert retired["diff"] == {"before": {"engines": ["vllm", "vllm-1"]}, "after": {"engines": ["vllm-1"]}}
    assert group_members(old["pid"]) == [] and is_alive(kept["pid"])
    assert sorted(path.name for path in host.pid_dir.iterdir()) == ["vllm-1.json", "vllm-1.pid"]

    again = host.absent(layout=["vllm-1"]).result
    assert (again["changed"], again["retired"], again["msg"]) == (False, [], "nothing to retire; kept vllm-1")


def test_retire_by_name_takes_that_engine_and_no_layout(host):
    old = host("vllm").result

    gone = host.absent(name="vllm").result
    assert (gone["changed"], gone["name"], gone["retired"][0]["pid"]) == (True, "vllm", old["pid"])
    assert not is_alive(old["pid"]) and not (host.pid_dir / "vllm.json").exists()
    assert host.absent(name="vllm").result["changed"] is False

    failed, result = host.absent(name="vllm", layout=["vllm-1"])
    assert failed and "mutually exclusive: name|layout" in result["msg"]


def test_a_retired_systemd_engine_leaves_no_unit(tmp_path, monkeypatch, run_module):
    """An engine known by its unit alone (not running, no pid file): its unit is disabled and
    removed, and systemd told."""
    units = tmp_path / "units"
    units.mkdir()
    monkeypatch.setattr(_engine_systemd, "SYSTEMD_UNIT_DIR", str(units))
    (units / "biv100-serving-old.service").write_text("[Service]\n")
    (units / "biv100-serving-vllm-1.service").write_text("[Service]\n")
    (units / "other.service").write_text("[Service]\n")
    calls = tmp_path / "calls"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = show ] && echo MainPID=0\nexit 0\n')
    systemctl.chmod(0o755)

    result = run_module(engine_retire, dict(
        layout=["vllm-1"], manager="systemd", systemctl=str(systemctl),
        pid_dir=str(tmp_path / "run"))).result

    assert (result["changed"], result["manager"]) == (True, "systemd")
    assert result["retired"] == [{"name": "old", "manager": "systemd", "pid": None, "action": "retire",
                                  "removed": str(units / "biv100-serving-old.service")}]
    assert sorted(path.name for path in units.iterdir()) == ["biv100-serving-vllm-1.service", "other.service"]
    assert Path(calls).read_text().splitlines() == [
        "show --property=MainPID biv100-serving-old.service", "disable biv100-serving-old.service", "daemon-reload"]
