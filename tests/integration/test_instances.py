"""Several engine instances on one host, on a mixed lab fleet: the first host has 4 GPUs and
runs one engine as always; the second has 8 and runs two TP=4 instances, vllm-1 and vllm-2. The
fleet deploys, verifies, rolls back and deploys again with every instance named; a deploy
restarts the second host's instances one at a time, so that /health, polled every 100 ms, always
has one to answer, and a deploy in which vllm-2 alone fails rolls the host back with one always
answering too. gpu_facts finds each instance's engine on its GPUs (the lab's ixsmi reports the
running stand-ins) and tells it from a foreign process.

The module's fixtures make the state the tests start from: the first deploy, and the rolling
deploy of a second release that the rollback goes back from.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from engine_defaults import SUB168
from lab_files import STATE, copy_payload, current_release, engine_process, option_values, overlay, recorded
from lab_guard import built_lab
from playbook_runs import ONE_BATCH, run_playbook, start_playbook

import ixsmi


pytestmark = pytest.mark.lab

DEPLOY = "deploy.yml"
FACTS = "playbooks/facts.yml"
GPU_FACTS_TASK = "Learn the host's GPUs"
SUMMARY_TASK = "Show what the host has"
GPU_MIB = 32768  # each lab GPU's memory
INSTANCES = ({"name": "vllm-1"}, {"name": "vllm-2"})


def on_eight(lab, instances=INSTANCES) -> dict:
    """engine_instances for the eight-GPU host only, as its host_vars would give them (extra
    variables are templated per host)."""
    return {"engine_instances": "{{ %s if inventory_hostname == '%s' else [] }}" % (
        json.dumps(instances), lab.hosts[1].name)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from built_lab(tmp_path_factory, n_hosts=2, gpus={"h2": 8})


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    """The first deploy's run, and the ledger lines it wrote."""
    folder = tmp_path_factory.mktemp("first")
    run = run_playbook(DEPLOY, lab.inventory_path, folder,
                       extravars={"serving_release": "sub510", **on_eight(lab), **ONE_BATCH})
    assert run.rc == 0, run.stdout()[-3000:]
    ledger = folder / "ledger" / "ledger.jsonl"
    return {"run": run, "ledger": [json.loads(line) for line in ledger.read_text().splitlines()]}


def instance_pid(host, name: str) -> int:
    return int(host.path(f"/run/biv100-serving/{name}.pid").read_text())


def healthy(host, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host.ip}:{port}/health", timeout=0.5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_the_eight_gpu_host_runs_two_instances_on_their_own_gpus_ports_and_files(lab, deployed):
    eight = lab.hosts[1]
    for name, port, gpus in (("vllm-1", "8000", "0,1,2,3"), ("vllm-2", "8001", "4,5,6,7")):
        argv, environ = engine_process(eight, name)
        assert option_values(argv)["--port"] == port and environ["CUDA_VISIBLE_DEVICES"] == gpus, name
        assert eight.path(f"/etc/biv100-serving/{name}.env").is_file()
        assert healthy(eight, int(port))
    # The 4-GPU host runs its one engine under the role's own name, port, files and GPUs.
    argv, environ = engine_process(lab.hosts[0])
    assert option_values(argv)["--port"] == "8000" and environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert lab.hosts[0].path("/etc/biv100-serving/engine.env").is_file()
    record = current_release(eight)
    assert record["status"] == "good" and sorted(record["engine"]["instances"]) == ["vllm-1", "vllm-2"]
    assert "args" in recorded(current_release(lab.hosts[0]), "engine")


def test_every_instance_is_named_in_the_output_and_the_ledger(lab, deployed):
    one, eight = lab.hosts[0].name, lab.hosts[1].name
    shown = deployed["run"].stdout().split("RELEASES", 1)[1]
    for name in (f"{one}: sub510 good", f"{eight}/vllm-1: sub510 good", f"{eight}/vllm-2: sub510 good"):
        assert name in shown
    lines = deployed["ledger"]
    assert sorted(line["host"] for line in lines) == [one, f"{eight}/vllm-1", f"{eight}/vllm-2"]
    ports = {line["host"]: option_values(line["engine_args"])["--port"] for line in lines}
    assert ports == {one: "8000", f"{eight}/vllm-1": "8000", f"{eight}/vllm-2": "8001"}


def test_a_second_run_changes_nothing(lab, deployed, tmp_path):
    again = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={**on_eight(lab), **ONE_BATCH})
    assert again.rc == 0 and again.hosts_with("changed") == set(), again.stats


def deploy_polling_health(lab, folder, release: str, instances=INSTANCES):
    """A deploy of `release` (the payload with one more file) to the eight-GPU host, with
    /health of both instances polled every 100 ms meanwhile: the run, and the polls as (time,
    vllm-1 healthy, vllm-2 healthy)."""
    eight = lab.hosts[1]
    payload = copy_payload(folder)
    overlay(payload, release, f"reasoning/{release}_parser.py", f"PARSER = '{release}'\n")
    samples: list[tuple[float, bool, bool]] = []
    done = threading.Event()

    def poll():
        while not done.is_set():
            samples.append((time.monotonic(), healthy(eight, 8000), healthy(eight, 8001)))
            time.sleep(0.1)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        running = start_playbook(DEPLOY, lab.inventory_path, folder, limit=eight.name, extravars={
            "serving_release": release, "stage_payload_dir": str(payload), **on_eight(lab, instances)})
        run = running.wait()
    finally:
        done.set()
        poller.join()
    return run, samples


def never_both_down(samples) -> None:
    down = [at for at, first, second in samples if not (first or second)]
    assert len(samples) > 20 and down == [], f"{len(down)} of {len(samples)} polls found no instance healthy"


@pytest.fixture(scope="module")
def rolled(lab, deployed, tmp_path_factory):
    """A deploy of release sub511 to the eight-GPU host, with /health of both instances polled
    every 100 ms meanwhile: the run, the polls, and the instances' pids before it."""
    eight = lab.hosts[1]
    pids = {name: instance_pid(eight, name) for name in ("vllm-1", "vllm-2")}
    run, samples = deploy_polling_health(lab, tmp_path_factory.mktemp("rolling"), "sub511")
    assert run.rc == 0, run.stdout()[-3000:]
    return {"run": run, "samples": samples, "pids_before": pids}


def test_a_deploy_restarts_the_instances_one_at_a_time_and_one_always_answers(lab, rolled):
    eight = lab.hosts[1]
    # Both restarted on the new release (or the test proved nothing)...
    assert all(instance_pid(eight, name) != pid for name, pid in rolled["pids_before"].items())
    assert current_release(eight)["id"] == "sub511"
    # ...and at no moment was neither answering.
    samples = rolled["samples"]
    never_both_down(samples)
    assert any(not first for _at, first, _second in samples) and any(not second for _at, _first, second in samples)


def test_gpu_facts_show_each_instances_engine_on_its_gpus_as_the_collections_own(lab, deployed, tmp_path):
    one, eight = lab.hosts
    # What the lab's ixsmi reports for each GPU a stand-in holds: its gpu_memory_utilization of the GPU.
    held_mib = int(SUB168["gpu_memory_utilization"] * GPU_MIB)
    run = run_playbook(FACTS, lab.inventory_path, tmp_path / "own", extravars=on_eight(lab))
    assert run.rc == 0, run.stdout()[-3000:]
    for host, groups in ((one, {"vllm": range(4)}), (eight, {"vllm-1": range(4), "vllm-2": range(4, 8)})):
        (result,) = run.results(host.name, GPU_FACTS_TASK)
        facts = result["gpu_facts"]
        processes = {(process["gpu_index"], process["pid"], process["instance"], process["own"], process["used_memory_mib"])
                     for process in facts["processes"]}
        assert processes == {(index, instance_pid(host, name), name, True, held_mib)
                             for name, group in groups.items() for index in group}, host.name
        assert [gpu["memory_used_mib"] for gpu in facts["gpus"]] == [held_mib] * len(facts["gpus"])
        # The collection's own engines leave their GPUs available to it.
        assert facts["free"] == list(range(host.gpu_count))
        (summary,) = run.results(host.name, SUMMARY_TASK)
        assert summary["msg"][4].endswith(f"free: {host.gpu_count}")

    # A process the collection did not start (from ixsmi's file) makes its GPU busy.
    config = eight.path(f"/usr/local/corex/{ixsmi.CONFIG_NAME}")
    original = config.read_text()
    foreign = json.loads(original)
    foreign["compute_processes"] = [{"gpu_uuid": foreign["gpus"][5]["uuid"], "pid": 4242, "process_name": "train.py",
                                     "used_memory_mib": 1024}]
    config.write_text(json.dumps(foreign))
    try:
        busy = run_playbook(FACTS, lab.inventory_path, tmp_path / "foreign", limit=eight.name, extravars=on_eight(lab))
    finally:
        config.write_text(original)
    (result,) = busy.results(eight.name, GPU_FACTS_TASK)
    assert result["gpu_facts"]["free"] == [0, 1, 2, 3, 4, 6, 7]
    assert busy.rc != 0 and any("GPU 5 by pid 4242 (train.py)" in text for text in busy.failure_messages(eight.name))


def test_verify_names_the_instance_that_is_down_and_finds_the_rest_healthy(lab, deployed, tmp_path):
    eight = lab.hosts[1]
    # The engine runs in a process group of its own (engine_process starts it so).
    os.killpg(instance_pid(eight, "vllm-2"), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while healthy(eight, 8001) and time.monotonic() < deadline:
        time.sleep(0.1)

    found = run_playbook("verify.yml", lab.inventory_path, tmp_path, extravars=on_eight(lab))

    assert found.rc != 0 and found.hosts_with("failures") == {eight.name}
    # The findings, as the failed task lists them: the stopped instance's only.
    assert "'vllm-2: engine: not running'" in found.stdout()
    assert "'vllm-1: " not in found.stdout()


def test_rollback_restores_every_instance_and_a_deploy_brings_a_release_back(lab, rolled, tmp_path):
    eight = lab.hosts[1]
    back = run_playbook("rollback.yml", lab.inventory_path, tmp_path / "back", limit=eight.name,
                        extravars=on_eight(lab))
    assert back.rc == 0, back.stdout()[-3000:]
    assert current_release(eight)["id"] == "sub510"
    assert healthy(eight, 8000) and healthy(eight, 8001)
    shown = back.stdout().split("RELEASES", 1)[1]
    assert f"{eight.name}/vllm-1: sub510 rolled back" in shown and f"{eight.name}/vllm-2: sub510 rolled back" in shown

    payload = copy_payload(tmp_path)
    overlay(payload, "again", "reasoning/again_parser.py", "PARSER = 'again'\n")
    again = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "again", limit=eight.name, extravars={
        "serving_release": "sub512", "stage_payload_dir": str(payload), **on_eight(lab)})
    assert again.rc == 0, again.stdout()[-3000:]
    record = current_release(eight)
    assert record["id"] == "sub512" and record["status"] == "good"
    assert record["history"][-1]["reason"].startswith("vllm-1: ") and "; vllm-2: " in record["history"][-1]["reason"]


def test_instances_that_cannot_share_the_host_are_refused_naming_them_and_nothing_changes(lab, deployed, tmp_path):
    eight = lab.hosts[1]
    before = current_release(eight)["id"]
    clash = [{"name": "vllm-1", "gpus": [0, 1, 2, 3]}, {"name": "vllm-2", "gpus": [3, 4, 5, 6], "port": 8000}]
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=eight.name, extravars={
        "serving_release": "sub599", **on_eight(lab, clash)})
    assert run.rc != 0
    output = run.stdout()
    assert f"{eight.name}/vllm-2: port 8000 is also {eight.name}/vllm-1's" in output
    assert f"{eight.name}/vllm-2: GPU 3 also in {eight.name}/vllm-1's group" in output
    assert current_release(eight)["id"] == before
    assert not eight.path(f"{STATE}/releases/sub599").exists()


def test_one_instance_failing_rolls_the_host_back_while_the_other_keeps_serving(lab, deployed, tmp_path):
    eight = lab.hosts[1]
    last_good = current_release(eight)
    assert last_good["status"] == "good"
    # vllm-2 alone dies after its third chat answer: healthy, then gone in the middle of its probes.
    failing = (INSTANCES[0], {**INSTANCES[1], "engine_env": {"BIV100_STANDIN_CRASH_AFTER": "3"}})

    run, samples = deploy_polling_health(lab, tmp_path, "sub513", failing)

    assert run.rc != 0 and run.hosts_with("failures") == {eight.name}
    message = run.failure_messages(eight.name)[-1]
    assert message.startswith(f"{eight.name}/vllm-2: the probes phase failed"), message
    assert f"rolled back to {last_good['id']}, engine healthy" in message
    ledger = [json.loads(line) for line in (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()]
    (line,) = [line for line in ledger if line["host"] == f"{eight.name}/vllm-2"]
    assert line["failure"] and line["rollback"]["to"] == last_good["id"], line
    # The host is back on its last good release, both instances serving with its settings...
    assert current_release(eight)["id"] == last_good["id"]
    assert json.loads(eight.path(f"{STATE}/releases/sub513/release.json").read_text())["status"] == "failed"
    assert healthy(eight, 8000) and healthy(eight, 8001)
    assert "BIV100_STANDIN_CRASH_AFTER" not in engine_process(eight, "vllm-2")[1]
    # ...and at no moment of the deploy and its rollback was neither answering.
    never_both_down(samples)
    # vllm-2 was down meanwhile, so vllm-1 answered alone.
    assert any(first and not second for _at, first, second in samples)
