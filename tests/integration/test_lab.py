"""The lab itself: hosts reachable with strict host key checking, private paths, the vendor's
Python and vLLM per variant, ixsmi, a second lab beside it that neither reaches, and a down that
leaves the machine as it found it.

These tests build their own 3-host lab in pytest's temporary folder under the process's module
lab id (lab_guard) and take it down at the end; they refuse to run (an error at setup, naming
the lab dir) while a lab of that id built elsewhere is up. Other labs, such as the default one
or another pytest-xdist worker's, may be up meanwhile.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_guard import (built_lab, claimed_lab_dir, module_lab_id, refuse_unless_the_lab_can_be_built,
                       second_lab_id)

import host_tree
import ixsmi
import lab as testlab
import vllm_sources

PRIVATE_PATHS = (*host_tree.PRIVATE_MOUNTS, "/run")
GPU_COUNTS = {"h2": 2}  # h1 and h3 keep the default 4


def machine_state() -> dict:
    """What labs may change on the machine and must restore."""
    return {
        "mountinfo": Path("/proc/self/mountinfo").read_text(),
        "netns": subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout,
        "routes": subprocess.run(["ip", "route"], capture_output=True, text=True, check=False).stdout,
        "links": sorted(os.listdir("/sys/class/net")),
        "mount_points": {path: os.path.exists(path) for path in host_tree.PRIVATE_MOUNTS},
        "run": sorted(os.listdir("/run")),
        "inventory": testlab.INVENTORY_PATH.exists(),
    }


def footprint(lab_id: testlab.LabId, lab_dir: Path) -> dict:
    """What lab `lab_id` built in `lab_dir` has on the machine: its down must leave none of it."""
    host_names = [lab_id.host_name(index) for index in range(1, testlab.MAX_HOSTS + 1)]
    return {
        "netns": [name for name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                  check=False).stdout.split() if name in host_names],
        "links": sorted({lab_id.bridge, *map(lab_id.veth, range(1, testlab.MAX_HOSTS + 1))}
                        & set(os.listdir("/sys/class/net"))),
        "routes": [line for line in subprocess.run(["ip", "route"], capture_output=True, text=True,
                                                   check=False).stdout.splitlines() if lab_id.subnet in line],
        "mounts": [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if str(lab_dir) in line or any(f"/run/netns/{name} " in line for name in host_names)],
        "inventory": lab_id.inventory_path(lab_dir).exists(),
        "processes": processes_using(lab_dir),
    }


NOTHING = {"netns": [], "links": [], "routes": [], "mounts": [], "inventory": False, "processes": []}


def netns_dir_state() -> str:
    """As the machine's record notes it: 'absent', 'dir', or 'mount' (`ip netns add` mounted it)."""
    if not os.path.isdir("/run/netns"):
        return "absent"
    mounted = any(line.split()[4] == "/run/netns" for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return "mount" if mounted else "dir"


@pytest.fixture(scope="module")
def machine_before() -> dict:
    """The machine's state before these tests build a lab, and whether any lab was up then."""
    refuse_unless_the_lab_can_be_built(module_lab_id())
    with testlab.machine_lock():
        return {"labs": testlab.labs_on_machine(), "state": machine_state()}


@pytest.fixture(scope="module")
def upstream_release() -> Path:
    """The vLLM release the hosts are built from, as published."""
    return vllm_sources.ensure_tree(vllm_sources.LAB_BASE_VERSION)


@pytest.fixture(scope="module")
def lab(machine_before, tmp_path_factory):
    yield from built_lab(tmp_path_factory, n_hosts=3, gpus=GPU_COUNTS)


def ssh(lab: testlab.Lab, host: testlab.LabHost, command: str, check: bool = True):
    result = subprocess.run(lab.ssh_command(host, command), capture_output=True, text=True,
                            timeout=30, check=False)
    if check:
        assert result.returncode == 0, f"{host.name}: {command}: {result.stderr}"
    return result


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def registry_keys(registry: Path, dict_name: str) -> set[str]:
    """The architectures a registry.py dict literal names, read without importing it."""
    for node in ast.parse(registry.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == dict_name:
            return {key.value for key in node.value.keys}
    raise AssertionError(f"{registry} has no {dict_name}")


def processes_using(lab_dir: Path) -> list[str]:
    """Command lines of live processes that name the lab dir (sshd names its config)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and testlab.is_running(int(proc.name)):
            try:
                command_line = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if str(lab_dir).encode() in command_line:
                found.append(command_line.replace(b"\0", b" ").decode(errors="replace"))
    return found


def assert_machine_restored(lab_id: testlab.LabId, lab_dir: Path, machine_record: dict, before: dict) -> None:
    """Nothing of the lab is left; the machine's folders stay while another lab is up, and are
    as before the first lab once none is (the whole machine as before, if no lab was up then)."""
    assert footprint(lab_id, lab_dir) == NOTHING
    with testlab.machine_lock():
        if testlab.labs_on_machine():
            assert testlab.MACHINE_RECORD.exists()
            assert all(os.path.isdir(path) for path in host_tree.PRIVATE_MOUNTS)
        else:
            assert not testlab.MACHINE_RECORD.exists()
            assert [path for path in machine_record["created_mount_points"] if os.path.exists(path)] == []
            assert netns_dir_state() == machine_record["netns_dir_before"]
            if not before["labs"]:
                assert machine_state() == before["state"]


# --- the hosts -------------------------------------------------------------------------------


def test_hosts_are_described_as_built(lab):
    number = module_lab_id()
    assert lab.id == testlab.LabId(number)
    assert [host.name for host in lab.hosts] == [f"lab{number}-h1", f"lab{number}-h2", f"lab{number}-h3"]
    assert [host.ip for host in lab.hosts] == [f"10.77.{number}.11", f"10.77.{number}.12", f"10.77.{number}.13"]
    assert [host.variant for host in lab.hosts] == ["vendor", "vendor-unregistered", "upstream"]
    assert [host.gpu_count for host in lab.hosts] == [4, 2, 4]
    assert lab.host(f"lab{number}-h2").gpu_names == ["Iluvatar BI-V100"] * 2
    # Its inventory is its own, in its lab dir: lab 0's (make deploy's) is not touched.
    assert lab.inventory_path == lab.dir / "inventory" / "hosts.yml"
    assert testlab.load(lab.dir) == lab


def test_every_host_answers_ssh_with_strict_host_key_checking(lab):
    for host in lab.hosts:
        result = subprocess.run(
            ["ssh", "-o", f"UserKnownHostsFile={lab.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-i", str(lab.private_key),
             f"root@{host.ip}", "hostname"],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert (result.returncode, result.stdout.strip()) == (0, host.name), result.stderr


def test_an_unknown_host_key_is_refused(lab):
    result = subprocess.run(
        ["ssh", "-F", "none", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-i", str(lab.private_key),
         f"root@{lab.hosts[0].ip}", "true"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_a_file_written_on_one_host_is_private_to_it(lab):
    h1, h2 = lab.hosts[0], lab.hosts[1]
    probes = [f"{path}/lab-privacy-probe" for path in PRIVATE_PATHS]
    ssh(lab, h1, "; ".join(f"echo h1 > {probe}" for probe in probes))
    try:
        seen_on_h2 = ssh(lab, h2, "; ".join(f"test ! -e {probe} || echo {probe}"
                                            for probe in probes)).stdout
        assert seen_on_h2 == ""
        for probe in probes:
            assert not os.path.exists(probe), f"{probe} leaked to the root namespace"
            assert h1.path(probe).read_text() == "h1\n"
            assert not h2.path(probe).exists()
    finally:
        ssh(lab, h1, "rm -f " + " ".join(probes))


def test_host_path_refuses_what_is_not_private(lab):
    host = lab.hosts[0]
    for shared in ("/usr/bin/python3", "/tmp/x", "/opt/../etc/passwd", "models/x"):
        with pytest.raises(ValueError):
            host.path(shared)


# --- what the hosts hold ---------------------------------------------------------------------


def test_the_hosts_python_finds_its_vllm(lab):
    expected_versions = {
        "vendor": "0.10.1.1+corex.4.3.0",
        "vendor-unregistered": "0.10.1.1+corex.4.3.0",
        "upstream": "0.10.1.1",
    }
    probe = ("import importlib.util, importlib.metadata; "
             "print(importlib.util.find_spec('vllm').origin, importlib.metadata.version('vllm'))")
    for host in lab.hosts:
        answer = ssh(lab, host, f'{host.interpreter} -c "{probe}"').stdout.split()
        assert answer == [f"{host.package_root}/__init__.py", expected_versions[host.variant]]
        assert host.vllm_version == expected_versions[host.variant]
        assert host.interpreter == "/usr/local/corex/python3/bin/python3"


def test_each_variant_has_its_vendor_changes(lab, upstream_release):
    vendor, unregistered, upstream = lab.hosts
    models = "model_executor/models"
    release_registry = upstream_release / "vllm" / models / "registry.py"
    for host in (vendor, unregistered):
        standin = host.path(f"{host.package_root}/{models}/qwen3_5.py").read_text()
        assert "class Qwen3_5ForConditionalGeneration" in standin
        assert "class Qwen3_5ForCausalLM" in standin
    assert not upstream.path(f"{upstream.package_root}/{models}/qwen3_5.py").exists()

    registry = vendor.path(f"{vendor.package_root}/{models}/registry.py")
    assert "Qwen3_5ForCausalLM" in registry_keys(registry, "_TEXT_GENERATION_MODELS")
    assert "Qwen3_5ForConditionalGeneration" in registry_keys(registry, "_MULTIMODAL_MODELS")
    for host in (unregistered, upstream):
        registry = host.path(f"{host.package_root}/{models}/registry.py")
        assert sha256(registry) == sha256(release_registry)
    assert [host.registers_qwen3_5 for host in lab.hosts] == [True, False, False]


def test_the_vendor_registry_edit_fails_loudly_on_another_registry(tmp_path):
    registry = tmp_path / "registry.py"
    registry.write_text(
        '_TEXT_GENERATION_MODELS = {\n    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),\n}\n'
    )
    with pytest.raises(host_tree.BuildError, match="exactly once"):
        host_tree._register_qwen3_5(registry)


def test_package_digests_are_those_of_the_files_and_files_are_copies(lab, upstream_release):
    release = upstream_release / "vllm"
    release_files = {path.relative_to(release).as_posix()
                     for path in release.rglob("*") if path.is_file()}
    for host in lab.hosts:
        package = host.path(host.package_root)
        on_disk = {path.relative_to(package).as_posix(): sha256(path)
                   for path in package.rglob("*") if path.is_file()}
        assert host.package_sha256 == on_disk
        assert set(on_disk) - release_files == (
            set() if host.variant == "upstream" else {"model_executor/models/qwen3_5.py"}
        )
        assert (package / "__init__.py").stat().st_nlink == 1


def test_model_configs_declare_their_architectures(lab):
    for host in lab.hosts:
        assert host.model_paths == {"qwen3_5": "/opt/models/qwen3_5",
                                    "qwen3_moe": "/opt/models/qwen3_moe"}
        qwen3_5 = json.loads(host.path("/opt/models/qwen3_5/config.json").read_text())
        assert qwen3_5["architectures"] == ["Qwen3_5ForConditionalGeneration"]
        assert qwen3_5["text_config"]["max_position_embeddings"] == 262144
        qwen3_moe = json.loads(host.path("/opt/models/qwen3_moe/config.json").read_text())
        assert qwen3_moe["architectures"] == ["Qwen3MoeForCausalLM"]


# --- ixsmi -----------------------------------------------------------------------------------

IXSMI = "/usr/local/corex/bin/ixsmi"


def test_ixsmi_lists_the_hosts_gpus(lab):
    for host in lab.hosts:
        lines = ssh(lab, host, f"{IXSMI} -L").stdout.splitlines()
        assert len(lines) == host.gpu_count
        for index, line in enumerate(lines):
            assert re.fullmatch(rf"GPU {index}: Iluvatar BI-V100 \(UUID: GPU-[0-9a-f-]{{36}}\)",
                                line)


def test_ixsmi_query_gpu_speaks_nvidia_smi_csv(lab):
    h2 = lab.hosts[1]
    fields = "index,name,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu"
    with_units = ssh(lab, h2, f"{IXSMI} --query-gpu={fields} --format=csv").stdout
    assert with_units.splitlines() == [
        "index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
        "utilization.gpu [%], temperature.gpu",
        "0, Iluvatar BI-V100, 32768 MiB, 0 MiB, 32768 MiB, 0 %, 34",
        "1, Iluvatar BI-V100, 32768 MiB, 0 MiB, 32768 MiB, 0 %, 34",
    ]
    bare = ssh(lab, h2, f"{IXSMI} --query-gpu=memory.free,index --format=csv,noheader,nounits")
    assert bare.stdout.splitlines() == ["32768, 0", "32768, 1"]
    unknown = ssh(lab, h2, f"{IXSMI} --query-gpu=index,power.draw --format=csv", check=False)
    assert unknown.returncode == 2
    assert 'Field "power.draw" is not a valid field to query.' in unknown.stdout


def test_ixsmi_reports_what_its_config_says(lab):
    h3 = lab.hosts[2]
    config_path = h3.path(f"/usr/local/corex/{ixsmi.CONFIG_NAME}")
    original = config_path.read_text()
    config = json.loads(original)
    busy = config["gpus"][1]
    busy["memory_used_mib"] = 30000
    config["compute_processes"] = [{"gpu_uuid": busy["uuid"], "pid": 4242,
                                    "process_name": "python3", "used_memory_mib": 30000}]
    config_path.write_text(json.dumps(config))
    try:
        apps = ssh(lab, h3, f"{IXSMI} --query-compute-apps=gpu_uuid,pid,process_name,"
                            "used_memory --format=csv,noheader").stdout
        assert apps.splitlines() == [f"{busy['uuid']}, 4242, python3, 30000 MiB"]
        free = ssh(lab, h3, f"{IXSMI} --query-gpu=memory.free --format=csv,noheader,nounits")
        assert free.stdout.splitlines() == ["32768", "2768", "32768", "32768"]
        table = ssh(lab, h3, IXSMI).stdout
        assert "30000MiB / 32768MiB" in table and "4242" in table
        config_path.write_text(json.dumps({"gpus": [], "compute_processes": []}))
        none = ssh(lab, h3, f"{IXSMI} -L", check=False)
        assert (none.returncode, none.stdout.strip()) == (6, "No devices were found")
    finally:
        config_path.write_text(original)


# --- lifecycle -------------------------------------------------------------------------------


def test_up_again_as_asked_is_a_quick_no_op(lab):
    start = time.monotonic()
    again = testlab.up(n_hosts=3, gpus=GPU_COUNTS, lab_dir=lab.dir, lab_id=lab.id.number)
    assert time.monotonic() - start < 1
    assert [host.sshd_pid for host in again.hosts] == [host.sshd_pid for host in lab.hosts]
    with pytest.raises(testlab.LabError, match="--rebuild"):
        testlab.up(n_hosts=4, lab_dir=lab.dir, lab_id=lab.id.number)
    # Up as another lab id is not up as asked either.
    with pytest.raises(testlab.LabError, match=f"up as lab {lab.id.number} .* not as lab {second_lab_id()} "):
        testlab.up(n_hosts=3, gpus=GPU_COUNTS, lab_dir=lab.dir, lab_id=second_lab_id())


def test_a_second_lab_dir_is_refused_its_lab_id_while_this_lab_is_up(lab, tmp_path):
    with pytest.raises(testlab.LabBusyError, match=re.escape(str(lab.dir))):
        testlab.up(n_hosts=1, lab_dir=tmp_path, lab_id=lab.id.number)
    with pytest.raises(testlab.LabBusyError, match=re.escape(str(lab.dir))):
        testlab.down(tmp_path, lab_id=lab.id.number)
    assert testlab.load(lab.dir) == lab


def reaches(lab: testlab.Lab, host: testlab.LabHost, ip: str) -> subprocess.CompletedProcess:
    """`host`'s own attempt to open a TCP connection to ip:22: exit 0 if it could."""
    connect = f"import socket; socket.create_connection(('{ip}', 22), timeout=2)"
    return ssh(lab, host, f'{host.interpreter} -c "{connect}"', check=False)


def test_a_lab_of_another_id_runs_beside_this_one_neither_reaching_the_other(lab, tmp_path):
    refuse_unless_the_lab_can_be_built(second_lab_id())
    beside = testlab.up(n_hosts=1, lab_dir=claimed_lab_dir(tmp_path / "beside"), lab_id=second_lab_id())
    try:
        (other,) = beside.hosts
        assert (other.name, other.ip) == (f"lab{second_lab_id()}-h1", f"10.77.{second_lab_id()}.11")
        assert ssh(beside, other, "hostname").stdout.strip() == other.name
        for source, target in ((lab, other), (beside, lab.hosts[0])):
            unreached = reaches(source, source.hosts[0], target.ip)
            assert unreached.returncode != 0 and "Network is unreachable" in unreached.stderr, unreached.stderr
        assert reaches(lab, lab.hosts[0], lab.hosts[1].ip).returncode == 0
        # The guard refuses the lab id while a running process claims its lab, or none does (a
        # person's), and takes the lab down once the test run that claimed it has ended.
        refused = f"lab {second_lab_id()} is up in {re.escape(str(beside.dir))}"
        with pytest.raises(pytest.fail.Exception, match=refused):
            refuse_unless_the_lab_can_be_built(second_lab_id())
        beside.dir.with_name("beside.test-run.json").unlink()
        with pytest.raises(pytest.fail.Exception, match=refused):
            refuse_unless_the_lab_can_be_built(second_lab_id())
        subprocess.run([sys.executable, "-c", "import sys, pathlib, lab_guard; "
                        "lab_guard.claimed_lab_dir(pathlib.Path(sys.argv[1]))", str(beside.dir)],
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=True)
        refuse_unless_the_lab_can_be_built(second_lab_id())
        assert footprint(beside.id, beside.dir) == NOTHING
    finally:
        testlab.down(tmp_path / "beside")
    assert footprint(beside.id, beside.dir) == NOTHING
    # This lab's hosts keep the folders the machine's record would remove with the last lab.
    assert testlab.load(lab.dir) == lab
    for host in lab.hosts:
        ssh(lab, host, " && ".join(f"mountpoint -q {path}" for path in PRIVATE_PATHS))


def test_inventory_reaches_every_host_with_ansible_and_has_the_lab_group_vars(lab):
    ansible = Path(sys.executable).with_name("ansible")
    assert ansible.exists(), "ansible-core is installed beside this Python by `make setup`"
    environment = {**os.environ, "ANSIBLE_CONFIG": str(testlab.REPO_ROOT / "ansible.cfg")}
    result = subprocess.run(
        [str(ansible), "-i", str(lab.inventory_path), "biv100", "-m", "ansible.builtin.ping"],
        capture_output=True, text=True, timeout=120, check=False, cwd=testlab.REPO_ROOT, env=environment,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(lab.hosts)
    listed = subprocess.run([str(ansible.with_name("ansible-inventory")), "-i", str(lab.inventory_path), "--list"],
                            capture_output=True, text=True, timeout=60, check=True, cwd=testlab.REPO_ROOT,
                            env=environment)
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert {host.name: hostvars[host.name]["facts_model_path"] for host in lab.hosts} == {
        host.name: "/opt/models/qwen3_moe" if host.variant == "upstream" else "/opt/models/qwen3_5"
        for host in lab.hosts}


# The two tests below take labs down: they come last in this file.


def test_down_leaves_nothing(lab, machine_before):
    layout = testlab.LabDir(lab.dir)
    machine_record = json.loads(testlab.MACHINE_RECORD.read_text())
    testlab.down(lab.dir)
    for host in lab.hosts:
        assert not testlab.is_running(host.sshd_pid), f"{host.name}'s sshd still runs"
    assert not layout.hosts.exists()
    assert not lab.dir.exists()
    assert_machine_restored(lab.id, lab.dir, machine_record, machine_before)
    with pytest.raises(testlab.LabNotUpError):
        testlab.load(lab.dir)
    testlab.down(lab.dir)  # nothing up: a no-op


def test_down_cleans_up_an_interrupted_up(machine_before, tmp_path):
    lab_id = testlab.LabId(second_lab_id())
    refuse_unless_the_lab_can_be_built(lab_id.number)
    lab_dir = claimed_lab_dir(tmp_path / "interrupted")
    up = subprocess.Popen(
        [sys.executable, testlab.__file__, "up", "--hosts", "3"],
        env={**os.environ, testlab.LAB_DIR_ENV: str(lab_dir), testlab.LAB_ID_ENV: str(lab_id.number)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    # Kill it, and the commands it runs, as soon as the network exists: trees built, sshds
    # starting or about to.
    deadline = time.monotonic() + 60
    while 3 not in lab_id.netns_indices():
        assert up.poll() is None and time.monotonic() < deadline, "up ended before the kill"
        time.sleep(0.01)
    os.killpg(up.pid, signal.SIGKILL)
    up.wait()
    assert json.loads((lab_dir / "lab.json").read_text()) == {"state": "building", "lab_id": lab_id.number}
    machine_record = json.loads(testlab.MACHINE_RECORD.read_text())
    testlab.down(lab_dir)  # the lab id is the one its lab.json names
    assert not lab_dir.exists()
    assert_machine_restored(lab_id, lab_dir, machine_record, machine_before)
