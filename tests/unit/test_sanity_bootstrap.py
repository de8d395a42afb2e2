"""tests/sanity/pip_bootstrap.py: seeding ansible-test's cache with the ensurepip stand-in."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest
from ansible_test._internal.python_requirements import get_venv_packages

SCRIPT = Path(__file__).resolve().parents[1] / "sanity" / "pip_bootstrap.py"


@pytest.fixture
def bootstrap():
    spec = importlib.util.spec_from_file_location("pip_bootstrap", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cached_name():
    """The file the installed ansible-test runs instead of downloading get-pip.py."""
    pip = get_venv_packages(types.SimpleNamespace(version="3.11"))["pip"]
    return "get_pip_%s.py" % pip.replace(".", "_")


def test_seeding_puts_the_stand_in_where_ansible_test_looks(tmp_path, bootstrap):
    written = bootstrap.seed(str(tmp_path))
    assert written == [str(tmp_path / cached_name())]
    assert (tmp_path / cached_name()).read_bytes() == SCRIPT.read_bytes()
    assert bootstrap.seed(str(tmp_path)) == []


def test_an_older_copy_is_replaced_and_a_real_get_pip_left_alone(tmp_path, bootstrap):
    cached = tmp_path / cached_name()
    cached.write_bytes(SCRIPT.read_bytes().splitlines(keepends=True)[0] + b"# an older copy\n")
    assert bootstrap.seed(str(tmp_path)) == [str(cached)]
    cached.write_text("#!/usr/bin/env python\n# get-pip.py, downloaded by hand\n")
    assert bootstrap.seed(str(tmp_path)) == []
    assert "downloaded by hand" in cached.read_text()


def test_get_pips_own_switches_are_not_passed_to_pip(monkeypatch, bootstrap):
    commands = []
    monkeypatch.setattr(bootstrap.subprocess, "run", lambda command, check: commands.append(command))
    bootstrap.bootstrap(["--disable-pip-version-check", "pip==24.2", "--no-setuptools", "--no-wheel"])
    assert commands[0][1:] == ["-m", "ensurepip", "--upgrade"]
    assert commands[-1][1:] == ["-m", "pip", "install", "--upgrade", "--disable-pip-version-check", "pip==24.2"]
