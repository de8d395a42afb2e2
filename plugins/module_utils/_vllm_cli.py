# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The argument names of a vLLM release's OpenAI server, read from its source, never imported.

vLLM builds the parser in engine/arg_utils.py and entrypoints/openai/cli_args.py: literal
`add_argument("--max-model-len", ...)` calls, and loops that add one option per field of a
dataclass (`for name, kwargs in get_kwargs(FrontendArgs).items()`). Both are read with `ast`;
the dataclasses' fields come from those files and the config package. On vLLM 0.10.1.1 this
gives exactly the 171 names its parser has (the unit tests compare).

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

import ast
import os

PARSER_FILES = ("engine/arg_utils.py", "entrypoints/openai/cli_args.py")


def _python_files(package_root):
    paths = [os.path.join(package_root, relative) for relative in PARSER_FILES]
    config = os.path.join(package_root, "config")
    if os.path.isdir(config):
        paths += [os.path.join(config, name) for name in sorted(os.listdir(config)) if name.endswith(".py")]
    elif os.path.isfile(config + ".py"):
        paths.append(config + ".py")
    return [path for path in paths if os.path.isfile(path)]


def _parse(path):
    with open(path, "rb") as stream:
        return ast.parse(stream.read(), path)


def _dataclass_fields(trees):
    fields = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                fields.setdefault(node.name, [
                    item.target.id for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                ])
    return fields


def _call_name(call):
    return getattr(call.func, "attr", None) or getattr(call.func, "id", None)


def _kwargs_sources(tree):
    """{variable: dataclass name} of `variable = get_kwargs(Dataclass)`."""
    sources = {}
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if (isinstance(node, ast.Assign) and isinstance(value, ast.Call)
                and _call_name(value) == "get_kwargs" and value.args
                and isinstance(value.args[0], ast.Name) and isinstance(node.targets[0], ast.Name)):
            sources[node.targets[0].id] = value.args[0].id
    return sources


def argument_names(package_root):
    """(sorted names such as max_num_seqs, None) or (None, why they could not be read)."""
    paths = _python_files(package_root)
    parsers = [os.path.join(package_root, relative) for relative in PARSER_FILES]
    if not any(path in paths for path in parsers):
        return None, "neither %s exists" % " nor ".join(PARSER_FILES)
    try:
        trees = dict((path, _parse(path)) for path in paths)
    except (SyntaxError, ValueError) as error:
        return None, "cannot parse %s: %s" % (getattr(error, "filename", "?"), error)
    fields = _dataclass_fields(trees.values())
    names = set()
    for path in parsers:
        tree = trees.get(path)
        if tree is None:
            continue
        sources = _kwargs_sources(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _call_name(node) == "add_argument":
                names.update(arg.value[2:].replace("-", "_") for arg in node.args
                             if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                             and arg.value.startswith("--"))
            iterated = getattr(node, "iter", None)
            if (isinstance(node, ast.For) and isinstance(iterated, ast.Call)
                    and _call_name(iterated) == "items"
                    and isinstance(iterated.func.value, ast.Name)
                    and iterated.func.value.id in sources):
                names.update(fields.get(sources[iterated.func.value.id], []))
    if not names:
        return None, "no add_argument call found in %s" % ", ".join(PARSER_FILES)
    return sorted(names), None
