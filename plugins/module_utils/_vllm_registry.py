# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The architectures a vllm model registry serves, and whether it serves a model.

Runs on the host: standard library only, Python 3.8. registry.py is parsed with ast, never
imported or executed: importing it pulls in torch and the whole model stack.

vllm builds its ModelRegistry from `_VLLM_MODELS`, a dict merged from per-task tables
(`_TEXT_GENERATION_MODELS`, `_EMBEDDING_MODELS`, ...). The module-level assignments are
replayed in source order, as executing the module would, for the forms the 0.8.5 to 0.33.0
registries use:

    "Arch": ("module", "Class")         a literal entry
    **_OTHER_TABLE                      a merge of a table assigned earlier
    **{k: (mod, arch) for k, (mod, arch) in _OTHER_TABLE.items() if arch == "X"}
                                        a filtered copy; conditions made of comparisons,
                                        `and`, `or` and `not` over the loop's names and
                                        literals are evaluated

Anything else inside a table (a call, a computed key, an unknown name) is left out and
reported in `unresolved` with its line. A comprehension whose condition cannot be evaluated
keeps all of its entries and is reported too: a registered architecture must not be hidden
by a condition the reader does not understand.
"""

from __future__ import annotations

import ast
import glob
import json
import operator
import os
import re

MERGED_TABLE = "_VLLM_MODELS"
MODELS_DIR = "model_executor/models"
QWEN3_5_PREFIX = "Qwen3_5"

_SNIPPET_LENGTH = 60


class RegistryError(Exception):
    """registry.py cannot be read as a model registry; the message names the file and line."""


def registry_facts(package_root, relative_path):
    """What the registry at relative_path (None: the package has none) declares.

    A registry that is missing or does not parse is reported in `error`, with no
    architectures, rather than raised: the caller decides whether that stops a deployment.
    """
    facts = {
        "path": relative_path,
        "architectures": {},
        "has_qwen3_5": False,
        "unresolved": [],
        "error": None,
    }
    try:
        architectures, unresolved = _read_registry(package_root, relative_path)
    except RegistryError as error:
        facts["error"] = str(error)
        return facts
    facts.update(
        architectures=architectures,
        has_qwen3_5=any(name.startswith(QWEN3_5_PREFIX) for name in architectures),
        unresolved=unresolved,
    )
    return facts


def _read_registry(package_root, relative_path):
    if relative_path is None:
        raise RegistryError("%s/registry.py: not found in the vllm package" % MODELS_DIR)
    try:
        with open(os.path.join(package_root, relative_path), encoding="utf-8") as stream:
            source = stream.read()
    except (OSError, UnicodeDecodeError) as error:
        raise RegistryError("%s: %s" % (relative_path, error))
    return parse_registry(source, relative_path)


def parse_registry(source, filename="registry.py"):
    """Return (architectures, unresolved) for the source of a registry.py.

    architectures maps each name of `_VLLM_MODELS` to [module, class]; unresolved lists,
    as "<file> line <n>: <why>", what could not be evaluated. Raises RegistryError when the
    source does not parse or assigns no `_VLLM_MODELS`.
    """
    try:
        module = ast.parse(source, filename)
    except SyntaxError as error:
        raise RegistryError("%s line %s: %s" % (filename, error.lineno, error.msg))
    except ValueError as error:  # null bytes, before Python 3.12 made it a SyntaxError
        raise RegistryError("%s: %s" % (filename, error))
    reader = _TableReader(source, filename)
    for statement in module.body:
        reader.read(statement)
    if MERGED_TABLE not in reader.tables:
        raise RegistryError("%s: no module-level %s dict" % (filename, MERGED_TABLE))
    return reader.tables[MERGED_TABLE], reader.unresolved


class _TableReader:
    """Replays module-level assignments of architecture tables (name -> [module, class])."""

    def __init__(self, source, filename):
        self._source = source
        self._filename = filename
        self.tables = {}
        self.unresolved = []

    def read(self, statement):
        names = _assigned_names(statement)
        table = self._table(statement.value) if names else None
        if table is not None:
            for name in names:
                self.tables[name] = table

    def _table(self, node):
        """The table `node` builds, or None when it is not one (or not one this reader follows)."""
        builders = {
            ast.Name: self._named_table,
            ast.Dict: self._literal_table,
            ast.DictComp: self._filtered_copy,
        }
        build = builders.get(type(node))
        return build(node) if build else None

    def _named_table(self, node):
        return self.tables.get(node.id)

    def _literal_table(self, node):
        if not _looks_like_table(node):
            return None
        table = {}
        for key, value in zip(node.keys, node.values):
            if key is None:
                self._merge(table, value)
            else:
                self._add(table, key, value)
        return table

    def _merge(self, table, node):
        merged = self._table(node)
        if merged is None:
            self._report(node, "cannot expand **")
        else:
            table.update(merged)

    def _add(self, table, key, value):
        try:
            name, pair = _entry(key, value, {})
        except _Unsupported:
            self._report(key, 'not an "Arch": ("module", "Class") entry')
        else:
            table[name] = pair

    def _filtered_copy(self, node):
        """`{k: (mod, arch) for k, (mod, arch) in _TABLE.items() if ...}` over a known table."""
        source = _iterated_table(node)
        if source not in self.tables:
            return None
        generator = node.generators[0]
        table = {}
        undecided = False
        try:
            for name, pair in self.tables[source].items():
                bindings = {}
                _bind(generator.target, (name, tuple(pair)), bindings)
                keep, decided = _conditions_hold(generator.ifs, bindings)
                undecided = undecided or not decided
                if keep:
                    copied_name, copied_pair = _entry(node.key, node.value, bindings)
                    table[copied_name] = copied_pair
        except _Unsupported:
            return None
        if undecided:
            self._report(generator.ifs[0], "condition not evaluated, every entry kept")
        return table

    def _report(self, node, why):
        snippet = (ast.get_source_segment(self._source, node) or "").split("\n")[0]
        if len(snippet) > _SNIPPET_LENGTH:
            snippet = snippet[:_SNIPPET_LENGTH] + "..."
        self.unresolved.append("%s line %d: %s %s" % (self._filename, node.lineno, why, snippet))


def _assigned_names(statement):
    """The plain names a module-level assignment with a value binds."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        targets = [statement.target]
    else:
        return []
    return [target.id for target in targets if isinstance(target, ast.Name)]


def _looks_like_table(node):
    """A dict literal whose literal values are all tuples; others (e.g. the version strings
    of _PREVIOUSLY_SUPPORTED_MODELS) are not architecture tables."""
    return all(
        isinstance(value, ast.Tuple)
        for key, value in zip(node.keys, node.values)
        if key is not None
    )


def _entry(key, value, bindings):
    """(name, [module, class]) from the key and value of an architecture entry."""
    name, pair = _evaluate(key, bindings), _evaluate(value, bindings)
    is_entry = (
        isinstance(name, str)
        and isinstance(pair, tuple)
        and len(pair) == 2
        and all(isinstance(part, str) for part in pair)
    )
    if not is_entry:
        raise _Unsupported()
    return name, list(pair)


def _iterated_table(node):
    """The name X of a single-generator comprehension over `X.items()`, else None."""
    if len(node.generators) != 1:
        return None
    iterated = node.generators[0].iter
    is_items_call = (
        isinstance(iterated, ast.Call)
        and not iterated.args
        and isinstance(iterated.func, ast.Attribute)
        and iterated.func.attr == "items"
        and isinstance(iterated.func.value, ast.Name)
    )
    return iterated.func.value.id if is_items_call else None


def _conditions_hold(conditions, bindings):
    """(keep, decided): whether every condition holds; an undecidable one keeps the entry."""
    try:
        return all(_evaluate(condition, bindings) for condition in conditions), True
    except _Unsupported:
        return True, False


class _Unsupported(Exception):
    """An expression outside the small subset _evaluate understands."""


def _bind(target, value, bindings):
    if isinstance(target, ast.Name):
        bindings[target.id] = value
    elif (
        isinstance(target, (ast.Tuple, ast.List))
        and isinstance(value, tuple)
        and len(target.elts) == len(value)
    ):
        for element, item in zip(target.elts, value):
            _bind(element, item, bindings)
    else:
        raise _Unsupported()


def _evaluate(node, bindings):
    """Evaluate literals, bound names, comparisons and boolean logic; nothing is executed."""
    evaluate = _EVALUATORS.get(type(node))
    if evaluate is None:
        raise _Unsupported()
    return evaluate(node, bindings)


def _evaluate_name(node, bindings):
    if node.id not in bindings:
        raise _Unsupported()
    return bindings[node.id]


def _evaluate_compare(node, bindings):
    left = _evaluate(node.left, bindings)
    for op, comparator in zip(node.ops, node.comparators):
        compare = _COMPARISONS.get(type(op))
        if compare is None:
            raise _Unsupported()
        right = _evaluate(comparator, bindings)
        if not compare(left, right):
            return False
        left = right
    return True


def _evaluate_bool_op(node, bindings):
    combine = all if isinstance(node.op, ast.And) else any
    return combine(_evaluate(value, bindings) for value in node.values)


def _evaluate_not(node, bindings):
    if not isinstance(node.op, ast.Not):
        raise _Unsupported()
    return not _evaluate(node.operand, bindings)


def _evaluate_sequence(node, bindings):
    return tuple(_evaluate(element, bindings) for element in node.elts)


_EVALUATORS = {
    ast.Constant: lambda node, bindings: node.value,
    ast.Name: _evaluate_name,
    ast.Tuple: _evaluate_sequence,
    ast.List: _evaluate_sequence,
    ast.Set: _evaluate_sequence,
    ast.Compare: _evaluate_compare,
    ast.BoolOp: _evaluate_bool_op,
    ast.UnaryOp: _evaluate_not,
}

_COMPARISONS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda item, container: item in container,
    ast.NotIn: lambda item, container: item not in container,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def model_facts(model_path, package_root, architectures):
    """Whether the registry's `architectures` serve the model at model_path.

    `missing` lists the architectures config.json declares that the registry lacks; for each,
    `registrable` says whether a model file of the package defines a class of that name (so a
    registry entry could serve it) and `defined_in` names that file. A config.json that cannot
    be read is reported in `error`.
    """
    config_path = os.path.join(model_path, "config.json")
    facts = {
        "path": model_path,
        "error": None,
        "architectures": [],
        "max_position_embeddings": None,
        "served": False,
        "missing": [],
        "registrable": {},
        "defined_in": {},
    }
    try:
        config = _read_config(config_path)
    except ValueError as error:
        facts["error"] = str(error)
        return facts
    declared = config["architectures"]
    missing = [name for name in declared if name not in architectures]
    defined_in = find_class_definitions(package_root, missing)
    facts.update(
        architectures=declared,
        max_position_embeddings=_max_position_embeddings(config),
        served=not missing,
        missing=missing,
        registrable={name: name in defined_in for name in missing},
        defined_in=defined_in,
    )
    return facts


def _read_config(path):
    """The parsed config.json; ValueError, naming the file, when it is unusable."""
    try:
        with open(path, encoding="utf-8") as stream:
            config = json.load(stream)
    except (OSError, ValueError) as error:
        raise ValueError("cannot read %s: %s" % (path, error))
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not (
        isinstance(architectures, list)
        and architectures
        and all(isinstance(name, str) for name in architectures)
    ):
        raise ValueError("%s declares no architectures" % path)
    return config


def _max_position_embeddings(config):
    """Top level for text models; multimodal configs keep it in their text_config."""
    for section in (config, config.get("text_config")):
        if isinstance(section, dict) and isinstance(section.get("max_position_embeddings"), int):
            return section["max_position_embeddings"]
    return None


def find_class_definitions(package_root, class_names):
    """Map each of class_names to the model file (relative to package_root) defining it.

    A text scan for top-level `class <Name>` lines in MODELS_DIR/*.py: fast, and nothing is
    imported. Names no file defines are left out.
    """
    if not class_names:
        return {}
    alternatives = b"|".join(re.escape(name.encode("utf-8")) for name in class_names)
    definition = re.compile(rb"^class[ \t]+(" + alternatives + rb")\b", re.MULTILINE)
    found = {}
    for path in sorted(glob.glob(os.path.join(package_root, MODELS_DIR, "*.py"))):
        with open(path, "rb") as stream:
            text = stream.read()
        for match in definition.finditer(text):
            found.setdefault(
                match.group(1).decode("utf-8"), MODELS_DIR + "/" + os.path.basename(path)
            )
        if len(found) == len(set(class_names)):
            break
    return found
