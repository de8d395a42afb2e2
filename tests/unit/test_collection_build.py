"""`ansible-galaxy collection build` packs the collection and nothing that tools and runs leave in
the checkout: galaxy.yml's build_ignore is proven on a copy of the checkout's files with each such
path planted in it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

# What the tools and runs of this project create in a checkout, by the tool that does.
LEFT_BY_TOOLS_AND_RUNS = [
    ".venv/bin/python3",                                         # make setup
    ".venv-2.21/bin/python3",                                    # make setup-2.21
    ".lock-venv/bin/python3",                                    # make lock
    ".lock-venv-2.21/bin/python3",                               # make lock-2.21
    ".ansible/collections/ansible_collections/biv100/serving/galaxy.yml",  # ansible-lint, molecule
    ".ansible/roles/placeholder/tasks/main.yml",
    ".pytest_cache/v/cache/nodeids",                             # pytest
    ".mypy_cache/3.11/ledger.data.json",
    ".ruff_cache/content",
    "plugins/callback/__pycache__/ledger.cpython-311.pyc",       # Python
    "build/probes/20261129T200000Z-1/lab-h1.json",               # the probe role
    "build/submissions/sub510/patch_ops.sh",                     # submission.yml
    "build/submissions/sub510.tar.gz",
    "build/ee/Containerfile",                                    # ansible-builder, as documented
    "context/Containerfile",                                     # ansible-builder's default context
    "artifacts/0f1e/stdout",                                     # ansible-runner
    "tests/output/junit/python3.11-sanity.xml",                  # ansible-test
    "inventory/lab/hosts.yml",                                   # tests/lab/lab.py up
    "ledger/lab/ledger.jsonl",                                   # the ledger callback
    "ledger/lab/LEDGER.md",
    "ledger/biv100/ledger.jsonl",
    "biv100-serving-0.1.0.tar.gz",                               # an earlier build
]


def first_new(tree: Path, name: str) -> str:
    """The outermost part of the path name that the checkout does not have (the folder a tool made)."""
    parts = Path(name).parts
    return next(str(Path(*parts[:depth])) for depth in range(1, len(parts) + 1)
                if not (tree / Path(*parts[:depth])).exists())


@pytest.fixture(scope="module")
def built(tmp_path_factory, checkout_copy) -> tuple[list[str], dict[str, str]]:
    """The names in the tarball built from a checkout in which every tool has run, and for each
    path left, the folder (or file) that only the tool made."""
    tree = checkout_copy(tmp_path_factory.mktemp("checkout"))
    made = {name: first_new(tree, name) for name in LEFT_BY_TOOLS_AND_RUNS}
    for name in LEFT_BY_TOOLS_AND_RUNS:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("left by a tool or a run\n")
    output = tmp_path_factory.mktemp("built")
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    done = subprocess.run([str(galaxy), "collection", "build", "--output-path", str(output), str(tree)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    [tarball] = output.glob("biv100-serving-*.tar.gz")
    with tarfile.open(tarball) as archive:
        return [member.name.rstrip("/") for member in archive.getmembers()], made


@pytest.mark.parametrize("left", LEFT_BY_TOOLS_AND_RUNS)
def test_nothing_a_tool_or_a_run_left_is_packed(built, left):
    names, made = built
    packed = [name for name in names if name == made[left] or name.startswith(made[left] + "/")]
    assert packed == [], f"{made[left]} (made for {left}) is in the collection: {packed}"


def test_the_collection_is_packed(built):
    built, _made = built
    for name in ("MANIFEST.json", "FILES.json", "README.md", "meta/runtime.yml", "plugins/callback/ledger.py",
                 "plugins/modules/serving_overlay.py", "roles/stage/tasks/main.yml", "playbooks/deploy.yml",
                 "files/serving/manifest.yml", "files/probes/default.yml"):
        assert name in built, name
    assert not any(name.startswith("collections") for name in built)  # the link back to the checkout
