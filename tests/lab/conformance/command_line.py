"""The stand-in's command line held to the real parser: the same command lines to both, and
whether each would start the server (0), be refused by argparse (2) or by the checks after it
(1).

The command lines are, for every flag of the stand-in's table, one with a value of its type
(and for a flag with choices, the first and one that is none) and one with a value that is not
of its type; and the Sub168 command line as the engine role renders it, with vLLM's
underscore spelling too.
"""

from __future__ import annotations

import contextlib
import io
import json

from engine_standin import cli

# A value of each type the table knows, and one that is not of it (None: any text is one).
SAMPLES = {"int": ("1", "one"), "human_readable_int": ("32k", "32q"), "float": ("0.5", "half"),
           "json": ("{}", "{"), "dict_or_str": ("{}", "{"), "str": ("x", None)}
NOT_A_CHOICE = "not-a-choice"


def flag_cases(table: dict) -> list[list[str]]:
    cases = []
    for spec in table["flags"]:
        flag, action = spec["names"][0], spec.get("action")
        if action in ("bool", "store_true"):
            cases.append([flag])
            if action == "bool":
                cases.append(["--no-" + flag[2:]])
            continue
        good, bad = SAMPLES[spec.get("type") or "str"]
        if "choices" in spec:
            good, bad = str(spec["choices"][0]), NOT_A_CHOICE
        cases.append([flag, good])
        if bad is not None:
            cases.append([flag, bad])
    return cases


def sub168_cases(argv: list[str]) -> list[list[str]]:
    """The engine's own arguments, and the same with every option spelt with underscores."""
    underscored = [word.replace("-", "_") if word.startswith("--") else word for word in argv]
    underscored = [word.replace("__", "--", 1) if word.startswith("__") else word for word in underscored]
    return [argv, underscored]


def standin_verdict(argv: list[str]) -> dict:
    """What the stand-in's engine does with a command line, as real_parser.py reports it."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            cli.parse_args(argv)
    except SystemExit as exit_:
        return {"status": exit_.code, "error": errors.getvalue().strip().splitlines()[-1:]}
    except cli.ServeArgsError as error:
        return {"status": 1, "error": [str(error)]}
    return {"status": 0, "error": []}


def disagreements(cases: list[list[str]], real: list[dict]) -> list[str]:
    """Each command line the two start or refuse differently, with what each said."""
    found = []
    for argv, theirs in zip(cases, real):
        ours = standin_verdict(argv)
        if ours["status"] != theirs["status"]:
            found.append(f"{json.dumps(argv)}: stand-in {ours['status']} {ours['error']}, "
                         f"real {theirs['status']} {theirs['error']}")
    return found
