"""gpu_facts against fake ixsmi executables that print what nvidia-smi-like tools print."""

import socket
import stat
import sys
import textwrap
import time

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import Engine, record_pid
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import process_stat
from ansible_collections.biv100.serving.plugins.module_utils._listening_ports import listening_ports
from ansible_collections.biv100.serving.plugins.module_utils._own_engines import pid_files, running_engines
from ansible_collections.biv100.serving.plugins.modules import gpu_facts

UUIDS = ["GPU-%08d-0000-4000-8000-000000000000" % i for i in range(4)]


def fake_ixsmi(tmp_path, gpu_csv, apps_csv=None, apps_rc=0):
    """An executable answering the two queries the module makes, exactly as given."""
    (tmp_path / "gpus.csv").write_text(gpu_csv)
    (tmp_path / "apps.csv").write_text(apps_csv or "")
    script = tmp_path / "ixsmi"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in
          --query-gpu=*) cat {tmp_path}/gpus.csv ;;
          --query-compute-apps=*) cat {tmp_path}/apps.csv; exit {apps_rc} ;;
          *) echo "unexpected arguments: $*" >&2; exit 2 ;;
        esac
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def four_gpus(used=(0, 0, 0, 0)):
    return "".join(
        f"{i}, Iluvatar BI-V100, {UUIDS[i]}, 32768, {used[i]}, 0\n" for i in range(4)
    )


@pytest.fixture
def run(run_module):
    return lambda args: run_module(gpu_facts, args)


def keep_pid_file(pid_file, process, manager="pidfile"):
    """The pid file and launch record engine_process keeps for an engine it started."""
    record_pid(str(pid_file), Engine(process.pid, process_stat(process.pid)), ["engine"], manager)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listener(started_process, port):
    """A process in a session of its own listening on the loopback port, once it listens (which
    may take a loaded machine seconds: the deadline only bounds a failure)."""
    code = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', %d)); s.listen(); time.sleep(60)"
            % port)
    process = started_process([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not any(entry["port"] == port and process.pid in entry["pids"] for entry in listening_ports()):
        assert time.monotonic() < deadline, "the listener did not listen"
        time.sleep(0.02)
    return process


def test_four_idle_gpus_are_all_free(tmp_path, run):
    failed, result = run({"ixsmi_path": fake_ixsmi(tmp_path, four_gpus())})
    assert not failed and result["changed"] is False
    facts = result["ansible_facts"]["gpu_facts"]
    assert facts["count"] == 4
    assert facts["free"] == [0, 1, 2, 3]
    assert facts["gpus"][2] == {
        "index": 2, "name": "Iluvatar BI-V100", "uuid": UUIDS[2], "memory_total_mib": 32768,
        "memory_used_mib": 0, "utilization_pct": 0, "processes": [],
    }
    assert facts["processes_supported"] is True
    assert result["gpu_facts"] == facts


def test_processes_are_attached_to_their_gpu_and_make_it_busy(tmp_path, run):
    apps = f"{UUIDS[1]}, 4242, python3, 30512\n{UUIDS[3]}, 77, /usr/bin/python3, 1024\n"
    ixsmi = fake_ixsmi(tmp_path, four_gpus(used=(0, 30512, 0, 1024)), apps)
    _failed, result = run({"ixsmi_path": ixsmi})
    facts = result["gpu_facts"]
    assert facts["free"] == [0, 2]
    assert facts["gpus"][1]["processes"] == [
        {"gpu_index": 1, "pid": 4242, "name": "python3", "used_memory_mib": 30512, "own": False,
         "instance": None}
    ]
    assert [p["pid"] for p in facts["processes"]] == [4242, 77]


def test_rows_are_sorted_by_index_and_unavailable_values_are_null(tmp_path, run):
    rows = f"1, Iluvatar BI-V100, {UUIDS[1]}, 32768, [N/A], [Not Supported]\n" \
           f"0, Iluvatar BI-V100, {UUIDS[0]}, 32768, 12, 3\n"
    _failed, result = run({"ixsmi_path": fake_ixsmi(tmp_path, rows)})
    gpus = result["gpu_facts"]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[1]["memory_used_mib"] is None and gpus[1]["utilization_pct"] is None


def test_an_ixsmi_without_process_query_leaves_every_gpu_free(tmp_path, run):
    ixsmi = fake_ixsmi(tmp_path, four_gpus(), 'Field "gpu_uuid" is not a valid field\n', apps_rc=2)
    _failed, result = run({"ixsmi_path": ixsmi})
    assert result["gpu_facts"]["processes_supported"] is False
    assert result["gpu_facts"]["free"] == [0, 1, 2, 3]


def test_no_running_processes_in_words_is_no_process(tmp_path, run):
    ixsmi = fake_ixsmi(tmp_path, four_gpus(), "No running processes found\n")
    _failed, result = run({"ixsmi_path": ixsmi})
    assert result["gpu_facts"]["processes"] == []


def test_missing_ixsmi_names_every_path_tried(tmp_path, run):
    missing = [str(tmp_path / "a" / "ixsmi"), str(tmp_path / "b" / "ixsmi")]
    failed, result = run({"search_paths": missing})
    assert failed
    assert "ixsmi not found" in result["msg"]
    for path in missing:
        assert path in result["msg"]


def test_an_explicit_path_is_the_only_one_tried(tmp_path, run):
    failed, result = run({"ixsmi_path": str(tmp_path / "nope")})
    assert failed
    assert result["tried"] == [str(tmp_path / "nope")]


def test_garbled_output_fails_with_the_offending_value(tmp_path, run):
    rows = f"0, Iluvatar BI-V100, {UUIDS[0]}, lots, 0, 0\n"
    failed, result = run({"ixsmi_path": fake_ixsmi(tmp_path, rows)})
    assert failed and "'lots' is not a number" in result["msg"]


def test_a_row_with_missing_fields_fails(tmp_path, run):
    failed, result = run({"ixsmi_path": fake_ixsmi(tmp_path, "0, Iluvatar BI-V100\n")})
    assert failed and "expected 6 fields" in result["msg"]


def test_the_collections_own_engine_does_not_make_its_gpus_busy(tmp_path, run, started_process):
    # A process in a session (and process group) of its own, as engine_process starts the engine.
    engine = started_process(["sleep", "60"])
    pid_file = tmp_path / "vllm.pid"
    keep_pid_file(pid_file, engine)
    apps = f"{UUIDS[1]}, {engine.pid}, python3, 30512\n{UUIDS[3]}, 1, foreign, 1024\n"
    ixsmi = fake_ixsmi(tmp_path, four_gpus(used=(0, 30512, 0, 1024)), apps)
    failed, result = run({"ixsmi_path": ixsmi, "own_pid_file": str(pid_file)})
    facts = result["gpu_facts"]
    assert not failed and facts["free"] == [0, 1, 2]
    assert [(p["pid"], p["own"], p["instance"]) for p in facts["processes"]] == [
        (engine.pid, True, "vllm"), (1, False, None)]


def test_each_instance_of_the_collections_engines_is_told_from_the_others_and_from_foreign_holders(
        tmp_path, run, started_process):
    first, second = started_process(["sleep", "60"]), started_process(["sleep", "61"])
    pid_files = []
    for name, engine in (("vllm-1", first), ("vllm-2", second)):
        pid_files.append(str(tmp_path / f"{name}.pid"))
        keep_pid_file(pid_files[-1], engine)
    apps = (f"{UUIDS[0]}, {first.pid}, python3, 30512\n{UUIDS[2]}, {second.pid}, python3, 30512\n"
            f"{UUIDS[3]}, 1, foreign, 1024\n")
    ixsmi = fake_ixsmi(tmp_path, four_gpus(used=(30512, 0, 30512, 1024)), apps)

    failed, result = run({"ixsmi_path": ixsmi, "own_pid_files": pid_files})

    facts = result["gpu_facts"]
    assert not failed and facts["free"] == [0, 1, 2]
    assert [(p["gpu_index"], p["instance"]) for p in facts["processes"]] == [(0, "vllm-1"), (2, "vllm-2"), (3, None)]


def test_a_pid_file_of_an_ended_engine_claims_nothing(tmp_path, run):
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text("999999999\n")
    ixsmi = fake_ixsmi(tmp_path, four_gpus(), f"{UUIDS[0]}, 999999999, python3, 1\n")
    _failed, result = run({"ixsmi_path": ixsmi, "own_pid_file": str(pid_file)})
    assert result["gpu_facts"]["free"] == [1, 2, 3]


def test_without_pid_files_every_engine_of_the_collections_pid_folder_is_its_own(tmp_path, started_process, monkeypatch):
    # An engine the inventory no longer names is still the collection's: its pid file is there.
    engine = started_process(["sleep", "60"])
    keep_pid_file(tmp_path / "renamed.pid", engine)
    (tmp_path / "not-a-pid-file.txt").write_text("1\n")
    (tmp_path / "link.pid").symlink_to(tmp_path / "renamed.pid")
    (tmp_path / "folder.pid").mkdir()
    monkeypatch.setattr(gpu_facts, "pid_files", lambda: pid_files(str(tmp_path)))
    assert gpu_facts.own_pid_files(None) == [str(tmp_path / "renamed.pid")]
    assert gpu_facts.own_pid_files(["/given.pid"]) == ["/given.pid"]
    assert pid_files(str(tmp_path / "absent")) == []
    engines = running_engines(gpu_facts.own_pid_files(None), [])
    assert list(gpu_facts.engine_groups(engines).values()) == ["renamed"]


def test_a_pid_file_without_its_launch_record_or_naming_a_reused_pid_claims_nothing(tmp_path, run, started_process):
    # A pid file engine_process did not write, and one whose record has another start time (the
    # pid now belongs to another process): neither names an engine of the collection's.
    unrecorded, reused = started_process(["sleep", "60"]), started_process(["sleep", "61"])
    (tmp_path / "hand.pid").write_text(f"{unrecorded.pid}\n")
    keep_pid_file(tmp_path / "old.pid", reused)
    record = tmp_path / "old.json"
    record.write_text(record.read_text().replace('"start_ticks": ', '"start_ticks": 1'))
    apps = f"{UUIDS[0]}, {unrecorded.pid}, python3, 1\n{UUIDS[1]}, {reused.pid}, python3, 1\n"
    _failed, result = run({"ixsmi_path": fake_ixsmi(tmp_path, four_gpus(), apps),
                           "own_pid_files": [str(tmp_path / "hand.pid"), str(tmp_path / "old.pid")]})
    facts = result["gpu_facts"]
    assert facts["free"] == [2, 3] and facts["engines"] == []


def test_the_collections_engines_are_listed_with_their_manager_ports_and_gpus(
        tmp_path, run, started_process, monkeypatch):
    own_port, foreign_port = free_port(), free_port()
    # The engine sees GPU 2 by its UUID and GPU 1 by its index, as CUDA_VISIBLE_DEVICES allows.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUIDS[2]},1")
    engine = listener(started_process, own_port)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    foreign = listener(started_process, foreign_port)
    keep_pid_file(tmp_path / "vllm-2.pid", engine, manager="supervisord")

    _failed, result = run({"ixsmi_path": fake_ixsmi(tmp_path, four_gpus()),
                           "own_pid_files": [str(tmp_path / "vllm-2.pid")]})

    facts = result["gpu_facts"]
    (listed,) = facts["engines"]
    assert {key: listed[key] for key in ("name", "pid", "manager", "ports", "gpus", "visible_devices")} == {
        "name": "vllm-2", "pid": engine.pid, "manager": "supervisord", "ports": [own_port], "gpus": [2, 1],
        "visible_devices": f"{UUIDS[2]},1"}
    ports = dict((entry["port"], entry) for entry in facts["ports"])
    assert (ports[own_port]["own"], ports[own_port]["instance"]) == (True, "vllm-2")
    assert ports[foreign_port] == {
        "port": foreign_port, "address": "127.0.0.1", "pid": foreign.pid, "own": False, "instance": None,
        "command": " ".join(foreign.args)}
