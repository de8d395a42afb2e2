"""What every role shares is defined once, in the serving role's defaults: a role's own parameter
defaults to one of them, never to a value of its own, and a role that reads one depends on the
serving role, which makes it defined wherever the role runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR

REPO = Path(__file__).resolve().parents[3]
SHARED = yaml.safe_load((REPO / "roles" / "serving" / "defaults" / "main.yml").read_text())
ROLES = sorted(path.name for path in (REPO / "roles").iterdir() if path.name != "serving")


def role_text(role: str) -> str:
    """The role's defaults, vars and tasks, where it reads variables."""
    folder = REPO / "roles" / role
    return "".join(path.read_text() for kind in ("defaults", "vars", "tasks")
                   for path in sorted((folder / kind).glob("*.yml")))


def reads(text: str) -> set[str]:
    return {name for name in SHARED if re.search(rf"\b{name}\b", text)}


def test_the_state_store_is_the_modules_own_default():
    # A module called without its role stores where the roles do.
    assert SHARED["serving_state_dir"] == DEFAULT_STATE_DIR


def test_the_serving_role_documents_every_variable_it_defines():
    specs = yaml.safe_load((REPO / "roles" / "serving" / "meta" / "argument_specs.yml").read_text())
    assert set(specs["argument_specs"]["defaults"]["options"]) == set(SHARED)


@pytest.mark.parametrize("role", ROLES)
def test_a_role_depends_on_the_serving_role_exactly_when_it_reads_a_shared_variable(role):
    meta = yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text())
    depends = [entry.get("role") if isinstance(entry, dict) else entry for entry in meta.get("dependencies") or ()]
    shared = sorted(reads(role_text(role)))
    assert depends == (["biv100.serving.serving"] if shared else []), f"{role} reads {shared}"


# Its own value defaulted, not another host's (hostvars[name].serving_state_dir, that host's
# inventory or else the modules' default, which is the serving role's).
DEFAULTED = re.compile(rf"(?<!\]\.)\b({'|'.join(SHARED)})\s*\|\s*default\(")


@pytest.mark.parametrize("role", ROLES)
def test_no_role_gives_a_shared_variable_a_default_of_its_own(role):
    assert DEFAULTED.findall(role_text(role)) == []


def test_a_shared_variable_given_a_default_of_its_own_is_found():
    assert reads("gates_bench_workload: \"{{ serving_bench_workload | default('default') }}\"\n") == {
        "serving_bench_workload"}
    assert DEFAULTED.findall("x: \"{{ serving_state_dir | default(omit) }}\"") == ["serving_state_dir"]
    assert DEFAULTED.findall("x: \"{{ hostvars[name].serving_state_dir | default(omit) }}\"") == []
