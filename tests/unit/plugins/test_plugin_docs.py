"""Every plugin documents itself in YAML that parses: ansible-doc and the argument checks read it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"
DOCUMENTED = sorted([*PLUGINS.glob("modules/*.py"), *PLUGINS.glob("callback/*.py")])
FILTER_DOCS = sorted(PLUGINS.glob("filter/*.yml"))
FRAGMENTS = sorted(path.stem for path in PLUGINS.glob("doc_fragments/*.py"))


def documentation_strings(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {node.targets[0].id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN")}


@pytest.mark.parametrize("path", DOCUMENTED, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_documentation_strings_parse(path):
    strings = documentation_strings(path)
    expected = {"DOCUMENTATION", "EXAMPLES", "RETURN"} if path.parent.name == "modules" else {"DOCUMENTATION"}
    assert expected <= set(strings)
    documentation = yaml.safe_load(strings["DOCUMENTATION"])
    assert documentation["short_description"] and documentation.get("description")
    for name in set(strings) - {"DOCUMENTATION"}:
        yaml.safe_load(strings[name])


@pytest.mark.parametrize("path", FILTER_DOCS, ids=lambda path: path.name)
def test_the_filter_documentation_parses(path):
    document = yaml.safe_load(path.read_text())
    assert document["DOCUMENTATION"]["short_description"] and "RETURN" in document


@pytest.mark.parametrize("name", FRAGMENTS)
def test_each_doc_fragment_parses_and_is_used(name):
    fragment = importlib.import_module(f"ansible_collections.biv100.serving.plugins.doc_fragments.{name}")
    documented = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)
    assert documented.get("options") or documented.get("attributes"), name
    users = [path.name for path in DOCUMENTED
             if f"biv100.serving.{name}" in (yaml.safe_load(documentation_strings(path)["DOCUMENTATION"])
                                             .get("extends_documentation_fragment") or [])]
    assert len(users) >= 2, users
