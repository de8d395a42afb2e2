"""Build the stand-in's table of accepted CLI flags from a real vLLM source tree.

vLLM builds its OpenAI server parser at run time from dataclass type hints (`get_kwargs` in
`engine/arg_utils.py`), which needs torch and pydantic. The stand-in must run without them, so
this module reads the same sources with `ast` and writes what argparse needs as JSON:

    python3 tests/lab/engine_standin/flag_table.py <release>/vllm \
        > tests/lab/engine_standin/flags-0.10.1.1.json

The rules follow `_compute_kwargs` of 0.10.1.1, in its order: a dataclass field type takes
JSON, a bool becomes `--flag/--no-flag`, a Literal gives choices (free text when the union also
holds str), tuples and lists take one or more values (a list of Literals gives choices), then
int, float, dict with str or a class (`union_dict_and_str`: JSON when it looks like an object,
else text), dict (JSON) and str. `add_cli_args` then adds the choices of an Enum's values and
its special cases (`collect_detailed_traces`' pairs). The real parser in the lab's real engine
judges the result (tests/lab/conformance).
It runs where the table is regenerated (Python 3.9+ syntax trees), not on the lab hosts.
"""

import ast
import itertools
import json
import sys
from pathlib import Path

# Files whose dataclasses and type aliases the parser is built from.
CONFIG_SOURCES = ("config/__init__.py", "config/cache.py", "config/compilation.py",
                  "config/parallel.py", "config/scheduler.py", "entrypoints/chat_utils.py",
                  "entrypoints/openai/cli_args.py", "transformers_utils/config.py")
PARSER_SOURCES = (("engine/arg_utils.py", {"add_cli_args"}),
                  ("entrypoints/openai/cli_args.py", {"make_arg_parser", "add_cli_args"}))
# vLLM gives these two fields its human_readable_int ("32k", "1M") instead of int.
HUMAN_READABLE_INT_FIELDS = {"max_model_len", "max_num_batched_tokens"}
# Wrappers that leave the wrapped type as argparse sees it.
TRANSPARENT_WRAPPERS = {"Annotated", "SkipValidation", "Optional", "Union"}
# Type hints `is_not_builtin` takes for builtins; any other (a class, a forward reference)
# makes a dict field `union_dict_and_str`.
BUILTIN_HINTS = {"int", "float", "str", "bool", "bytes", "dict", "Dict", "list", "tuple", "None",
                 "Literal", "Any"}
FORWARD_REFERENCE = "ForwardRef"


class SourceModel:
    """The dataclasses (field name -> annotation) and type aliases of the config sources."""

    def __init__(self, vllm_root):
        self.classes = {}
        self.aliases = {}
        self.enums = {}  # Enum class name -> its members' values
        for relative in CONFIG_SOURCES:
            tree = ast.parse((vllm_root / relative).read_text())
            for node in tree.body:
                self._collect(node)

    def _collect(self, node):
        if isinstance(node, ast.ClassDef) and any(_dotted_name(base).endswith("Enum")
                                                  for base in node.bases):
            self.enums[node.name] = [item.value.value for item in node.body
                                     if isinstance(item, ast.Assign)
                                     and isinstance(item.value, ast.Constant)]
        if isinstance(node, ast.ClassDef):
            self.classes.setdefault(node.name, {
                item.target.id: item.annotation for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            })
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Subscript)):
            self.aliases[node.targets[0].id] = node.value

    def type_hints(self, annotation, nested=False):
        """Flatten an annotation into (name, subscript node) pairs, as get_type_hints does.

        A whole annotation in quotes is the module's postponed annotation; one quoted inside
        it stays the forward reference the real parser sees."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            if nested:
                return [(FORWARD_REFERENCE, None)]
            annotation = ast.parse(annotation.value, mode="eval").body
        if isinstance(annotation, ast.BinOp):  # X | Y
            return self.type_hints(annotation.left, nested) + self.type_hints(annotation.right, nested)
        name = _dotted_name(annotation.value if isinstance(annotation, ast.Subscript)
                            else annotation)
        if name in self.aliases:
            return self.type_hints(self.aliases[name], nested)
        if isinstance(annotation, ast.Subscript) and name in TRANSPARENT_WRAPPERS:
            args = _subscript_args(annotation)
            wrapped = args[:1] if name in {"Annotated", "SkipValidation"} else args
            hints = [hint for arg in wrapped for hint in self.type_hints(arg, nested=True)]
            return hints + ([("None", None)] if name == "Optional" else [])
        return [(name, annotation)]


def _dotted_name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return ast.dump(node)


def _subscript_args(node):
    inner = node.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def field_spec(model, name, annotation):
    """The argparse kwargs (as JSON-able data) of one dataclass field."""
    hints = model.type_hints(annotation)
    names = {hint_name for hint_name, _hint in hints}
    spec = _spec_for(model, name, hints, names)
    if "None" in names and spec.get("action") != "bool":
        spec["optional"] = True
        if "choices" in spec:
            spec["choices"].append("None")
    return spec


def _spec_for(model, name, hints, names):
    literal = next((node for hint, node in hints if hint == "Literal"), None)
    sequence = next(((hint, node) for hint, node in hints if hint in {"tuple", "list"}), None)
    if any(hint in model.classes and _is_dataclass_name(hint) for hint in names):
        return {"type": "json"}
    if "bool" in names:
        return {"action": "bool"}
    if literal is not None:
        options = [arg.value for arg in _subscript_args(literal)]
        if "str" in names:
            return {"type": "str"}
        return {"type": type(options[0]).__name__, "choices": sorted(options)}
    if sequence is not None:
        element = model.type_hints(_subscript_args(sequence[1])[0]) if isinstance(
            sequence[1], ast.Subscript) else [("str", None)]
        if element[0][0] == "Literal":  # a list of literals: their choices
            options = [arg.value for arg in _subscript_args(element[0][1])]
            return {"type": type(options[0]).__name__, "nargs": "+", "choices": options}
        element_type = element[0][0] if element[0][0] in {"int", "float"} else "str"
        return {"type": element_type, "nargs": "+"}
    if "int" in names:
        return {"type": "human_readable_int" if name in HUMAN_READABLE_INT_FIELDS else "int"}
    if "float" in names:
        return {"type": "float"}
    dictionary = "dict" in names or "Dict" in names
    if dictionary and ("str" in names or names - BUILTIN_HINTS):
        return {"type": "dict_or_str"}
    if dictionary:
        return {"type": "json"}
    return {"type": "str"}


def _is_dataclass_name(name):
    # The config classes taken as JSON are the nested *Config dataclasses.
    return name.endswith("Config")


class ParserBuilder:
    """Replays the add_argument calls of one parser-building function."""

    def __init__(self, model, registered):
        self.model = model
        self.registered = registered
        self.flags = []

    def replay(self, function):
        self.function = function
        kwargs_of = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                self._note_kwargs_source(node, kwargs_of)
        overrides = _field_overrides(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and _dotted_name(node.func).endswith("add_argument"):
                self._add(node, kwargs_of, overrides)
            if isinstance(node, ast.For) and _dotted_name(node.iter.func).endswith(".items"):
                self._add_all_fields(node.iter.func.value.id, kwargs_of, overrides)

    def _note_kwargs_source(self, node, kwargs_of):
        value = node.value
        if (isinstance(value, ast.Call) and _dotted_name(value.func) == "get_kwargs"
                and isinstance(node.targets[0], ast.Name)):
            kwargs_of[node.targets[0].id] = value.args[0].id

    def _add(self, call, kwargs_of, overrides):
        names = [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
        if not names:
            return
        spec = {}
        # The field's kwargs (**kwargs["field"]) first: an explicit keyword wins over them.
        for keyword in sorted(call.keywords, key=lambda keyword: keyword.arg is not None):
            if keyword.arg is None:
                variable, field = keyword.value.value.id, keyword.value.slice.value
                spec.update(field_spec(self.model, field,
                                       self.model.classes[kwargs_of[variable]][field]))
                spec.update(overrides.get(field, {}))
                spec["choices"] = spec.get("choices", []) + self._added_choices(field)
                if not spec["choices"]:
                    del spec["choices"]
            else:
                spec.update(self._explicit(keyword))
        self.flags.append(dict(spec, names=names))

    def _added_choices(self, field):
        """`kwargs[field]["choices"] += [",".join(p) for p in permutations(get_args(X), r=2)]`."""
        added = []
        for node in ast.walk(self.function):
            if (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript)
                    and isinstance(node.target.value, ast.Subscript)
                    and node.target.value.slice.value == field
                    and node.target.slice.value == "choices"
                    and isinstance(node.value, ast.ListComp)):
                call = node.value.generators[0].iter
                literal = self.model.aliases[_dotted_name(call.args[0].args[0])]
                options = [arg.value for arg in _subscript_args(literal)]
                added.extend(",".join(pair) for pair in itertools.permutations(options, 2))
        return added

    def _explicit(self, keyword):
        value = keyword.value
        if keyword.arg == "action":
            action = _dotted_name(value) if not isinstance(value, ast.Constant) else value.value
            return {"action": "bool" if action.endswith("BooleanOptionalAction") else action}
        if keyword.arg == "type":
            return {"type": _dotted_name(value)}
        if keyword.arg == "nargs":
            return {"nargs": value.value}
        if keyword.arg == "choices" and "ReasoningParserManager" in ast.dump(value):
            return {"choices": self.registered["reasoning_parsers"]}
        if keyword.arg == "choices" and isinstance(value, ast.ListComp):
            # [f.value for f in SomeEnum]
            return {"choices": list(self.model.enums[_dotted_name(value.generators[0].iter)])}
        return {}

    def _add_all_fields(self, variable, kwargs_of, overrides):
        fields = self.model.classes[kwargs_of[variable]]
        for field, annotation in fields.items():
            spec = dict(field_spec(self.model, field, annotation), **overrides.get(field, {}))
            spec = {key: value for key, value in spec.items() if value is not None}
            self.flags.append(dict(spec, names=["--" + field.replace("_", "-")]))


def _field_overrides(function):
    """The `kwargs["field"]["key"] = value` and `del ...["nargs"]` special cases."""
    overrides = {}
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else []
        for target in targets:
            if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Subscript)):
                continue
            field, key = target.value.slice.value, target.slice.value
            if isinstance(node, ast.Delete):
                overrides.setdefault(field, {})[key] = None
            elif key in {"type", "action"}:
                overrides.setdefault(field, {})[key] = _override_value(node.value)
    return overrides


def _override_value(node):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Call) and _dotted_name(node.func) == "optional_type":
        return _override_value(node.args[0])  # "None" is accepted by every type here
    return {"json.loads": "json"}.get(_dotted_name(node), _dotted_name(node))


def registered_names(vllm_root, folder, manager):
    """The names a folder's modules register with `@<manager>.register_module(...)`."""
    names = []
    for path in sorted((vllm_root / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and _dotted_name(node.func)
                    == f"{manager}.register_module" and node.args):
                names.extend(_constant_strings(node.args[0]))
    return names


def _constant_strings(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [elt.value for elt in node.elts if isinstance(elt, ast.Constant)]
    return []


def build_table(vllm_root):
    vllm_root = Path(vllm_root)
    registered = {
        "tool_parsers": registered_names(
            vllm_root, "entrypoints/openai/tool_parsers", "ToolParserManager"),
        "reasoning_parsers": registered_names(vllm_root, "reasoning", "ReasoningParserManager"),
    }
    model = SourceModel(vllm_root)
    builder = ParserBuilder(model, registered)
    for relative, function_names in PARSER_SOURCES:
        tree = ast.parse((vllm_root / relative).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in function_names:
                builder.replay(node)
    return dict(registered, flags=builder.flags)


if __name__ == "__main__":
    json.dump(build_table(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
