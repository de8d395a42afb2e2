"""What the integration tests read off the lab hosts and write into payload copies."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import yaml

# Re-exported: the tests find their helpers here.
from lab import descendants  # noqa: F401  # pylint: disable=unused-import
from playbook_runs import REPO

from ansible_collections.biv100.serving.plugins.module_utils._run_processes import RUN_MARKER
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR as STATE
# What a healthy engine's probe summary starts with: every probe of the default suite passed.
DEFAULT_PROBES = len(yaml.safe_load((REPO / "files" / "probes" / "default.yml").read_text()))
ALL_PROBES_PASSED = f"{DEFAULT_PROBES}/{DEFAULT_PROBES} probes passed"
REGISTRY = "model_executor/models/registry.py"
CHAT = "entrypoints/openai/serving_chat.py"
PROTOCOL = "entrypoints/openai/protocol.py"
PAYLOAD = REPO / "files" / "serving"
PID_FILE = "/run/biv100-serving/vllm.pid"


def host_of(lab, variant):
    return next(host for host in lab.hosts if host.variant == variant)


def package_file(host, path) -> Path:
    return host.path(f"{host.package_root}/{path}")


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def serving_digests(lab) -> dict[str, str | None]:
    return {f"{host.name}:{path}": digest(package_file(host, path))
            for host in lab.hosts for path in (REGISTRY, CHAT, PROTOCOL)}


def host_state(lab) -> dict[str, str]:
    """Every file under each host's state dir and vllm package, with its digest."""
    files = {}
    for host in lab.hosts:
        for top in (STATE, host.package_root):
            root = host.path(top)
            for path in sorted(root.rglob("*")) if root.exists() else ():
                if path.is_file() and "__pycache__" not in path.parts:
                    files[f"{host.name}:{path}"] = digest(path)
    return files


def engine_pids(lab) -> dict[str, int]:
    return {host.name: int(host.path(PID_FILE).read_text()) for host in lab.hosts}


def engine_process(host, name: str = "vllm") -> tuple[list[str], dict[str, str]]:
    """The running engine's command line and environment, as the kernel has them; `name` is the
    instance's on a host that runs several."""
    pid = int(host.path(PID_FILE.replace("vllm.pid", f"{name}.pid")).read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if item)
    return argv, environ


def option_values(argv: list[str]) -> dict[str, str | None]:
    """--option value pairs of a command line; flags without a value map to None."""
    options, index = {}, 0
    while index < len(argv):
        word = argv[index]
        if word.startswith("--"):
            has_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
            options[word] = argv[index + 1] if has_value else None
            index += 2 if has_value else 1
        else:
            index += 1
    return options


def lock_holder(host) -> dict | None:
    """The run that holds the host's lock, None while it is free."""
    try:
        return json.loads(host.path(f"{STATE}/lock").read_text())
    except FileNotFoundError:
        return None


def run_pids(run_id: str) -> list[int]:
    """The processes that carry the run's marker in their environment (its modules, as the
    playbooks mark them): on every lab host at once, since the hosts share this machine's
    processes."""
    marker = f"{RUN_MARKER}={run_id}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue  # ended meanwhile
    return sorted(found)


def start_ticks(pid: int) -> int:
    """When the process started, in clock ticks after boot (its stat's 22nd field)."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return int(raw[raw.rindex(b")") + 2:].split()[19])


def current_release(host) -> dict:
    link = host.path(f"{STATE}/current")
    return json.loads((link.parent / os.readlink(link) / "release.json").read_text())


def recorded(record: dict, part: str, instance: str = "vllm") -> dict:
    """One engine instance's entry in a release record's engine or gates ({"instances": {...}})."""
    return record[part]["instances"][instance]


def copy_payload(tmp_path: Path) -> Path:
    payload = tmp_path / "payload"
    subprocess.run(["cp", "-r", str(PAYLOAD), str(payload)], check=True)
    return payload


def add_entry(payload: Path, entry: dict) -> None:
    manifest = payload / "manifest.yml"
    document = yaml.safe_load(manifest.read_text())
    document["entries"].append(entry)
    manifest.write_text(yaml.safe_dump(document, sort_keys=False))


def overlay(payload: Path, name: str, dest: str, text: str, **extra) -> None:
    source = payload / "overlays" / name
    source.parent.mkdir(exist_ok=True)
    source.write_text(text)
    add_entry(payload, {"name": name, "kind": "file", "src": f"overlays/{name}", "dest": dest, **extra})
