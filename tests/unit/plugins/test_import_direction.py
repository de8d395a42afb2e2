"""Imports point one way: what the callback, the actions and the filters share lives in
plugin_utils (or module_utils), and no plugin imports a callback or a filter, whose files are
entry points Ansible loads by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"
PACKAGE = "ansible_collections.biv100.serving.plugins"
ENTRY_POINTS = ("callback", "filter")


def imported_modules(path: Path, plugins: Path) -> list[str]:
    """The dotted name of every module an import statement of the file (under the folder
    plugins) names, relative imports resolved against the file's own package."""
    package = [PACKAGE, *path.relative_to(plugins).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            # `from ..plugins import filter` names the package filter itself.
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return found


def entry_point_imports(path: Path, plugins: Path = PLUGINS) -> list[str]:
    return sorted({name for name in imported_modules(path, plugins)
                   for kind in ENTRY_POINTS
                   if name == f"{PACKAGE}.{kind}" or name.startswith(f"{PACKAGE}.{kind}.")})


def test_no_plugin_imports_a_callback_or_a_filter():
    importers = {str(path.relative_to(PLUGINS)): entry_point_imports(path)
                 for path in sorted(PLUGINS.rglob("*.py"))}
    assert {name: imports for name, imports in importers.items() if imports} == {}


@pytest.mark.parametrize("source", [
    "from ansible_collections.biv100.serving.plugins.callback.ledger import project_root",
    "from ansible_collections.biv100.serving.plugins.filter import probe_summary",
    "import ansible_collections.biv100.serving.plugins.filter.engine_cli_args",
    "from ..filter.engine_cli_args import engine_cli_args",
    "from .. import callback",
])
def test_the_scan_finds_every_spelling_of_such_an_import(tmp_path, source):
    plugin = tmp_path / "action" / "example.py"
    plugin.parent.mkdir()
    plugin.write_text(f"{source}\n")
    assert entry_point_imports(plugin, tmp_path)


def test_the_scan_lets_plugin_utils_and_ansibles_own_callbacks_through(tmp_path):
    plugin = tmp_path / "callback" / "example.py"
    plugin.parent.mkdir()
    plugin.write_text("from ansible.plugins.callback import CallbackBase\n"
                      "from ansible_collections.biv100.serving.plugins.plugin_utils._report import figure_cells\n"
                      "from ..plugin_utils import _report\n")
    assert entry_point_imports(plugin, tmp_path) == []
