"""The competition - its gates, their bounds and the score's weights - is defined once, in the serving
role's defaults (serving_competition), and passed to every filter and module that needs it: no
other file of the collection or the playbook project carries a copy that could drift from it.

What counts as a copy is code, never documentation. In Python, only literals of the syntax tree
count (a number, a list, tuple, set or dict written out), so docstrings, the DOCUMENTATION,
EXAMPLES and RETURN strings and comments never do. In YAML, only the loaded data counts (never a
comment), and a Jinja expression in a string is code; a plugin's documentation file
(plugins/*/*.yml) and a role's argument specs are documentation, as are Markdown, docs/ and
changelogs/. In a template, what is inside a Jinja tag is code and the rest is the text it renders.
The tests are left out: they take the values from the role (tests/shared/gates_defaults.py) or
pin what a message says."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from gates_defaults import COMPETITION

REPO = Path(__file__).resolve().parents[3]
DEFINITION = "roles/serving/defaults/main.yml"
BOUNDS = (8000, 0.83, 0.17, 0.04)
GATES = frozenset(COMPETITION)
NUMBER = re.compile(r"(?<![\w.])(?:8000|0\.83|0\.17|0\.04)(?![\w.])")
JINJA_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)


def test_the_serving_role_defines_the_competition():
    # The competition's rules, as the brief states them.
    assert COMPETITION == {"functional": {"min_probes": 50}, "quality": {"bound": 0.04},
                           "throughput": {"score": 8000, "weights": {"output": 0.83, "input": 0.17}}}
    assert list(COMPETITION) == ["functional", "quality", "throughput"]


# --- finding copies -----------------------------------------------------------------------------


def is_bound(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value in BOUNDS


def names_every_gate(names) -> bool:
    return GATES <= {name for name in names if isinstance(name, str)}


def is_min_probes(node) -> bool:
    return isinstance(node, ast.Constant) and node.value == "min_probes"


def python_copies(text: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and is_bound(node.value):
            found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            if names_every_gate(element.value for element in node.elts if isinstance(element, ast.Constant)):
                found.append(f"line {node.lineno}: the list of gates")
        elif isinstance(node, ast.Dict):
            keys = [key.value for key in node.keys if isinstance(key, ast.Constant)]
            if names_every_gate(keys):
                found.append(f"line {node.lineno}: a dict of every gate")
            found += [f"line {node.lineno}: min_probes" for key, value in zip(node.keys, node.values)
                      if is_min_probes(key) and isinstance(value, ast.Constant)]
        elif isinstance(node, ast.keyword) and node.arg == "min_probes" and isinstance(node.value, ast.Constant):
            found.append(f"line {node.value.lineno}: min_probes")
        elif isinstance(node, ast.Call) and len(node.args) == 2 and is_min_probes(node.args[0]) \
                and isinstance(node.args[1], ast.Constant):
            found.append(f"line {node.lineno}: a default of min_probes")
    return found


def jinja_copies(text: str) -> list[str]:
    found = []
    for tag in JINJA_TAG.findall(text):
        found += [f"{number} in {tag!r}" for number in NUMBER.findall(tag)]
        if all(gate in tag for gate in GATES):
            found.append(f"the list of gates in {tag!r}")
        if re.search(r"min_probes\W{1,4}\d", tag):
            found.append(f"min_probes in {tag!r}")
    return found


class AnyTagLoader(yaml.SafeLoader):
    """YAML as Ansible writes it: a tagged value (!vault, !unsafe) is read as its text."""


AnyTagLoader.add_multi_constructor("!", lambda loader, _tag, node: loader.construct_scalar(node)
                                   if isinstance(node, yaml.ScalarNode) else None)


def yaml_copies(text: str) -> list[str]:
    found = []

    def walk(value, path):
        where = "/".join(map(str, path)) or "(top)"
        if isinstance(value, dict):
            if names_every_gate(value):
                found.append(f"{where}: a mapping of every gate")
            for key, item in value.items():
                if key == "min_probes" and not isinstance(item, str):
                    found.append(f"{where}/min_probes: {item!r}")
                walk(item, [*path, key])
        elif isinstance(value, list):
            if names_every_gate(value):
                found.append(f"{where}: the list of gates")
            for index, item in enumerate(value):
                walk(item, [*path, index])
        elif isinstance(value, str):
            found.extend(f"{where}: {copy}" for copy in jinja_copies(value))
        # A port is not a bound: vLLM's default port is 8000 too.
        elif is_bound(value) and not str(path[-1] if path else "").endswith("port"):
            found.append(f"{where}: {value!r}")

    for document in yaml.load_all(text, Loader=AnyTagLoader):
        walk(document, [])
    return found


def is_documentation(name: str) -> bool:
    parts = name.split("/")
    return (parts[0] in ("tests", "docs", "changelogs", "LICENSES") or name.endswith(".md")
            or (parts[0] == "plugins" and name.endswith((".yml", ".yaml")))
            or (parts[0] == "roles" and parts[2:] == ["meta", "argument_specs.yml"]))


def copies_in(name: str, text: str) -> list[str]:
    if name.endswith(".py"):
        return python_copies(text)
    if name.endswith((".yml", ".yaml")):
        return yaml_copies(text)
    if name.endswith(".j2"):
        return jinja_copies(text)
    return []


def test_no_file_but_the_serving_role_defaults_holds_the_competitions_bounds_or_its_list_of_gates():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    holders = {}
    for name in listed:
        path = REPO / name
        if is_documentation(name) or path.is_symlink() or not path.is_file():
            continue
        found = copies_in(name, path.read_text(encoding="utf-8"))
        if found:
            holders[name] = found
    assert sorted(holders) == [DEFINITION], {name: found for name, found in holders.items() if name != DEFINITION}


# --- the finding itself can fail ------------------------------------------------------------------


@pytest.mark.parametrize("name, text", [
    ("plugins/plugin_utils/x.py", "SCORE_GATE = 8000\n"),
    ("plugins/plugin_utils/x.py", "WEIGHTS = {'output': 0.83, 'input': 0.17}\n"),
    ("plugins/filter/x.py", "def compare(score, bound=0.04):\n    pass\n"),
    ("plugins/filter/x.py", "GATES = ('functional', 'quality', 'throughput')\n"),
    ("plugins/filter/x.py", "needed = bounds.get('min_probes', 50)\n"),
    ("plugins/module_utils/x.py", "spec = dict(gate=dict(type='float', default=8000.0))\n"),
    ("roles/gates/tasks/main.yml", "- {name: x, debug: {msg: \"{{ score | default(8000) }}\"}}\n"),
    ("playbooks/x.yml", "- {hosts: all, vars: {serving_gates: {throughput: {weights: {output: 0.83}}}}}\n"),
    ("inventory/biv100/group_vars/all.yml", "serving_gates: {functional: {}, quality: {}, throughput: {}}\n"),
    ("inventory/biv100/group_vars/all.yml", "serving_gates: {functional: {min_probes: 40}}\n"),
    ("files/report/x.html.j2", "{% for gate in ['functional', 'quality', 'throughput'] %}{% endfor %}\n"),
], ids=["constant", "weights", "default", "gate-list", "min-probes-default", "float", "jinja", "yaml-weight",
        "yaml-gates", "yaml-min-probes", "template"])
def test_a_copy_is_found(name, text):
    assert copies_in(name, text)


@pytest.mark.parametrize("name, text", [
    ("plugins/modules/x.py", 'DOCUMENTATION = r"""\noptions:\n  gate: {type: float, default: 8000}\n"""\n'),
    ("plugins/modules/x.py", '"""The competition weighs output 0.83, input 0.17."""\nURL = "http://127.0.0.1:8000"\n'),
    ("plugins/filter/x.py", "measured = {'quality': q, 'throughput': b}\nfunctional = name == 'functional'\n"),
    ("roles/engine/defaults/main.yml", "engine_port: 8000  # the score gate is 8000 too\n"),
    ("roles/gates/tasks/main.yml", "- {name: x, when: \"'quality' in gates or 'throughput' in gates\"}\n"),
    ("inventory/biv100/group_vars/all.yml", "engine_api_key: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3800\n"),
    ("files/submission/README.md.j2", "| functional | quality | throughput | 8000 |\n{{ release }}\n"),
], ids=["documentation", "docstring-and-port-url", "judges", "port", "jinja-names-two", "vault", "template-text"])
def test_documentation_ports_and_single_gate_names_are_no_copies(name, text):
    assert copies_in(name, text) == []
