"""vLLM 0.10.1.1's OpenAI server command line, rebuilt from the committed flag table.

argparse itself parses, so unknown flags, bad choices, bad numbers and unambiguous
abbreviations behave exactly as in vLLM (exit status 2 and argparse's usage message).
"""

import argparse
import json
import re
from pathlib import Path

FLAG_TABLE = Path(__file__).with_name("flags-0.10.1.1.json")
# argparse names the program after argv[0]; vLLM's is the api_server.py module file.
PROG = "api_server.py"
HUMAN_READABLE_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgG])")
DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9}
BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30}


def load_flag_table():
    return json.loads(FLAG_TABLE.read_text())


def human_readable_int(value):
    """'32k' -> 32000, '1K' -> 1024, '25.6k' -> 25600, as vLLM's human_readable_int."""
    match = HUMAN_READABLE_INT.fullmatch(value.strip())
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix in DECIMAL_SUFFIXES:
        return int(float(number) * DECIMAL_SUFFIXES[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. "
            f"Did you mean to use {number}{suffix.lower()} instead?")
    return int(number) * BINARY_SUFFIXES[suffix]


def json_value(value):
    return json.loads(value)


def dict_or_str(value):
    """vLLM's union_dict_and_str: JSON when the value looks like an object, else the text."""
    if not re.match(r"(?s)^\s*{.*}\s*$", value):
        return str(value)
    return json.loads(value)


CONVERTERS = {"int": int, "float": float, "str": str, "json": json_value,
              "human_readable_int": human_readable_int, "dict_or_str": dict_or_str}


def _converter(spec):
    convert = CONVERTERS[spec.get("type", "str")]
    if not spec.get("optional"):
        return convert

    def convert_optional(value):
        # vLLM's optional_type: "" and "None" mean None for every optional field.
        return None if value in ("", "None") else convert(value)

    convert_optional.__name__ = convert.__name__  # argparse names the type in its errors
    return convert_optional


class BooleanOptionalAction(argparse.Action):
    """`--flag` / `--no-flag`, as argparse.BooleanOptionalAction (absent before Python 3.9)."""

    def __init__(self, option_strings, dest, **kwargs):
        negated = ["--no-" + name[2:] for name in option_strings if name.startswith("--")]
        super().__init__(option_strings + negated, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no-"))


class LoRAParserAction(argparse.Action):
    """--lora-modules: `name=path`, or a JSON object, per value (vLLM's LoRAParserAction)."""

    def __call__(self, parser, namespace, values, option_string=None):
        modules = []
        for item in values or []:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=")
                modules.append({"name": name, "path": path})
                continue
            try:
                modules.append(json.loads(item))
            except ValueError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
        setattr(namespace, self.dest, modules)


def _argparse_kwargs(spec):
    action = spec.get("action")
    if action == "LoRAParserAction":
        return {"action": LoRAParserAction, "nargs": spec["nargs"], "type": _converter(spec)}
    if action == "bool":
        return {"action": BooleanOptionalAction, "default": None}
    if action == "store_true":
        return {"action": "store_true"}
    if action == "append":
        return {"action": "append", "type": _converter(spec)}
    kwargs = {"type": _converter(spec)}
    if "nargs" in spec:
        kwargs["nargs"] = spec["nargs"]
    if "choices" in spec:
        kwargs["choices"] = [_converter(spec)(choice) if isinstance(choice, str) else choice
                             for choice in spec["choices"]]
    return kwargs


def build_parser(table):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="vLLM OpenAI-Compatible RESTful API server (biv100 lab's simulated "
                    "engine: no model is loaded, answers are deterministic stand-in text).")
    for spec in table["flags"]:
        parser.add_argument(*spec["names"], **_argparse_kwargs(spec))
    return parser


def normalize_underscores(argv):
    """`--max_model_len` means `--max-model-len`, as vLLM's FlexibleArgumentParser allows."""
    normalized = []
    for arg in argv:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        normalized.append(arg)
    return normalized


class ServeArgsError(Exception):
    """A check vLLM makes after parsing; it exits with a traceback, status 1."""


JINJA_CHARS = "{}\n"


def validate_serve_args(args, table):
    """What 0.10.1.1 checks once the arguments are parsed: the config file (which the stand-in
    refuses: its engine role never gives one), validate_parsed_serve_args and
    validate_api_server_args."""
    if args.config:
        extension = args.config.split(".")[-1]
        if extension not in ("yaml", "yml"):
            raise ServeArgsError(
                f"ValueError: ('Config file must be of a yaml/yml type.                     "
                f"         %s supplied', '{extension}')")
        raise ServeArgsError("the lab's stand-in does not read --config files")
    template = args.chat_template
    if template and not any(char in template for char in JINJA_CHARS) and not Path(template).exists():
        raise ServeArgsError(f"ValueError: The supplied chat template string ({template}) "
                             "appears path-like, but doesn't exist!")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ServeArgsError(
            "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser")
    tool_parsers = table["tool_parsers"]
    if args.enable_auto_tool_choice and args.tool_call_parser not in tool_parsers:
        raise ServeArgsError(
            f"KeyError: 'invalid tool call parser: {args.tool_call_parser} "
            f"(chose from {{ {','.join(tool_parsers)} }})'")


def parse_args(argv):
    table = load_flag_table()
    args = build_parser(table).parse_args(normalize_underscores(argv))
    validate_serve_args(args, table)
    return args
