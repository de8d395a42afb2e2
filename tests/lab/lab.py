"""The project's test lab: BI-V100-like hosts made of network namespaces on this machine.

Host i of lab n is the network namespace `lab-h<i>` (lab 0) or `lab<n>-h<i>` at
10.77.n.(10+i), reached from the machine through the lab's bridge, with its own sshd started in
a private mount namespace where the host's own folders are bind-mounted over /opt, /root,
/usr/local/corex and the collection's state, config and log folders, plus a tmpfs over /run.
What the hosts hold is built by host_tree.py.

    python tests/lab/lab.py [--lab-id N] up [--hosts N] [--gpus h2=2,h3=8] [--real-engine h4]
                                            [--rebuild]
    python tests/lab/lab.py [--lab-id N] status
    python tests/lab/lab.py [--lab-id N] down

The lab id (--lab-id, env BIV100_LAB_ID, default 0) decides what the lab owns on the machine:
its namespaces' names, its bridge and veths, its subnet, its default lab dir and where its
inventory is written. Labs of different ids are up side by side (the integration tests build
one per pytest-xdist worker); lab 0 is the one `make deploy` builds.

The lab dir (env BIV100_LAB_DIR, default /tmp/biv100-lab for lab 0, /tmp/biv100-lab<n>
otherwise) holds everything the lab makes: the ssh keys, known_hosts, each host's tree, sshd
config, pid file and log, and lab.json, the description of what was built. `up` also writes the
lab's inventory: inventory/lab/hosts.yml for lab 0, <lab dir>/inventory/hosts.yml for the
others.

The bridge's alias names the lab dir that owns the lab id: a lab command given another lab dir
refuses instead of taking over or tearing down a lab it did not build.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import host_tree
import real_engine
import vllm_sources

log = logging.getLogger("biv100.lab")

LAB_DIR_ENV = "BIV100_LAB_DIR"
LAB_ID_ENV = "BIV100_LAB_ID"
DEFAULT_LAB_DIR = "/tmp/biv100-lab"
DEFAULT_LAB_ID = 0
# Lab n's subnet is 10.77.n.0/24, and its interface names (biv100-lab<n>, biv100-<n>h<i>) must
# fit the kernel's 15 characters.
MAX_LAB_ID = 99
REPO_ROOT = Path(__file__).resolve().parents[2]
# Lab 0's inventory, beside the committed group_vars: what `make deploy` and molecule run against.
INVENTORY_PATH = REPO_ROOT / "inventory" / "lab" / "hosts.yml"

DEFAULT_HOSTS = 4
MAX_HOSTS = 16
DEFAULT_GPUS = 4
SUPERVISORD_EVERY = 4
MAX_GPUS = 16
# The inventory group of the hosts whose engine is the real vLLM (inventory/lab/group_vars).
REAL_ENGINE_GROUP = "lab_real_engine"
SSH_PORT = 22
# Taken around every up and down: two commands must not build or remove the same namespaces at
# once, nor change the machine's folders that every lab's hosts mount over.
MACHINE_LOCK = Path("/run/lock/biv100-lab.lock")
# What the machine had before its first lab came up (which mount points were missing, whether
# /run/netns was there), kept while any lab is up: the last lab to go down restores it.
MACHINE_RECORD = Path("/run/biv100-lab.json")
NETNS_DIR = "/run/netns"
# Every lab's namespaces and bridges, whatever its id.
LAB_NETNS = re.compile(r"lab(\d*)-h(\d+)")
LAB_BRIDGE = re.compile(r"biv100-lab\d*")
# ansible.cfg's control_path_dir and control_path: where Ansible's ssh masters to the hosts are.
ANSIBLE_CONTROL_PATH = str(Path.home() / ".ansible" / "cp" / "%C")

READY_TIMEOUT_SECONDS = 10
STOP_GRACE_SECONDS = 3
# Building a host is mostly creating 1,400 files, a venv and hashing, all kernel or CPU time:
# one worker per core. More only contend (on 2 cores and ext4, 4 workers were 30 % slower).
BUILD_WORKERS = os.cpu_count() or 1


class LabError(RuntimeError):
    """The lab cannot do what was asked; the message says why and what to do."""


class LabNotUpError(LabError):
    pass


class LabBusyError(LabError):
    """Another lab dir owns the lab id's namespaces."""


@dataclass(frozen=True)
class LabId:
    """What lab `number` owns on the machine. Lab 0's names carry no number, so the default
    lab is `lab-h1` at 10.77.0.11 behind the bridge `biv100-lab`; lab 2's first host is
    `lab2-h1` at 10.77.2.11 behind `biv100-lab2`."""

    number: int

    def __post_init__(self):
        if not 0 <= self.number <= MAX_LAB_ID:
            raise LabError(f"the lab id is 0 to {MAX_LAB_ID}, not {self.number}")

    @classmethod
    def resolve(cls, lab_id: int | None = None) -> LabId:
        """The id asked for, else the one in the environment, else the default lab's."""
        if lab_id is not None:
            return cls(lab_id)
        text = os.environ.get(LAB_ID_ENV, "").strip()
        if text and not text.isdigit():
            raise LabError(f"{LAB_ID_ENV}={text!r} is not a lab id (0 to {MAX_LAB_ID})")
        return cls(int(text) if text else DEFAULT_LAB_ID)

    @property
    def _tag(self) -> str:
        return str(self.number) if self.number else ""

    def host_name(self, index: int) -> str:
        """The host's name: its network namespace, its hostname and its inventory name."""
        return f"lab{self._tag}-h{index}"

    def host_ip(self, index: int) -> str:
        return f"10.77.{self.number}.{10 + index}"

    @property
    def subnet(self) -> str:
        return f"10.77.{self.number}.0/24"

    @property
    def bridge(self) -> str:
        return f"biv100-lab{self._tag}"

    def veth(self, index: int) -> str:
        """The host's veth end in the root namespace (the end inside the host is eth0)."""
        return f"biv100-{self._tag}h{index}"

    @property
    def default_dir(self) -> str:
        return f"{DEFAULT_LAB_DIR}{self._tag}"

    def inventory_path(self, lab_dir: Path) -> Path:
        return INVENTORY_PATH if self.number == DEFAULT_LAB_ID else lab_dir / "inventory" / "hosts.yml"

    def netns_indices(self) -> list[int]:
        """The host indices of this lab's namespaces that exist on the machine."""
        return sorted(int(match[2]) for match in map(LAB_NETNS.fullmatch, _netns_names())
                      if match and match[1] == self._tag)


def variant_of(index: int) -> str:
    return host_tree.VARIANTS[(index - 1) % len(host_tree.VARIANTS)]


def runs_supervisord(index: int) -> bool:
    """Every fourth host runs supervisord, so a 4-host lab has one of each way to run the engine
    that hosts without systemd have."""
    return index % SUPERVISORD_EVERY == 0


@dataclass(frozen=True)
class LabDir:
    """Where each of the lab's files is in the lab dir."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "lab.json"

    @property
    def private_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def public_key(self) -> Path:
        return self.root / "id_ed25519.pub"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def hosts(self) -> Path:
        return self.root / "hosts"

    def host(self, index: int) -> Path:
        return self.hosts / f"h{index}"

    def tree(self, index: int) -> Path:
        return self.host(index) / "fs"

    def sshd_config(self, index: int) -> Path:
        return self.host(index) / "sshd_config"

    def host_key(self, index: int) -> Path:
        return self.host(index) / "ssh_host_ed25519_key"

    def host_public_key(self, index: int) -> Path:
        return self.host(index) / "ssh_host_ed25519_key.pub"

    def pid_file(self, index: int) -> Path:
        return self.host(index) / "sshd.pid"

    def sshd_log(self, index: int) -> Path:
        return self.host(index) / "sshd.log"

    def keeper_pid_file(self, index: int) -> Path:
        return self.host(index) / "keeper.pid"

    def built_host_indices(self) -> list[int]:
        if not self.hosts.is_dir():
            return []
        return sorted(int(path.name[1:]) for path in self.hosts.glob("h[0-9]*"))


@dataclass(frozen=True)
class LabHost:
    name: str
    index: int
    ip: str
    variant: str
    gpu_count: int
    gpu_names: list[str]
    vllm_version: str  # what the package metadata says
    interpreter: str  # host view
    package_root: str  # host view of the vllm package folder
    models: dict[str, dict]  # model name -> {"path": host view, "architectures": [...]}
    registers_qwen3_5: bool
    supervisorctl: str | None  # host view; None on hosts without supervisord
    package_sha256: dict[str, str]  # path relative to package_root -> sha256, as built
    tree: str  # the root-namespace folder that mirrors the host's private mounts
    sshd_pid: int  # as built; stop_sshd and start_sshd change it (load() has the current one)
    # A process that holds the host's mount and UTS namespaces for as long as the lab is up, so
    # that the host keeps its files and /run while its sshd is down.
    namespace_pid: int = 0
    engine: str = host_tree.STANDIN  # what serves: host_tree.STANDIN or host_tree.REAL_VLLM
    engine_runtime: str | None = None  # the real engine's runtime folder, on its hosts

    @property
    def model_paths(self) -> dict[str, str]:
        return {name: model["path"] for name, model in self.models.items()}

    def path(self, host_path: str) -> Path:
        """Where the host's file `host_path` is, seen from the root namespace.

        Only the host's private paths have such a place: the folders in
        host_tree.PRIVATE_MOUNTS (in the host's tree) and /run (the tmpfs of the host's mount
        namespace, held by its keeper process even while its sshd is down).
        """
        normalized = os.path.normpath(host_path)
        if not os.path.isabs(normalized):
            raise ValueError(f"{host_path!r} is not an absolute path")
        if _is_under(normalized, "/run"):
            return Path(f"/proc/{self.namespace_pid or self.sshd_pid}/root{normalized}")
        if any(_is_under(normalized, mount) for mount in host_tree.PRIVATE_MOUNTS):
            return host_tree.in_tree(Path(self.tree), normalized)
        raise ValueError(
            f"{host_path} is not private to {self.name}: only "
            f"{', '.join(host_tree.PRIVATE_MOUNTS)} and /run are; the rest is the machine's"
        )


@dataclass(frozen=True)
class Lab:
    dir: Path
    id: LabId
    inventory_path: Path
    hosts: list[LabHost]

    @property
    def private_key(self) -> Path:
        return LabDir(self.dir).private_key

    @property
    def known_hosts(self) -> Path:
        return LabDir(self.dir).known_hosts

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"the lab has no host {name!r}")

    def ssh_command(self, host: LabHost, *remote_command: str) -> list[str]:
        """An ssh command line to `host` as root, host keys checked against the lab's."""
        return [
            "ssh", "-F", "none", "-i", str(self.private_key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", f"root@{host.ip}", *remote_command,
        ]


# --- public API ------------------------------------------------------------------------------


def up(n_hosts: int = DEFAULT_HOSTS, gpus: dict[str, int] | None = None,
       lab_dir: str | Path | None = None, rebuild: bool = False, lab_id: int | None = None,
       real_engines: Iterable[str] = ()) -> Lab:
    """Bring lab `lab_id` up with `n_hosts` hosts, or return it if it is up as asked already.

    `gpus` maps host names ("h2" or "lab-h2") to GPU counts (DEFAULT_GPUS for the others);
    `real_engines` names the hosts whose engine is the real vLLM (real_engine/, built on the
    machine once), the others run the stand-in. A lab that is up and healthy with other host,
    GPU or engine counts, or as another lab id, is refused unless `rebuild`; one that is broken
    or half-built is removed and built again.
    """
    asked = LabId.resolve(lab_id)
    layout = LabDir(resolve_lab_dir(lab_dir, asked))
    gpu_counts = _gpu_counts(n_hosts, gpus or {})
    engines = _engines(n_hosts, real_engines)
    with machine_lock():
        built_as = _built_lab_id(layout) or asked
        for owned in (asked, built_as):
            _refuse_lab_owned_elsewhere(layout, owned)
        if not rebuild:
            existing = _healthy_lab_or_none(layout)
            if existing:
                return _existing_if_as_asked(existing, gpu_counts, engines, asked)
        _teardown(layout, built_as)
        try:
            return _build(layout, asked, gpu_counts, engines)
        except BaseException:
            log.error("up failed; removing what it built")
            _teardown(layout, asked)
            raise


def down(lab_dir: str | Path | None = None, lab_id: int | None = None) -> None:
    """Take the lab down, whole or half-built; a no-op when nothing is up. The lab id is the one
    the lab dir's lab was built with, else `lab_id` (which also picks the default lab dir)."""
    asked = LabId.resolve(lab_id)
    layout = LabDir(resolve_lab_dir(lab_dir, asked))
    with machine_lock():
        built_as = _built_lab_id(layout)
        named = lab_id is not None or LAB_ID_ENV in os.environ
        if built_as is None and not named and (owner := _other_owner(layout, asked)):
            # Nothing was built here and no lab id was named: lab 0's network is another lab
            # dir's, not ours to remove, and finding nothing to take down is not an error. A lab
            # id named for this dir while its lab is elsewhere is refused below, naming where.
            log.info("no lab is up in %s: nothing to take down (lab %d is up in %s: %s=%s "
                     "python tests/lab/lab.py down takes it down)",
                     layout.root, asked.number, owner, LAB_DIR_ENV, owner)
            return
        built_as = built_as or asked
        _refuse_lab_owned_elsewhere(layout, built_as)
        if not _teardown(layout, built_as):
            log.info("no lab is up in %s: nothing to take down", layout.root)


def stop_sshd(host: LabHost, lab_dir: str | Path | None = None) -> list[int]:
    """Kill the host's sshd and every session it runs (SIGKILL), as a host that drops off the
    network mid-run; what the sessions started and left running (the engine) stays.

    Returns the pids killed. The host keeps its files: its keeper holds its namespaces.
    """
    layout = LabDir(resolve_lab_dir(lab_dir))
    pid = _recorded_pid(layout.pid_file(host.index))
    if not (pid and _is_our_sshd(pid, layout, host.index)):
        raise LabError(f"{host.name}'s sshd is not running")
    if not (host.namespace_pid and is_running(host.namespace_pid)):
        raise LabError(f"{host.name} has no keeper holding its namespaces: rebuild the lab")
    killed = [pid, *descendants(pid)]
    _signal(killed, signal.SIGKILL)
    _wait_for_exit(killed, STOP_GRACE_SECONDS)
    return killed


def start_sshd(host: LabHost, lab_dir: str | Path | None = None) -> int:
    """Start the host's sshd again in its own namespaces; return its pid once it serves."""
    layout = LabDir(resolve_lab_dir(lab_dir))
    layout.pid_file(host.index).unlink(missing_ok=True)
    _run(["nsenter", f"--target={host.namespace_pid}", "--mount", "--uts", "--net", "--",
          "sh", "-c", _sshd_command(layout, host.index)])
    pid = _wait_until_serving(layout, host.index, host.name, host.ip)
    record = _read_record(layout)
    for described in record["hosts"]:
        if described["name"] == host.name:
            described["sshd_pid"] = pid
    _write_record(layout, record)
    return pid


def descendants(pid: int) -> list[int]:
    """Every process below pid, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def load(lab_dir: str | Path | None = None) -> Lab:
    """The lab that is up in the lab dir; LabNotUpError if none is, or it is unhealthy."""
    layout = LabDir(resolve_lab_dir(lab_dir))
    lab = _read_lab(layout)
    problems = _health_problems(lab)
    if problems:
        raise LabNotUpError(
            f"the lab in {layout.root} is broken: {'; '.join(problems)}. "
            "Rebuild it: python tests/lab/lab.py up --rebuild"
        )
    return lab


def running_lab_dir(lab_id: int | None = None) -> Path | None:
    """The lab dir of lab `lab_id` (as LabId.resolve picks it) if it is up, or half up."""
    return _bridge_owner(LabId.resolve(lab_id))


def labs_on_machine() -> list[str]:
    """The namespaces and bridges of every lab that is up (or half up) on the machine, any id."""
    links = json.loads(_run(["ip", "-j", "link", "show"]).stdout)
    return sorted([name for name in _netns_names() if LAB_NETNS.fullmatch(name)]
                  + [link["ifname"] for link in links if LAB_BRIDGE.fullmatch(link["ifname"])])


@contextlib.contextmanager
def machine_lock():
    """Held by every up and down (and by a reader that must see no lab half up or half down).
    Not reentrant: up and down cannot be called while holding it."""
    with open(MACHINE_LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another lab command is running; waiting for it to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def resolve_lab_dir(lab_dir: str | Path | None = None, lab_id: LabId | None = None) -> Path:
    """The lab dir asked for, else BIV100_LAB_DIR, else the lab id's default one."""
    default = (lab_id or LabId.resolve()).default_dir
    path = Path(lab_dir or os.environ.get(LAB_DIR_ENV) or default).resolve()
    _refuse_unless_shared(path, "the lab dir", "sshd_config and the launch script",
                          f"its sshd could not read its own files. Choose another, e.g. {DEFAULT_LAB_DIR}")
    return path


def _refuse_unless_shared(path: Path, what: str, carriers: str, why: str) -> None:
    """Refuse a folder of the machine's that the hosts must see as it is: one under a folder
    every host mounts over, or whose name the files naming it (`carriers`) cannot carry."""
    if any(character.isspace() for character in str(path)):
        raise LabError(f"{what} {str(path)!r} contains white space, which {carriers} cannot carry; "
                       "choose another")
    for hidden in (*host_tree.PRIVATE_MOUNTS, "/run"):
        if _is_under(str(path), hidden):
            raise LabError(f"{what} {path} is under {hidden}, which every lab host mounts over: {why}")


# --- state of the machine and of the lab dir -------------------------------------------------


def _is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a command that must succeed; its stderr is in the error if it does not."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        raise LabError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _bridge_owner(lab_id: LabId) -> Path | None:
    """The lab dir recorded on the lab id's bridge, if the bridge exists and has one."""
    result = subprocess.run(["ip", "-j", "link", "show", "dev", lab_id.bridge],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return None
    alias = json.loads(result.stdout)[0].get("ifalias")
    return Path(alias) if alias else None


def _runtimes_in_use() -> set[Path]:
    """The real engine runtimes the labs up on the machine run (their bridges name their lab
    dirs), which a build of another runtime must not remove."""
    links = json.loads(_run(["ip", "-j", "link", "show"]).stdout)
    in_use = set()
    for link in links:
        if LAB_BRIDGE.fullmatch(link["ifname"]) and link.get("ifalias"):
            record = _read_json_if_any(LabDir(Path(link["ifalias"])).record) or {}
            in_use |= {Path(host["engine_runtime"]) for host in record.get("hosts", [])
                       if host.get("engine_runtime")}
    return in_use


def _netns_names() -> list[str]:
    return _run(["ip", "netns", "list"]).stdout.split()


def _built_lab_id(layout: LabDir) -> LabId | None:
    """The lab id the lab dir's lab (whole or half-built) was built as, if it holds one."""
    record = _read_record_if_any(layout)
    return LabId(record["lab_id"]) if record else None


def _other_owner(layout: LabDir, lab_id: LabId) -> Path | None:
    """The lab dir, other than this one, whose lab is up (or half up) under the lab id."""
    owner = _bridge_owner(lab_id)
    return owner if owner and owner != layout.root and (owner / "lab.json").exists() else None


def _refuse_lab_owned_elsewhere(layout: LabDir, lab_id: LabId) -> None:
    if owner := _other_owner(layout, lab_id):
        raise LabBusyError(
            f"lab {lab_id.number} is up on this machine, built in {owner}, not {layout.root}. "
            f"Take it down first: {LAB_DIR_ENV}={owner} python tests/lab/lab.py down; or "
            f"choose another lab id ({LAB_ID_ENV})"
        )


def _read_lab(layout: LabDir) -> Lab:
    record = _read_record(layout)
    if record["state"] != "up":
        raise LabNotUpError(
            f"the up in {layout.root} did not finish. Take what it built down "
            "(python tests/lab/lab.py down) or run up again"
        )
    return Lab(dir=layout.root, id=LabId(record["lab_id"]),
               inventory_path=Path(record["inventory_path"]),
               hosts=[LabHost(**host) for host in record["hosts"]])


def _read_record(layout: LabDir) -> dict:
    try:
        return json.loads(layout.record.read_text())
    except FileNotFoundError:
        raise LabNotUpError(
            f"no lab is up in {layout.root}. Start one: python tests/lab/lab.py up"
        ) from None


def _healthy_lab_or_none(layout: LabDir) -> Lab | None:
    try:
        lab = _read_lab(layout)
    except LabNotUpError:
        return None
    problems = _health_problems(lab)
    if problems:
        log.info("the lab in %s is broken (%s): rebuilding it", layout.root, "; ".join(problems))
        return None
    return lab


def _health_problems(lab: Lab) -> list[str]:
    layout = LabDir(lab.dir)
    problems = []
    runtime = real_engine.current_runtime()
    if _bridge_owner(lab.id) != lab.dir:
        problems.append(f"the bridge {lab.id.bridge} is missing or not this lab's")
    for host in lab.hosts:
        if not _is_our_sshd(host.sshd_pid, layout, host.index):
            problems.append(f"{host.name}'s sshd (pid {host.sshd_pid}) is not running")
        elif not _accepts_tcp(host.ip):
            problems.append(f"{host.name}'s sshd does not accept connections on {host.ip}")
        if host.engine == host_tree.REAL_VLLM and not runtime.is_built(host.engine_runtime):
            problems.append(f"{host.name}'s real engine runtime {host.engine_runtime} is not "
                            "this checkout's")
    return problems


def _existing_if_as_asked(lab: Lab, gpu_counts: list[int], engines: list[str],
                          lab_id: LabId) -> Lab:
    built = [host.gpu_count for host in lab.hosts]
    built_engines = [host.engine for host in lab.hosts]
    if (built, built_engines, lab.id) != (gpu_counts, engines, lab_id):
        raise LabError(
            f"the lab in {lab.dir} is up as lab {lab.id.number} with "
            f"{_describe(built, built_engines)}, not as lab {lab_id.number} with "
            f"{_describe(gpu_counts, engines)}. Take it down first, or run: "
            "python tests/lab/lab.py up --rebuild"
        )
    log.info("the lab in %s is already up and healthy with %d hosts: nothing to do",
             lab.dir, len(lab.hosts))
    return lab


def _describe(gpu_counts: list[int], engines: list[str]) -> str:
    real = [f"h{index}" for index, engine in enumerate(engines, start=1)
            if engine == host_tree.REAL_VLLM]
    return (f"{len(gpu_counts)} hosts (GPUs per host: {' '.join(map(str, gpu_counts))}; "
            f"real engine: {', '.join(real) or 'none'})")


def _engines(n_hosts: int, real_engines: Iterable[str]) -> list[str]:
    """The engine of each host, host 1 first, from the hosts `real_engines` names."""
    engines = [host_tree.STANDIN] * n_hosts
    for name in real_engines:
        engines[_host_index(name, n_hosts, "real engine on") - 1] = host_tree.REAL_VLLM
    return engines


def _host_index(name: str, n_hosts: int, what: str) -> int:
    """The index of the host a command line or a test names ("h2" or "lab-h2")."""
    named = re.fullmatch(r"(?:lab\d*-)?h(\d+)", name)
    if not named or not 1 <= int(named[1]) <= n_hosts:
        raise LabError(f"{what} {name!r}: the lab's hosts are h1 to h{n_hosts}")
    return int(named[1])


def _gpu_counts(n_hosts: int, gpus: dict[str, int]) -> list[int]:
    """GPU count per host, host 1 first, from the hosts the `gpus` mapping names."""
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise LabError(f"the lab has 1 to {MAX_HOSTS} hosts, not {n_hosts}")
    counts = [DEFAULT_GPUS] * n_hosts
    for name, count in gpus.items():
        index = _host_index(name, n_hosts, "GPU count for")
        if not 0 <= count <= MAX_GPUS:
            raise LabError(f"GPU count for {name!r}: {count} is not between 0 and {MAX_GPUS}")
        counts[index - 1] = count
    return counts


# --- up --------------------------------------------------------------------------------------


class _PhaseTimer:
    def __init__(self):
        self.phases: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def __call__(self, phase: str):
        start = time.monotonic()
        yield
        self.phases.append((phase, time.monotonic() - start))

    def summary(self) -> str:
        return ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in self.phases)


def _build(layout: LabDir, lab_id: LabId, gpu_counts: list[int], engines: list[str]) -> Lab:
    specs = [
        host_tree.HostSpec(index, lab_id.host_name(index), variant_of(index), gpu_count,
                           supervisord=runs_supervisord(index), engine=engine)
        for index, (gpu_count, engine) in enumerate(zip(gpu_counts, engines), start=1)
    ]
    timer = _PhaseTimer()
    runtime = None
    if host_tree.REAL_VLLM in engines:
        _refuse_unless_shared(real_engine.current_runtime().path, "the real engine's runtime",
                              "the hosts' venv and in-engine-root",
                              f"its hosts could not run it. Choose another ({real_engine.RUNTIME_DIR_ENV})")
        with timer("real engine runtime"):
            runtime = real_engine.ensure_runtime(in_use=_runtimes_in_use())
    route_source = _root_namespace_ipv4()
    layout.root.mkdir(parents=True, exist_ok=True)
    # Written first, so that a down after an interrupted up knows which lab id to take down and
    # the machine's record what to restore.
    _write_record(layout, {"state": "building", "lab_id": lab_id.number})
    _claim_machine()
    with timer("host trees"):
        vllm_release = vllm_sources.ensure_tree(vllm_sources.LAB_BASE_VERSION)
        _make_key(layout.private_key, "biv100-lab")
        public_key = layout.public_key.read_text()
        with ThreadPoolExecutor(max_workers=BUILD_WORKERS) as pool:
            built = list(pool.map(
                lambda spec: _build_host(layout, lab_id, spec, vllm_release, public_key, runtime),
                specs
            ))
    with timer("network"):
        _make_network(layout, lab_id, len(specs), route_source)
    with timer("sshd"):
        for path in host_tree.PRIVATE_MOUNTS:
            os.makedirs(path, exist_ok=True)  # what the hosts' bind mounts go over
        sshd_pids = _start_sshds(layout, lab_id, specs)
    hosts = [
        LabHost(name=spec.name, index=spec.index, ip=lab_id.host_ip(spec.index),
                variant=spec.variant, gpu_count=spec.gpu_count, tree=str(layout.tree(spec.index)),
                sshd_pid=pid, namespace_pid=_recorded_pid(layout.keeper_pid_file(spec.index)),
                **description)
        for spec, description, pid in zip(specs, built, sshd_pids)
    ]
    lab = Lab(dir=layout.root, id=lab_id, inventory_path=lab_id.inventory_path(layout.root),
              hosts=hosts)
    _write_known_hosts(layout, lab_id, specs)
    _write_inventory(lab)
    _write_record(layout, {"state": "up", "lab_id": lab_id.number,
                           "inventory_path": str(lab.inventory_path),
                           "hosts": [asdict(host) for host in hosts]})
    with timer("ssh check"):
        _check_ssh(lab)
    log.info("built %d hosts of lab %d in %s (%s)", len(hosts), lab_id.number, layout.root,
             timer.summary())
    return lab


def _claim_machine() -> None:
    """Note in the machine's record what a lab is about to change on the machine: the mount
    points it will make and, for the first lab up, the state of /run/netns. Every lab adds the
    mount points missing now; the last lab down removes them (_release_machine)."""
    record = _read_json_if_any(MACHINE_RECORD) or {"created_mount_points": [],
                                                   "netns_dir_before": _netns_dir_state()}
    missing = [path for path in host_tree.PRIVATE_MOUNTS if not os.path.exists(path)]
    record["created_mount_points"] = sorted({*record["created_mount_points"], *missing})
    _write_json(MACHINE_RECORD, record)


def _write_record(layout: LabDir, record: dict) -> None:
    _write_json(layout.record, record)


def _write_json(path: Path, document: dict) -> None:
    staged = _staged(path)
    staged.write_text(json.dumps(document, indent=1, sort_keys=True))
    os.replace(staged, path)  # a reader never sees half a record


def _read_json_if_any(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _staged(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def _root_namespace_ipv4() -> str:
    """The machine's own address that the hosts route back to (they reach nothing else)."""
    interfaces = json.loads(_run(["ip", "-j", "-4", "addr", "show", "scope", "global"]).stdout)
    for interface in interfaces:
        if interface.get("addr_info"):
            return interface["addr_info"][0]["local"]
    raise LabError("the root namespace has no global IPv4 address for the hosts to route to")


def _netns_dir_state() -> str:
    """'absent', 'dir' or 'mount': `ip netns add` makes /run/netns a mount point of itself."""
    if not os.path.isdir(NETNS_DIR):
        return "absent"
    return "mount" if _is_mount_point(NETNS_DIR) else "dir"


def _is_mount_point(path: str) -> bool:
    # os.path.ismount misses a folder bind-mounted onto itself (same device, same inode).
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == path for line in mountinfo)


def _make_key(private_key: Path, comment: str) -> None:
    """Make an ed25519 key pair without a passphrase (ssh-keygen adds .pub for the public key)."""
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(private_key)])


def _build_host(layout: LabDir, lab_id: LabId, spec: host_tree.HostSpec, vllm_release: Path,
                public_key: str, runtime: real_engine.Runtime | None) -> dict:
    description = host_tree.build_host_tree(layout.tree(spec.index), spec, vllm_release,
                                            public_key, runtime)
    _make_key(layout.host_key(spec.index), spec.name)
    layout.sshd_config(spec.index).write_text(
        _sshd_config(layout, spec.index, lab_id.host_ip(spec.index)))
    return description


def _sshd_config(layout: LabDir, index: int, ip: str) -> str:
    return "\n".join([
        f"ListenAddress {ip}:{SSH_PORT}",
        f"HostKey {layout.host_key(index)}",
        f"PidFile {layout.pid_file(index)}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The keys live in the host's private /root, made 0700 by host_tree, so sshd's
        # ownership and mode checks hold as on a real host.
        "StrictModes yes",
        # Ansible opens a burst of connections and sessions per host at the start of a run.
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        "PrintMotd no",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
        "",
    ])


def _make_network(layout: LabDir, lab_id: LabId, n_hosts: int, route_source: str) -> None:
    # addrgenmode none: no IPv6 link-local addresses, so the lab sends no traffic of its own.
    bridge = lab_id.bridge
    commands = [
        f"link add name {bridge} type bridge",
        f"link set dev {bridge} addrgenmode none",
        f"link set dev {bridge} alias {layout.root}",
        f"link set dev {bridge} up",
    ]
    for index in range(1, n_hosts + 1):
        name, veth = lab_id.host_name(index), lab_id.veth(index)
        commands += [
            f"netns add {name}",
            f"link add name {veth} type veth peer name eth0 netns {name}",
            f"link set dev {veth} addrgenmode none",
            f"link set dev {veth} master {bridge} up",
        ]
    commands.append(f"route add {lab_id.subnet} dev {bridge} src {route_source}")
    _ip_batch(commands)
    for index in range(1, n_hosts + 1):
        _ip_batch([
            "link set dev lo up",
            "link set dev eth0 addrgenmode none",
            f"addr add {lab_id.host_ip(index)}/24 dev eth0",
            "link set dev eth0 up",
            # The one way out: back to the machine's own address. Other labs' subnets, like
            # every other address, have no route from here.
            f"route add {route_source}/32 dev eth0",
        ], netns=lab_id.host_name(index))


def _ip_batch(commands: list[str], netns: str | None = None) -> None:
    """Run `ip` commands in one process, stopping at the first that fails."""
    in_netns = ["-n", netns] if netns else []
    _run(["ip", *in_netns, "-batch", "-"], input="\n".join(commands) + "\n")


def _start_sshds(layout: LabDir, lab_id: LabId, specs: list[host_tree.HostSpec]) -> list[int]:
    """Start every host's sshd at once; return their pids once each accepts connections."""
    launches = [
        subprocess.Popen(
            ["ip", "netns", "exec", spec.name, "unshare", "--mount", "--uts",
             "--propagation", "private", "sh", "-ec", _launch_script(layout, spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )
        for spec in specs
    ]
    # sshd forks into the background once it is set up; the foreground process then exits.
    for spec, launch in zip(specs, launches):
        _stdout, stderr = launch.communicate(timeout=READY_TIMEOUT_SECONDS)
        if launch.returncode != 0:
            raise LabError(f"{spec.name}'s sshd did not start: {stderr.strip()}"
                           f"{_log_tail(layout.sshd_log(spec.index))}")
    return [_wait_until_serving(layout, spec.index, spec.name, lab_id.host_ip(spec.index))
            for spec in specs]


def _launch_script(layout: LabDir, spec: host_tree.HostSpec) -> str:
    tree = layout.tree(spec.index)
    # mount -n: util-linux would otherwise keep its notes in the machine's /run/mount.
    binds = [f"mount -n --bind {host_tree.in_tree(tree, path)} {path}"
             for path in host_tree.PRIVATE_MOUNTS]
    return "\n".join([
        f"hostname {spec.name}",
        *binds,
        "mount -n -t tmpfs -o mode=755 tmpfs /run",
        # supervisord daemonizes; it and what it runs are in the host's namespaces, which down
        # empties.
        *([host_tree.SUPERVISORD_COMMAND] if spec.supervisord else []),
        "mkdir -p /run/sshd",  # sshd's privilege separation folder
        # The keeper holds the namespaces so that a host whose sshd is stopped (stop_sshd)
        # keeps its mounts and can have its sshd started again in them.
        f"sleep infinity </dev/null >/dev/null 2>&1 & echo $! > {layout.keeper_pid_file(spec.index)}",
        _sshd_command(layout, spec.index, exec_=True),
    ])


def _sshd_command(layout: LabDir, index: int, exec_: bool = False) -> str:
    return (f"{'exec ' if exec_ else ''}/usr/sbin/sshd -f {layout.sshd_config(index)} "
            f"-E {layout.sshd_log(index)}")


def _wait_until_serving(layout: LabDir, index: int, name: str, ip: str) -> int:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        pid = _recorded_pid(layout.pid_file(index))
        if pid and _accepts_tcp(ip):
            return pid
        time.sleep(0.02)
    raise LabError(f"{name}'s sshd is not serving after {READY_TIMEOUT_SECONDS} s"
                   f"{_log_tail(layout.sshd_log(index))}")


def _accepts_tcp(ip: str) -> bool:
    try:
        with socket.create_connection((ip, SSH_PORT), timeout=1):
            return True
    except OSError:
        return False


def _recorded_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _log_tail(path: Path, lines: int = 10) -> str:
    try:
        return f"\n{path} ends with:\n" + "\n".join(path.read_text().splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _write_known_hosts(layout: LabDir, lab_id: LabId, specs: list[host_tree.HostSpec]) -> None:
    lines = []
    for spec in specs:
        public_key = layout.host_public_key(spec.index).read_text()
        lines.append(f"{lab_id.host_ip(spec.index)} {public_key.strip()}\n")
    layout.known_hosts.write_text("".join(lines))


def _check_ssh(lab: Lab) -> None:
    """Log in to every host the way tests and Ansible do; each must say its own name, and
    where it runs supervisord, that daemon's pid."""
    def answer_of(host: LabHost) -> str:
        command = "hostname" + (f" && {host.supervisorctl} pid" if host.supervisorctl else "")
        result = subprocess.run(lab.ssh_command(host, command), capture_output=True,
                                text=True, timeout=30, check=False)
        return result.stdout.strip() or result.stderr.strip()

    def healthy(host: LabHost, answer: str) -> bool:
        lines = answer.splitlines()
        return lines[:1] == [host.name] and (not host.supervisorctl or (
            len(lines) == 2 and lines[1].isdigit()))

    with ThreadPoolExecutor(max_workers=len(lab.hosts)) as pool:
        answers = list(pool.map(answer_of, lab.hosts))
    wrong = [f"{host.name}: {answer}" for host, answer in zip(lab.hosts, answers)
             if not healthy(host, answer)]
    if wrong:
        raise LabError("the hosts do not answer as built: " + "; ".join(wrong))


# --- inventory -------------------------------------------------------------------------------


def _inventory_marker(lab_dir: Path) -> str:
    return f"# lab dir: {lab_dir}\n"


def _write_inventory(lab: Lab) -> None:
    """The lab's hosts.yml. Lab 0's is inventory/lab/hosts.yml, beside the committed group_vars;
    another lab's inventory folder is in its lab dir, with a link to those group_vars."""
    folder = lab.inventory_path.parent
    if lab.inventory_path != INVENTORY_PATH:
        folder.mkdir(exist_ok=True)
        link = folder / "group_vars"
        if not link.is_symlink():
            link.symlink_to(INVENTORY_PATH.parent / "group_vars")
    group_vars = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(lab.private_key),
        "ansible_python_interpreter": host_tree.INTERPRETER,
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab.known_hosts} "
                                   "-o StrictHostKeyChecking=yes",
        # What the lab built, for verifications that compare the collection's facts with it.
        "lab_record": str(LabDir(lab.dir).record),
    }
    lines = [
        "# Written by tests/lab/lab.py up and removed by its down: do not edit.\n",
        _inventory_marker(lab.dir),
        "biv100:\n",
        "  vars:\n",
        *(f"    {key}: {json.dumps(value)}\n" for key, value in group_vars.items()),
        "  hosts:\n",
        *(f"    {host.name}:\n      ansible_host: {host.ip}\n"
          + (f"      engine_supervisorctl: {host.supervisorctl}\n" if host.supervisorctl else "")
          for host in lab.hosts),
        "  children:\n",
    ]
    groups = {"lab_" + variant.replace("-", "_"): [host.name for host in lab.hosts
                                                   if host.variant == variant]
              for variant in host_tree.VARIANTS}
    # The real engine's hosts, whose group_vars start it in its root and gate it on what a
    # model with random weights can show.
    groups[REAL_ENGINE_GROUP] = [host.name for host in lab.hosts
                                 if host.engine == host_tree.REAL_VLLM]
    for group, members in groups.items():
        lines.append(f"    {group}:\n      hosts:\n" if members else f"    {group}: {{}}\n")
        lines += [f"        {name}:\n" for name in members]
    lab.inventory_path.write_text("".join(lines))


# --- down ------------------------------------------------------------------------------------


def _teardown(layout: LabDir, lab_id: LabId) -> bool:
    """Remove lab `lab_id`, whole or half-built, and its lab dir's files; return whether there
    was anything to remove. Other labs' namespaces, processes and files are left alone."""
    record = _read_record_if_any(layout)
    indices = sorted(set(lab_id.netns_indices()) | set(layout.built_host_indices()))
    if not (indices or record or _link_exists(lab_id.bridge)):
        return False
    _close_ssh_masters(lab_id, indices)
    _stop_processes(layout, lab_id, indices)
    _remove_network(lab_id, indices)
    _release_machine()
    _remove_inventory(layout, lab_id)
    _remove_lab_files(layout)
    log.info("took lab %d in %s down", lab_id.number, layout.root)
    return True


def _read_record_if_any(layout: LabDir) -> dict | None:
    try:
        return _read_record(layout)
    except LabNotUpError:
        return None


def _close_ssh_masters(lab_id: LabId, indices: list[int]) -> None:
    # A master left running would outlive its host and hang the next run that reuses its socket.
    # Its socket is named after the host's address, which no other lab has.
    closers = [
        subprocess.Popen(["ssh", "-F", "none", "-o", f"ControlPath={ANSIBLE_CONTROL_PATH}",
                          "-O", "exit", f"root@{lab_id.host_ip(index)}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for index in indices
    ]
    for closer in closers:
        closer.wait()


def _stop_processes(layout: LabDir, lab_id: LabId, indices: list[int]) -> None:
    """Stop the hosts' sshds, then whatever else still runs in the hosts' namespaces."""
    recorded = [pid for index in indices
                if (pid := _recorded_pid(layout.pid_file(index)))
                and _is_our_sshd(pid, layout, index)]
    _signal(recorded, signal.SIGTERM)
    in_namespaces = [int(pid) for name in map(lab_id.host_name, lab_id.netns_indices())
                     for pid in _run(["ip", "netns", "pids", name]).stdout.split()]
    _signal(in_namespaces, signal.SIGTERM)
    survivors = _wait_for_exit(recorded + in_namespaces, STOP_GRACE_SECONDS)
    if survivors:
        log.info("killing processes that outlived SIGTERM: %s", survivors)
        _signal(survivors, signal.SIGKILL)
        _wait_for_exit(survivors, STOP_GRACE_SECONDS)


def _is_our_sshd(pid: int, layout: LabDir, index: int) -> bool:
    """Whether `pid` still is the host's sshd, not a process that reused its pid."""
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # A substring test: sshd rewrites its command line ("sshd: /usr/sbin/sshd -f ... [listener]").
    return str(layout.sshd_config(index)).encode() in command_line and is_running(pid)


def is_running(pid: int) -> bool:
    """Whether the process runs; a zombie does not (this machine's PID 1 reaps no orphans, so
    a killed daemon stays a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _wait_for_exit(pids: list[int], timeout: float) -> list[int]:
    """Wait until the processes are gone; return those still running at the timeout."""
    deadline = time.monotonic() + timeout
    running = [pid for pid in pids if is_running(pid)]
    while running and time.monotonic() < deadline:
        time.sleep(0.02)
        running = [pid for pid in running if is_running(pid)]
    return running


def _remove_network(lab_id: LabId, indices: list[int]) -> None:
    commands = [f"link del dev {lab_id.veth(index)}" for index in indices
                if _link_exists(lab_id.veth(index))]
    commands += [f"netns del {lab_id.host_name(index)}" for index in lab_id.netns_indices()]
    if _link_exists(lab_id.bridge):
        commands.append(f"link del dev {lab_id.bridge}")  # takes its route to the hosts with it
    if commands:
        _ip_batch(commands)


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, check=False).returncode == 0


def _release_machine() -> None:
    """Once no lab is left on the machine, undo what the labs changed there (the machine's
    record says what): remove the mount points they made and `ip netns add`'s mount of
    /run/netns. While another lab is up, its hosts still mount over those folders."""
    record = _read_json_if_any(MACHINE_RECORD)
    if record is None or labs_on_machine():
        return
    for path in record["created_mount_points"]:
        with contextlib.suppress(OSError):
            os.rmdir(path)  # only if still there and empty: something else may use it since
    if (record["netns_dir_before"] != "mount" and os.path.isdir(NETNS_DIR)
            and not os.listdir(NETNS_DIR)):
        if _is_mount_point(NETNS_DIR):
            _run(["umount", "-n", NETNS_DIR])
        if record["netns_dir_before"] == "absent":
            os.rmdir(NETNS_DIR)
    MACHINE_RECORD.unlink()


def _remove_inventory(layout: LabDir, lab_id: LabId) -> None:
    path = lab_id.inventory_path(layout.root)
    with contextlib.suppress(FileNotFoundError):
        if _inventory_marker(layout.root) in path.read_text():
            path.unlink()
    if path != INVENTORY_PATH:
        (path.parent / "group_vars").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def _remove_lab_files(layout: LabDir) -> None:
    with ThreadPoolExecutor(max_workers=BUILD_WORKERS) as pool:
        list(pool.map(lambda index: shutil.rmtree(layout.host(index)),
                      layout.built_host_indices()))
    with contextlib.suppress(FileNotFoundError):
        layout.hosts.rmdir()
    for path in (layout.record, _staged(layout.record), layout.known_hosts, layout.private_key,
                 layout.public_key):
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        layout.root.rmdir()  # only if empty: the lab dir may be a folder the user had before


# --- command line ----------------------------------------------------------------------------


def _parse_gpus(text: str) -> dict[str, int]:
    """`h2=2,h3=8` -> {"h2": 2, "h3": 8}."""
    gpus = {}
    for item in filter(None, text.split(",")):
        name, _equals, count = item.partition("=")
        if not count.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not HOST=COUNT, e.g. h2=2")
        gpus[name.strip()] = int(count)
    return gpus


def _parse_hosts(text: str) -> list[str]:
    """`h4,h5` -> ["h4", "h5"]; `none` -> []."""
    return [] if text.strip() == "none" else [name.strip() for name in text.split(",") if name.strip()]


def _print_status(layout: LabDir, lab_id: LabId) -> int:
    try:
        lab = load(layout.root)
    except LabError as error:
        print(error)
        running = running_lab_dir(lab_id.number)
        if running and running != layout.root:
            print(f"lab {lab_id.number} is up on this machine in {running}")
        return 1
    print(f"lab {lab.id.number} up in {lab.dir}, {len(lab.hosts)} hosts, "
          f"inventory {lab.inventory_path}")
    for host in lab.hosts:
        print(f"  {host.name:<9} {host.ip:<12} {host.variant:<19} {host.gpu_count:>2} GPUs  "
              f"vllm {host.vllm_version:<22} {host.engine:<7} sshd pid {host.sshd_pid}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--lab-id", type=int, default=None,
                        help=f"which lab, 0 to {MAX_LAB_ID} (default ${LAB_ID_ENV}, else "
                             f"{DEFAULT_LAB_ID}): its names, addresses and default lab dir")
    commands = parser.add_subparsers(dest="command", required=True)
    up_parser = commands.add_parser("up", help="build the lab's hosts and start them")
    up_parser.add_argument("--hosts", type=int, default=DEFAULT_HOSTS,
                           help=f"number of hosts, 1 to {MAX_HOSTS} (default {DEFAULT_HOSTS})")
    up_parser.add_argument("--gpus", type=_parse_gpus, default={},
                           help="GPU counts of some hosts, e.g. h2=2,h3=8 (default 4 each)")
    up_parser.add_argument("--real-engine", type=_parse_hosts, default=None,
                           help="the hosts whose engine is the real vLLM 0.10.1.1, e.g. h4, or "
                                "none (default: the last host)")
    up_parser.add_argument("--rebuild", action="store_true",
                           help="take the lab down first, even if it is up as asked")
    commands.add_parser("down", help="stop the hosts and remove everything the lab made")
    commands.add_parser("status", help="say whether the lab is up and healthy")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    start = time.monotonic()
    try:
        lab_id = LabId.resolve(args.lab_id)
        if args.command == "status":
            return _print_status(LabDir(resolve_lab_dir(lab_id=lab_id)), lab_id)
        if args.command == "up":
            real = [f"h{args.hosts}"] if args.real_engine is None else args.real_engine
            lab = up(args.hosts, args.gpus, rebuild=args.rebuild, lab_id=lab_id.number,
                     real_engines=real)
            print(f"lab {lab.id.number} up: {len(lab.hosts)} hosts, inventory "
                  f"{lab.inventory_path} ({time.monotonic() - start:.2f} s)")
        else:
            down(lab_id=lab_id.number)
            print(f"lab down ({time.monotonic() - start:.2f} s)")
    except (LabError, host_tree.BuildError, real_engine.RuntimeBuildError) as error:
        print(f"lab {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
