# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A tuning search space as data: loading and checking a space file, the candidates it makes of a
host's current settings, and the deploy's own checks of each candidate before it runs.
Controller side only.

A space file is a YAML mapping:

    name: default                  # required; names the space in results
    description: what it searches
    engine_args:                   # engine arguments (engine_args), each searched key with
      max_num_seqs: [1, 2, 4, 8]   #   a list of values, or
      gpu_memory_utilization: {range: [0.85, 0.95], step: 0.05}   # lo, lo + step, ... up to hi
    engine_allocator:              # PYTORCH_CUDA_ALLOC_CONF options (engine_allocator), likewise
      max_split_size_mb: [256, 512]
      expandable_segments: [null, true]
    engine_env: {}                 # more environment variables (engine_env), likewise
    budget:                        # required
      max_candidates: 24           # full-length benches the search may spend (at least 2)
      max_minutes: 30              # wall-clock time of the whole search, engine starts included
      min_factor: 0.25             # the shortest bench of successive halving, as a fraction of
                                   #   the workload (default 0.25)
    memory:                        # the memory-first step-down (leave it out to search without)
      step: 0.05                   # gpu_memory_utilization goes down by this much
      floor: 0.80                  #   and no lower
      start: 0.98                  # from here (default: the space's highest gpu_memory_utilization,
                                   #   else the host's)

A value is text, a number, true/false, or null: the key unset, so that the engine (or PyTorch)
takes its own default. A range is of numbers; its values are counted in decimal, so
{range: [0.85, 0.95], step: 0.05} gives exactly 0.85, 0.9 and 0.95, and whole numbers give whole
numbers. A value listed twice, a key the engine role decides itself (the model, its name, host,
port, the tool and reasoning parsers), the clients' key, and environment variables that other
variables set (PYTORCH_CUDA_ALLOC_CONF, CUDA_VISIBLE_DEVICES, VLLM_ALLOW_LONG_MAX_MODEL_LEN) are
refused. Whether a value suits the engine is not judged here: a candidate the deploy's checks
refuse is listed as invalid and never started (candidate_problems).

A candidate is the host's current settings (the incumbent: its engine_args, engine_allocator
and engine_env) with the searched keys replaced:

    {"id": "c1a2b3c4d5e", "incumbent": false,
     "engine_args": {...}, "engine_allocator": {...}, "engine_env": {...}}

Its id is a digest of its settings alone, so the same settings have the same id in every run
(resuming an interrupted search depends on it) and whatever order the keys were given in.

Every error names the file and the key (`files/tune/x.yml: engine_args.max_num_seqs: ...`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from decimal import Decimal
from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._allocator_conf import allocator_conf_problems
from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import engine_args_problems
from ansible_collections.biv100.serving.plugins.plugin_utils._named_file import named_file

TUNE_DIR = Path(__file__).resolve().parents[2] / "files" / "tune"
SECTIONS = ("engine_args", "engine_allocator", "engine_env")
SPACE_KEYS = {"name", "description", *SECTIONS, "budget", "memory"}
BUDGET_KEYS = {"max_candidates", "max_minutes", "min_factor"}
MEMORY_KEYS = {"step", "floor", "start"}
RANGE_KEYS = {"range", "step"}
DEFAULT_MIN_FACTOR = 0.25
# Launch arguments the engine role sets from variables of its own, and the clients' key, which
# reaches the engine only through its env file: a space that searched them would change nothing,
# or leak the key into the results.
ROLE_ARGUMENTS = ("model", "served_model_name", "host", "port", "enable_auto_tool_choice",
                  "tool_call_parser", "reasoning_parser", "api_key")
# Variables the engine role writes from other settings: engine_allocator, the GPU placement,
# engine_allow_long_max_model_len and engine_api_key.
ROLE_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
                  "VLLM_API_KEY")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A range of more values than this is a typo, and a grid of more candidates than this could not
# be measured in any budget: both are refused before anything is expanded.
MAX_RANGE_VALUES = 1000
MAX_GRID = 10000
MEMORY_KEY = "gpu_memory_utilization"
# The settings that make a candidate need the most memory at start-up: the memory step-down
# starts the candidate with the largest value of each that the space holds.
LARGEST_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")
# The allocator options that let more start, and the value that does: expandable segments leave
# nothing of the profile run's peak fragmented. The step-down starts the largest candidate with
# them when the space tries them, as the best of the largest settings would run.
STARTING_ALLOCATOR = {"expandable_segments": True}


class TuneSpaceError(ValueError):
    """A space that cannot be searched; the message names the file and the key."""


def space_path(space: str, find=None) -> Path:
    """A name of files/tune (no slash, no .yml) or a path; `find` resolves a relative path (an
    action finds it beside the playbook)."""
    return named_file(space, TUNE_DIR, "tune space", TuneSpaceError, find)


def load_space(space: str | Path, find=None) -> dict:
    """The space named (files/tune/<name>.yml) or at a path, checked, its ranges expanded:

        {"name", "description", "file",
         "engine_args": {key: [values]}, "engine_allocator": {...}, "engine_env": {...},
         "budget": {"max_candidates", "max_minutes", "min_factor"},
         "memory": {"step", "floor", "start"} or None}      # start None: not given
    """
    path = space if isinstance(space, Path) else space_path(space, find)
    where = str(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise TuneSpaceError(f"{where}: cannot be read: {error}") from None
    except yaml.YAMLError as error:
        raise TuneSpaceError(f"{where}: not YAML: {error}") from None
    if not isinstance(document, dict):
        raise TuneSpaceError(f"{where}: a tune space is a mapping (name, engine_args, budget, ...)")
    _refuse_unknown(document, SPACE_KEYS, where, "")
    name = document.get("name")
    if not isinstance(name, str) or not name:
        raise TuneSpaceError(f"{where}: name: a text is required")
    description = document.get("description", "")
    if not isinstance(description, str):
        raise TuneSpaceError(f"{where}: description: must be a text")
    loaded = {"name": name, "description": description, "file": where}
    for section in SECTIONS:
        loaded[section] = _section(document.get(section), where, section)
    if not any(loaded[section] for section in SECTIONS):
        raise TuneSpaceError(f"{where}: nothing to search: give values to engine_args, engine_allocator "
                             "or engine_env")
    loaded["budget"] = _budget(document.get("budget"), where)
    loaded["memory"] = _memory(document.get("memory"), where)
    size = math.prod(len(values) for section in SECTIONS for values in loaded[section].values())
    if size > MAX_GRID:
        raise TuneSpaceError(f"{where}: the space holds {size} candidates; at most {MAX_GRID} can be searched")
    return loaded


def _refuse_unknown(mapping: dict, known: set, where: str, at: str) -> None:
    unknown = set(mapping) - known
    if unknown:
        raise TuneSpaceError(f"{where}: {at}unknown keys {', '.join(sorted(map(str, unknown)))} "
                             f"(known: {', '.join(sorted(known))})")


def _section(mapping, where: str, section: str) -> dict:
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise TuneSpaceError(f"{where}: {section}: a mapping of keys to their values is required")
    searched = {}
    for key, spec in mapping.items():
        at = f"{section}.{key}"
        if not isinstance(key, str) or not key:
            raise TuneSpaceError(f"{where}: {section}: {key!r} is not a name")
        if section == "engine_args" and key in ROLE_ARGUMENTS:
            raise TuneSpaceError(f"{where}: {at}: the engine role sets it, it cannot be searched")
        if section == "engine_env" and key in ROLE_VARIABLES:
            raise TuneSpaceError(f"{where}: {at}: the engine role writes it from other settings, it cannot "
                                 "be searched")
        if section == "engine_env" and not ENV_NAME.fullmatch(key):
            raise TuneSpaceError(f"{where}: {at}: not an environment variable's name")
        searched[key] = _values(spec, where, at)
    return searched


def _values(spec, where: str, at: str) -> list:
    if isinstance(spec, dict):
        values = _range(spec, where, at)
    elif isinstance(spec, list):
        if not spec:
            raise TuneSpaceError(f"{where}: {at}: an empty list gives nothing to search")
        values = list(spec)
    else:
        raise TuneSpaceError(f"{where}: {at}: give a list of values or {{range: [lo, hi], step: s}}, "
                             f"not {spec!r}")
    seen = {}
    for value in values:
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise TuneSpaceError(f"{where}: {at}: {value!r} is not a value (text, number, true/false or null)")
        if isinstance(value, float) and not math.isfinite(value):
            raise TuneSpaceError(f"{where}: {at}: {value!r} is not a finite number")
        key = _sameness(value)
        if key in seen:
            raise TuneSpaceError(f"{where}: {at}: {value!r} is listed twice")
        seen[key] = value
    return values


def _sameness(value):
    """Values the engine cannot tell apart compare equal (4 and 4.0), true never equals 1."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", Decimal(str(value)))
    return ("text", value)


def _range(spec: dict, where: str, at: str) -> list:
    if set(spec) != RANGE_KEYS:
        raise TuneSpaceError(f"{where}: {at}: a range is {{range: [lo, hi], step: s}}, not {spec!r}")
    bounds, step = spec["range"], spec["step"]
    if not isinstance(bounds, list) or len(bounds) != 2 or not all(_is_number(bound) for bound in bounds):
        raise TuneSpaceError(f"{where}: {at}.range: must be [lo, hi], two numbers, not {bounds!r}")
    if not _is_number(step) or step <= 0:
        raise TuneSpaceError(f"{where}: {at}.step: must be a number above 0, not {step!r}")
    low, high, by = (Decimal(str(item)) for item in (*bounds, step))
    if low > high:
        raise TuneSpaceError(f"{where}: {at}.range: lo {bounds[0]} is above hi {bounds[1]}")
    count = int((high - low) / by) + 1
    if count > MAX_RANGE_VALUES:
        raise TuneSpaceError(f"{where}: {at}: the range gives {count} values; at most {MAX_RANGE_VALUES}")
    whole = all(isinstance(item, int) for item in (*bounds, step))
    # Decimal steps are exact: 0.85 + 2 x 0.05 is 0.95, never 0.9500000000000001.
    return [int(low + by * index) if whole else float(low + by * index) for index in range(count)]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _budget(budget, where: str) -> dict:
    if not isinstance(budget, dict):
        raise TuneSpaceError(f"{where}: budget: required, a mapping ({{max_candidates: N, max_minutes: M}})")
    _refuse_unknown(budget, BUDGET_KEYS, where, "budget: ")
    candidates = budget.get("max_candidates")
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 2:
        # The incumbent takes one run: a budget of less leaves nothing to compare it with.
        raise TuneSpaceError(f"{where}: budget.max_candidates: must be a whole number of at least 2 (the "
                             f"incumbent and one other), not {candidates!r}")
    minutes = budget.get("max_minutes")
    if not _is_number(minutes) or minutes <= 0:
        raise TuneSpaceError(f"{where}: budget.max_minutes: must be a number above 0, not {minutes!r}")
    factor = budget.get("min_factor", DEFAULT_MIN_FACTOR)
    if not _is_number(factor) or not 0 < factor <= 1:
        raise TuneSpaceError(f"{where}: budget.min_factor: must be a number above 0 and at most 1, "
                             f"not {factor!r}")
    return {"max_candidates": candidates, "max_minutes": minutes, "min_factor": factor}


def _memory(memory, where: str) -> dict | None:
    if memory is None:
        return None
    if not isinstance(memory, dict):
        raise TuneSpaceError(f"{where}: memory: a mapping ({{step: s, floor: f}}) or left out")
    _refuse_unknown(memory, MEMORY_KEYS, where, "memory: ")
    checked = {}
    for key in ("step", "floor", "start"):
        value = memory.get(key)
        if value is None and key == "start":
            checked[key] = None
            continue
        if not _is_number(value) or not 0 < value <= 1:
            raise TuneSpaceError(f"{where}: memory.{key}: must be a fraction above 0 and at most 1, "
                                 f"not {value!r}")
        checked[key] = value
    if checked["start"] is not None and checked["start"] < checked["floor"]:
        raise TuneSpaceError(f"{where}: memory.start: {checked['start']} is below memory.floor {checked['floor']}")
    return checked


def settings_id(settings: dict) -> str:
    """The id of a candidate's settings: the same settings give the same id in every run."""
    canonical = json.dumps({section: settings.get(section) or {} for section in SECTIONS},
                           sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # A letter first: an id of digits alone would read as a number in YAML and Jinja.
    return "c" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:10]


def make_candidate(settings: dict, incumbent: bool = False) -> dict:
    """A candidate of the settings ({engine_args, engine_allocator, engine_env}): null values
    dropped (the key unset), its id computed."""
    sections = {section: {key: value for key, value in (settings.get(section) or {}).items() if value is not None}
                for section in SECTIONS}
    return {"id": settings_id(sections), "incumbent": incumbent, **sections}


def incumbent_candidate(incumbent: dict) -> dict:
    """Candidate 0: the host's current settings, {engine_args, engine_allocator, engine_env}
    (a section left out is empty)."""
    if not isinstance(incumbent, dict):
        raise TuneSpaceError(f"the incumbent is {type(incumbent).__name__}: a mapping of engine_args, "
                             "engine_allocator and engine_env")
    for section in SECTIONS:
        if not isinstance(incumbent.get(section) or {}, dict):
            raise TuneSpaceError(f"the incumbent's {section} is {type(incumbent[section]).__name__}: a mapping")
    return make_candidate(incumbent, incumbent=True)


def candidates(space: dict, incumbent: dict, gpu_memory_utilization: float | None = None) -> list[dict]:
    """The incumbent (candidate 0), then every combination of the space's values, each the
    incumbent with the searched keys replaced; a combination with the settings of one before it
    (the incumbent's, most often) is left out. The order is the space's: keys as the file lists
    them, engine_args first, the last key changing fastest.

    gpu_memory_utilization is the memory step-down's choice (memory_choice): the space's values
    of engine_args.gpu_memory_utilization up to it are searched, or it alone when the space
    lists none up to it, or none at all.
    """
    first = incumbent_candidate(incumbent)
    axes = [(section, key, values) for section in SECTIONS for key, values in space[section].items()]
    if gpu_memory_utilization is not None:
        axes = _memory_capped(axes, gpu_memory_utilization)
    found = {first["id"]: first}
    for combination in itertools.product(*(axis[2] for axis in axes)):
        settings = {section: dict(first[section]) for section in SECTIONS}
        for (section, key), value in zip((axis[:2] for axis in axes), combination):
            settings[section][key] = value
        candidate = make_candidate(settings)
        found.setdefault(candidate["id"], candidate)
    return list(found.values())


def _memory_capped(axes: list, ceiling: float) -> list:
    limit = Decimal(str(ceiling))
    for position, (section, key, values) in enumerate(axes):
        if (section, key) == ("engine_args", MEMORY_KEY):
            kept = [value for value in values if _is_number(value) and Decimal(str(value)) <= limit]
            axes[position] = (section, key, kept or [ceiling])
            return axes
    return [*axes, ("engine_args", MEMORY_KEY, [ceiling])]


def largest_candidate(space: dict, incumbent: dict, gpu_memory_utilization: float) -> dict:
    """The incumbent with the largest value the space holds of each of LARGEST_KEYS, at the
    given gpu_memory_utilization, and the allocator options of STARTING_ALLOCATOR the space
    tries: the candidate the memory step-down starts."""
    settings = incumbent_candidate(incumbent)
    args = dict(settings["engine_args"])
    for key in LARGEST_KEYS:
        sizes = [value for value in space["engine_args"].get(key, []) if _is_number(value)]
        if sizes:
            args[key] = max(sizes)
    args[MEMORY_KEY] = gpu_memory_utilization
    allocator = dict(settings["engine_allocator"])
    for key, value in STARTING_ALLOCATOR.items():
        if value in (space.get("engine_allocator") or {}).get(key, []):
            allocator[key] = value
    return make_candidate({**settings, "engine_args": args, "engine_allocator": allocator})


def candidate_problems(candidate: dict, known_flags: list[str] | None = None, torch_version: str | None = None,
                       gpus_free: int | None = None, max_position_embeddings: int | None = None,
                       allow_long_max_model_len: bool = False, probe_choices: int | None = None) -> list[str]:
    """Why the deploy would refuse the candidate, one sentence each ([] when it may run): its
    engine arguments against the host's own CLI (known_flags, vllm_facts' cli.arguments), free
    GPUs and model, its allocator options against the host's torch version; and a max_num_seqs
    below the most choices a probe asks for (probe_choices), which fails the functional gate by
    construction. Left out, a fact is not judged (the names are then checked against vLLM
    0.10.1.1's CLI)."""
    seqs = candidate["engine_args"].get("max_num_seqs")
    fewer = ([f"max_num_seqs {seqs} is below the {probe_choices} choices (n) a probe asks for: the engine refuses "
              "that request and the functional gate fails whatever else the setting does"]
             if isinstance(probe_choices, int) and isinstance(seqs, int) and seqs < probe_choices else [])
    return [
        *engine_args_problems(candidate["engine_args"], gpus_free=gpus_free,
                              max_position_embeddings=max_position_embeddings,
                              allow_long_max_model_len=allow_long_max_model_len, known_flags=known_flags),
        *allocator_conf_problems(candidate["engine_allocator"], torch_version=torch_version),
        *fewer,
    ]


def screen_candidates(listed: list[dict], **facts) -> tuple[list[dict], list[dict]]:
    """(valid, invalid): the candidates the deploy's checks accept, in their order, and the others,
    each with its `problems` (candidate_problems, given the same facts)."""
    valid, invalid = [], []
    for candidate in listed:
        problems = candidate_problems(candidate, **facts)
        if problems:
            invalid.append({**candidate, "problems": problems})
        else:
            valid.append(candidate)
    return valid, invalid


def edge_notes(space: dict, candidate: dict, incumbent: dict) -> list[str]:
    """`max_num_seqs 8 is the largest value the space tries: try 16, 32 next`, for each engine
    argument the candidate sets to the largest or smallest number the space lists (other than the
    incumbent's own value): the best may lie beyond. gpu_memory_utilization is the memory step's."""
    notes = []
    for key, listed in space.get("engine_args", {}).items():
        numbers = sorted({value for value in listed if _is_number(value)})
        value = candidate["engine_args"].get(key)
        if key == MEMORY_KEY or len(numbers) < 2 or value == incumbent["engine_args"].get(key):
            continue
        if value == numbers[-1]:
            notes.append(f"{key} {value} is the largest value the space tries: try {', '.join(map(str, _beyond(numbers)))} next")
        elif value == numbers[0] and _beyond(numbers[::-1]):
            notes.append(f"{key} {value} is the smallest value the space tries: try {', '.join(map(str, _beyond(numbers[::-1])))} next")
    return notes


def _beyond(numbers: list) -> list:
    """The next two values past the end of `numbers` (ordered towards that end): by their common
    ratio when they grow or shrink geometrically (1, 2, 4, 8: 16, 32), else by their last step;
    only values above 0."""
    last, before = numbers[-1], numbers[-2]
    ratios = {Decimal(str(b)) / Decimal(str(a)) for a, b in zip(numbers, numbers[1:]) if a}
    if len(ratios) == 1 and 0 not in numbers:
        ratio = ratios.pop()
        found = [Decimal(str(last)) * ratio, Decimal(str(last)) * ratio * ratio]
    else:
        step = Decimal(str(last)) - Decimal(str(before))
        found = [Decimal(str(last)) + step, Decimal(str(last)) + 2 * step]
    kind = int if all(isinstance(number, int) for number in numbers) else float
    values = [kind(value) for value in found if value > 0 and (kind is float or value == value.to_integral_value())]
    return values
