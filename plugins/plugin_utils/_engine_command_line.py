# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's OpenAI-server command line from one dict of engine arguments, for the engine_cli_args
filter (the engine's launch arguments) and the computility_run filter (the platform's run file),
so that the fleet and the platform start the engine with the same line.

Controller side only: standard library.
"""

from __future__ import annotations

import json

# Booleans whose 0.10.1.1 default is not false (None lets the engine decide, or true): false
# changes something only when spelled `--no-<flag>`. Every other boolean defaults to false, so
# false is rendered as nothing, which means false on every vLLM version, including V0-era forks
# whose store_true flags (enforce_eager among them) have no `--no-` form to accept.
SPELLED_OUT_WHEN_FALSE = frozenset(
    {"enable_chunked_prefill", "enable_prefix_caching", "use_tqdm_on_load"}
)

# List-valued arguments that argparse reads differently from the usual `nargs="+"` form.
REPEATED_FLAG_ARGUMENTS = frozenset({"middleware"})  # action="append": one flag per item
JSON_LIST_ARGUMENTS = frozenset({"allowed_origins", "allowed_methods", "allowed_headers"})


def engine_cli_args(args: dict) -> list[str]:
    """Render the arguments as command-line tokens: --model first, then the others by name.

    The order depends on the names only, so the same dict always gives the same command line,
    whatever order the inventory merged it in (the engine restarts when the line changes).
    """
    names = sorted(args, key=lambda name: (name != "model", name))
    return [token for name in names for token in _tokens(name, args[name])]


def _tokens(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):
        return _boolean_tokens(name, flag, value)
    if isinstance(value, dict):
        return [flag, json.dumps(value, separators=(",", ":"))]  # vLLM parses dicts as JSON
    if isinstance(value, list):
        return _list_tokens(name, flag, value)
    return [flag, str(value)]


def _boolean_tokens(name: str, flag: str, value: bool) -> list[str]:
    if value:
        return [flag]
    return [f"--no-{flag[2:]}"] if name in SPELLED_OUT_WHEN_FALSE else []


def _list_tokens(name: str, flag: str, items: list) -> list[str]:
    if not items:
        return []  # nargs="+" refuses a flag without values; an empty list asks for nothing
    if name in REPEATED_FLAG_ARGUMENTS:
        return [token for item in items for token in (flag, str(item))]
    if name in JSON_LIST_ARGUMENTS:
        return [flag, json.dumps(items)]
    return [flag, *map(str, items)]
