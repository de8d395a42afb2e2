"""Real upstream vLLM source trees, fetched once through pip and cached.

The lab's hosts and the unit tests need the package tree of real vLLM releases (the `vllm/`
folder of the source distribution) without building them: building an sdist's metadata imports
torch and, for recent releases, a Rust toolchain. pip is asked to download the sdist with
`--no-clean` into a temporary folder of ours; whether or not the metadata step then fails, pip
has already unpacked the archive there, and that unpacked tree is the real release. The tree and
its PKG-INFO are kept under the cache folder, so every later build works offline.

    python tests/lab/vllm_sources.py 0.10.1.1 0.33.0      # fetch (if needed) and print the paths
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The releases the project works with: the lab's base (closest public relative of the vendor
# fork) and the layouts the facts module must resolve.
LAB_BASE_VERSION = "0.10.1.1"
LAYOUT_VERSIONS = ("0.8.5", "0.10.1.1", "0.11.0", "0.33.0")


def cache_root() -> Path:
    base = os.environ.get("BIV100_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "biv100-serving"
    )
    return Path(base) / "vllm-src"


class FetchError(RuntimeError):
    pass


def ensure_tree(version: str) -> Path:
    """Return the cached release folder holding `vllm/` and `PKG-INFO`, fetching it if absent."""
    root = cache_root()
    dest = root / version
    if (dest / "PKG-INFO").is_file() and (dest / "vllm" / "__init__.py").is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers must not fetch the same release
        if (dest / "PKG-INFO").is_file():
            return dest
        with tempfile.TemporaryDirectory(dir=root, prefix=f".fetch-{version}-") as work:
            _download_unpacked(version, Path(work))
            unpacked = _find_unpacked(Path(work), version)
            staged = Path(work) / "staged"
            staged.mkdir()
            shutil.move(str(unpacked / "vllm"), staged / "vllm")
            shutil.copy2(unpacked / "PKG-INFO", staged / "PKG-INFO")
            os.replace(staged, dest)  # atomic: a half-copied tree is never seen as cached
    return dest


def _download_unpacked(version: str, work: Path) -> None:
    env = dict(os.environ, TMPDIR=str(work), PIP_DISABLE_PIP_VERSION_CHECK="1")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--no-build-isolation", "--no-clean", "-d", str(work / "dl"), f"vllm=={version}",
    ]
    # The exit status is ignored on purpose: the metadata step is expected to fail (no torch);
    # what matters is whether the unpacked tree is there, which _find_unpacked checks.
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    (work / "pip.log").write_text(proc.stdout + proc.stderr)


def _find_unpacked(work: Path, version: str) -> Path:
    for pkg_info in sorted(work.glob("pip-*/*/PKG-INFO")):
        tree = pkg_info.parent
        if (tree / "vllm" / "__init__.py").is_file() and _pkg_info_version(pkg_info) == version:
            return tree
    log = (work / "pip.log").read_text() if (work / "pip.log").exists() else ""
    raise FetchError(
        f"pip did not unpack the vllm {version} source release; its output ends with:\n"
        + "\n".join(log.splitlines()[-15:])
    )


def _pkg_info_version(pkg_info: Path) -> str:
    for line in pkg_info.read_text(errors="replace").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return ""


def main(argv: list[str]) -> int:
    versions = argv or list(LAYOUT_VERSIONS)
    for version in versions:
        print(ensure_tree(version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
