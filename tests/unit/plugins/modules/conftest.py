"""Running a module's main() as Ansible runs it on a host, for the module tests."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
from ansible.module_utils import _internal as module_utils_internal
from ansible.module_utils.common import warnings
from ansible.module_utils.testing import patch_module_args


class ModuleRun(NamedTuple):
    failed: bool
    result: dict


@pytest.fixture(autouse=True)
def as_on_a_host(monkeypatch):
    """A fresh host-side process: importing controller code (some tests do) would send module
    warnings to the controller's display instead of the result, and warnings accumulate
    process-wide."""
    monkeypatch.setattr(module_utils_internal, "is_controller", False)
    monkeypatch.setattr(warnings, "_global_warnings", {})


@pytest.fixture
def run_module(capsys):
    """run_module(module, args) -> ModuleRun: main() with args, its exit status and JSON."""

    def run(module, args: dict) -> ModuleRun:
        with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
            module.main()
        return ModuleRun(exit_info.value.code != 0, json.loads(capsys.readouterr().out))

    return run
