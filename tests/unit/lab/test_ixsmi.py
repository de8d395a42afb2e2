"""The lab's ixsmi: the GPUs and compute processes of its file, and the running engine stand-ins
of its host on the GPUs of their CUDA_VISIBLE_DEVICES, as the real tool lists an engine's
workers."""

import json
import subprocess

import pytest

import ixsmi
from standin_engines import ENGINE_FLAGS, Engine, make_host

APPS = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
MEMORY = "--query-gpu=index,memory.used,memory.free"
NO_HEADER = "--format=csv,noheader,nounits"
TOTAL_MIB = 32768


@pytest.fixture
def host(tmp_path, base_vllm):
    """A host folder of eight GPUs, its ixsmi, and the stand-ins started on it (stopped after)."""
    root = make_host(tmp_path / "host", base_vllm, gpus=8)
    engines = []

    def start(flags, env=None):
        engine = Engine(root, flags, env)
        engines.append(engine)
        return engine.wait_started()

    yield root, start
    for engine in engines:
        engine.stop()


def run(root, *options) -> str:
    return subprocess.run([str(root / "corex" / "bin" / "ixsmi"), *options],
                          capture_output=True, text=True, check=True).stdout


def ask(root, *options):
    """The CSV rows of a query, as lists of cells."""
    return [line.split(", ") for line in run(root, *options).splitlines()]


def apps(root):
    return [(uuid, int(pid), int(memory)) for uuid, pid, _name, memory in ask(root, APPS, NO_HEADER)]


def test_a_running_standin_holds_its_visible_gpus_with_its_share_of_memory(host):
    root, start = host
    engine = start(ENGINE_FLAGS + ["--gpu-memory-utilization", "0.5"], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    half = TOTAL_MIB // 2
    assert apps(root) == [(f"GPU-{index}", engine.process.pid, half) for index in (4, 5, 6, 7)]
    assert ask(root, MEMORY, NO_HEADER) == (
        [[str(index), "0", str(TOTAL_MIB)] for index in range(4)]
        + [[str(index), str(half), str(half)] for index in range(4, 8)])
    names = {name for _uuid, _pid, name, _memory in ask(root, APPS, NO_HEADER)}
    assert names == {engine.process.args[0]}
    assert str(engine.process.pid) in run(root)  # the status table

    engine.stop()
    assert apps(root) == []
    assert ask(root, MEMORY, NO_HEADER) == [[str(index), "0", str(TOTAL_MIB)] for index in range(8)]


def test_the_first_tensor_parallel_size_visible_gpus_in_their_order_with_vllms_default_memory(host):
    root, start = host
    # -tp 4 of six visible GPUs, named out of order: the first four as listed.
    engine = start(ENGINE_FLAGS, {"CUDA_VISIBLE_DEVICES": "7,1,2,3,0,4"})
    share = int(ixsmi.DEFAULT_MEMORY_UTILIZATION * TOTAL_MIB)
    assert apps(root) == [(f"GPU-{index}", engine.process.pid, share) for index in (7, 1, 2, 3)]


def test_the_files_processes_stay_and_memory_used_adds_up_to_the_total_at_most(host):
    root, start = host
    config_path = root / "corex" / ixsmi.CONFIG_NAME
    config = json.loads(config_path.read_text())
    config["gpus"][0]["memory_used_mib"] = 4096
    config["gpus"][1]["memory_used_mib"] = 30000
    config["compute_processes"] = [{"gpu_uuid": "GPU-1", "pid": 4242, "process_name": "python3",
                                    "used_memory_mib": 30000}]
    config_path.write_text(json.dumps(config))
    # No CUDA_VISIBLE_DEVICES: the first GPUs of the host. Three quarters of a GPU hold half the
    # model's weights and a KV cache beside them.
    engine = start(ENGINE_FLAGS + ["--tensor-parallel-size=2", "--gpu_memory_utilization=0.75"])
    share = TOTAL_MIB * 3 // 4
    assert apps(root) == [("GPU-1", 4242, 30000)] + [(f"GPU-{index}", engine.process.pid, share) for index in (0, 1)]
    used = {int(index): int(memory) for index, memory, _free in ask(root, MEMORY, NO_HEADER)}
    assert (used[0], used[1], used[2]) == (4096 + share, TOTAL_MIB, 0)


def test_a_standin_of_another_host_is_not_this_hosts(host, tmp_path, base_vllm):
    root, start = host
    other = make_host(tmp_path / "other", base_vllm, gpus=8)
    elsewhere = Engine(other, ENGINE_FLAGS, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    try:
        elsewhere.wait_started()
        here = start(ENGINE_FLAGS, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
        assert {pid for _uuid, pid, _memory in apps(root)} == {here.process.pid}
        assert {pid for _uuid, pid, _memory in apps(other)} == {elsewhere.process.pid}
    finally:
        elsewhere.stop()


@pytest.mark.parametrize("devices, expected", [
    ("0,1", [0, 1]),
    ("GPU-2,3", [2, 3]),       # a UUID, then an index
    ("1,9,2", [1]),            # 9 names no GPU: it and every entry after it are hidden
    ("1,1,2", [1]),            # a GPU named twice is invalid from there on
    ("", []),
])
def test_cuda_visible_devices_as_cuda_reads_it(devices, expected):
    gpus = [{"index": index, "uuid": f"GPU-{index}"} for index in range(4)]
    assert [gpu["index"] for gpu in ixsmi.visible_gpus(devices, gpus)] == expected
