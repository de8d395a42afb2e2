"""meta/runtime.yml declares the ansible-core lines `make test` runs the collection on - the one
each controller environment pins - every release of them, and no other line."""

from __future__ import annotations

from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
# The controller environments `make test` runs: .venv and .venv-2.21.
ENVIRONMENTS = ("requirements.txt", "requirements-2.21.txt")


def pinned_core(name: str) -> Version:
    [line] = [line for line in (REPO / name).read_text().splitlines() if line.startswith("ansible-core==")]
    return Version(line.partition("==")[2])


def test_requires_ansible_admits_every_release_of_the_tested_lines_and_no_other_line():
    declared = SpecifierSet(yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())["requires_ansible"])
    tested = {pinned_core(name) for name in ENVIRONMENTS}
    assert {str(version) for version in tested if version in declared} == {str(version) for version in tested}
    lines = {(version.major, version.minor) for version in tested}
    assert len(lines) == len(ENVIRONMENTS)  # each environment its own line
    for minor in range(16, 26):
        admitted = {Version(f"2.{minor}.{patch}") in declared for patch in range(0, 40)}
        assert admitted == {(2, minor) in lines}, f"ansible-core 2.{minor}"
