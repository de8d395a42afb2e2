# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark workloads as data: loading and checking a workload file, and expanding it into the
concrete chat completion request bodies engine_bench sends. Controller side only.

A workload file is a YAML mapping:

    name: default                  # required; names the workload in results
    description: what it stands for
    requests: 24                   # measured requests; and/or
    duration_seconds: 60           #   seconds to send for: the measured bodies (`requests` of
                                   #   them, else a pool of max(32, 2 x concurrency)) are sent
                                   #   pass after pass until the time is up
    warmup: 2                      # requests sent first, never measured (default 0)
    concurrency: 2                 # requests in flight at once (default: the engine's max_num_seqs)
    seed: 1                        # the same seed gives the same requests, byte for byte (default 0)
    stream: true                   # server-sent events, timed per chunk (default true)
    temperature: 0                 # (default 0)
    mix:                           # required: the kinds of request, drawn by weight
      - name: chat                 # (default kind-<n>)
        weight: 3                  # (default 1)
        prompt_tokens: {uniform: [960, 1088]}     # or {fixed: N} or {dataset: <name>}
        output_tokens: {uniform: [128, 256]}      # likewise
        tools: false               # true: a simple tool definition with tool_choice auto
        thinking: false            # sets chat_template_kwargs.enable_thinking (unset: the server's default)
        temperature: 0.6           # this kind's own (default the workload's)

A length `{dataset: <name>}` takes the request's prompt from the JSON Lines file the inventory
names for <name> (engine_bench's `datasets` option, `{name: path}`): each line is an object
with `prompt`, a text, and optionally `output_tokens`, a positive integer; a line is drawn at
random (with the seed) per request. `output_tokens: {dataset: <name>}` takes the same line's
`output_tokens` and needs `prompt_tokens` from the same dataset.

A synthetic prompt of N tokens is text of N tokens as the lab's engine stand-in counts them (a
run of word characters, or one other non-space character): random common English words and
full stops, the first word naming the request so that no two prompts share a prefix. A real
tokenizer counts such text a little differently, which is why the figures take the server's
`usage` counts, never the client's.

Every request asks for max_tokens = its output length and `ignore_eos: true` (vLLM's extension
that makes the engine generate exactly that many tokens, as vLLM's own benchmark does for
synthetic data), the workload's temperature, and when streaming `stream_options:
{include_usage: true}`, so that the server reports the tokens it counted.

Every error names the file and the key (`files/bench/x.yml: mix[1].prompt_tokens: ...`).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._named_file import named_file

BENCH_DIR = Path(__file__).resolve().parents[2] / "files" / "bench"
WORKLOAD_KEYS = {"name", "description", "requests", "duration_seconds", "warmup", "concurrency", "seed",
                 "stream", "temperature", "mix"}
KIND_KEYS = {"name", "weight", "prompt_tokens", "output_tokens", "tools", "thinking", "temperature"}
LENGTH_FORMS = ("fixed", "uniform", "dataset")
# The lab stand-in's token: a run of word characters, or one other non-space character.
STANDIN_TOKEN = re.compile(r"\w+|[^\w\s]")
# Without a count, a duration-bound run cycles through this many distinct requests at least
# (or two per request in flight): engine_bench marks each pass after the first, so the engine
# never sees the same prompt twice.
DURATION_POOL = 32

WORDS = (
    "the of and to in is was that for on with as by at from his her they this which are be or "
    "had not have an were their but one all she there been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then "
    "do first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three house use during without again place around however "
    "home small found thought went say part once general high upon school every does got united "
    "left number course war until always away something fact though water less public put think "
    "almost hand enough far took head yet government system better set told nothing night end why "
    "called eyes find going look asked later knew point next program city business give group "
    "toward young days let room president side social given present several order national second "
    "possible rather per face among form important often things looked early white case john become "
    "large big need four within felt along children saw best church ever least power development light"
).split()

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Beijing."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


class WorkloadError(ValueError):
    """A workload that cannot be run; the message names the file and the key."""


@dataclass
class Length:
    form: str  # fixed, uniform or dataset
    value: object  # N, [lo, hi] or the dataset's name


@dataclass
class Kind:
    name: str
    weight: float
    prompt_tokens: Length
    output_tokens: Length
    tools: bool = False
    thinking: bool | None = None
    temperature: float | None = None


@dataclass
class Workload:
    name: str
    file: str
    mix: list[Kind]
    description: str = ""
    requests: int | None = None
    duration_seconds: float | None = None
    warmup: int = 0
    concurrency: int | None = None
    seed: int = 0
    stream: bool = True
    temperature: float = 0.0
    datasets: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"name": self.name, "file": self.file, "seed": self.seed, "requests": self.requests,
                "warmup": self.warmup, "duration_seconds": self.duration_seconds, "stream": self.stream}


def shortened(workload: Workload, factor: float) -> Workload:
    """The workload cut to `factor` of its length - its measured requests (at least one) or its
    duration - with its warm-up, seed and mix kept: tune.yml's short benches of successive
    halving. A factor of 1 gives the workload itself."""
    if factor >= 1:
        return workload
    return replace(workload,
                   requests=None if workload.requests is None else max(1, math.ceil(workload.requests * factor)),
                   duration_seconds=None if workload.duration_seconds is None else workload.duration_seconds * factor)


def workload_path(workload: str, find=None) -> Path:
    """A name of files/bench (no slash, no .yml) or a path; `find` resolves a relative path
    (the action finds it beside the playbook)."""
    return named_file(workload, BENCH_DIR, "workload", WorkloadError, find)


def load_workload(path: Path | str, datasets: dict | None = None) -> Workload:
    """The workload file, checked; datasets ({name: path}) are the names it may use."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadError(f"{path}: cannot be read: {error}") from None
    except yaml.YAMLError as error:
        raise WorkloadError(f"{path}: not YAML: {error}") from None
    if not isinstance(document, dict):
        raise WorkloadError(f"{path}: a workload is a mapping (name, requests, mix, ...)")
    where = str(path)
    unknown = set(document) - WORKLOAD_KEYS
    if unknown:
        raise WorkloadError(f"{where}: unknown keys {', '.join(sorted(map(str, unknown)))} "
                            f"(known: {', '.join(sorted(WORKLOAD_KEYS))})")
    name = document.get("name")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"{where}: name: a text is required")
    requests = _integer(document, "requests", where, "requests", minimum=1)
    duration = _number(document, "duration_seconds", where, "duration_seconds", above=0)
    if requests is None and duration is None:
        raise WorkloadError(f"{where}: requests or duration_seconds: one is required")
    mix = document.get("mix")
    if not isinstance(mix, list) or not mix:
        raise WorkloadError(f"{where}: mix: a non-empty list of request kinds is required")
    given = dict(datasets or {})
    kinds = [_kind(entry, where, number, given) for number, entry in enumerate(mix)]
    names = [kind.name for kind in kinds]
    for kind in kinds:
        if names.count(kind.name) > 1:
            raise WorkloadError(f"{where}: mix: the kind name {kind.name!r} is used twice")
    description = document.get("description", "")
    if not isinstance(description, str):
        raise WorkloadError(f"{where}: description: must be a text")
    return Workload(
        name=name,
        file=where,
        mix=kinds,
        description=description,
        requests=requests,
        duration_seconds=duration,
        warmup=_integer(document, "warmup", where, "warmup", minimum=0) or 0,
        concurrency=_integer(document, "concurrency", where, "concurrency", minimum=1),
        seed=_integer(document, "seed", where, "seed") or 0,
        stream=_boolean(document, "stream", where, "stream", default=True),
        temperature=_number(document, "temperature", where, "temperature", minimum=0) or 0.0,
        datasets=sorted({length.value for kind in kinds for length in (kind.prompt_tokens, kind.output_tokens)
                         if length.form == "dataset"}),
    )


# Each check takes the file and the key's path in it (`seed`, `mix[1].weight`) for its error.

def _integer(mapping: dict, key: str, where: str, label: str, minimum: int | None = None):
    value = mapping.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{where}: {label}: must be a whole number, not {value!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{where}: {label}: must be at least {minimum}, not {value}")
    return value


def _number(mapping: dict, key: str, where: str, label: str, minimum: float | None = None,
            above: float | None = None):
    value = mapping.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WorkloadError(f"{where}: {label}: must be a number, not {value!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{where}: {label}: must be at least {minimum}, not {value}")
    if above is not None and value <= above:
        raise WorkloadError(f"{where}: {label}: must be above {above}, not {value}")
    return float(value)


def _boolean(mapping: dict, key: str, where: str, label: str, default=None):
    value = mapping.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise WorkloadError(f"{where}: {label}: must be true or false, not {value!r}")
    return value


def _kind(entry, where: str, number: int, datasets: dict) -> Kind:
    at = f"mix[{number}]"
    if not isinstance(entry, dict):
        raise WorkloadError(f"{where}: {at}: a request kind is a mapping (prompt_tokens, output_tokens, ...)")
    unknown = set(entry) - KIND_KEYS
    if unknown:
        raise WorkloadError(f"{where}: {at}: unknown keys {', '.join(sorted(map(str, unknown)))} "
                            f"(known: {', '.join(sorted(KIND_KEYS))})")
    name = entry.get("name", f"kind-{number}")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"{where}: {at}.name: must be a text")
    weight = _number(entry, "weight", where, f"{at}.weight", above=0)
    lengths = {}
    for key in ("prompt_tokens", "output_tokens"):
        if key not in entry:
            raise WorkloadError(f"{where}: {at}.{key}: required ({{fixed: N}}, {{uniform: [lo, hi]}} or "
                                f"{{dataset: name}})")
        lengths[key] = _length(entry[key], where, f"{at}.{key}", datasets)
    prompt, output = lengths["prompt_tokens"], lengths["output_tokens"]
    if output.form == "dataset" and (prompt.form != "dataset" or prompt.value != output.value):
        raise WorkloadError(f"{where}: {at}.output_tokens: {{dataset: {output.value}}} takes the output length "
                            f"of the prompt's line, so prompt_tokens must be {{dataset: {output.value}}} too")
    return Kind(
        name=name,
        weight=1.0 if weight is None else weight,
        prompt_tokens=prompt,
        output_tokens=output,
        tools=_boolean(entry, "tools", where, f"{at}.tools", default=False),
        thinking=_boolean(entry, "thinking", where, f"{at}.thinking"),
        temperature=_number(entry, "temperature", where, f"{at}.temperature", minimum=0),
    )


def _length(spec, where: str, at: str, datasets: dict) -> Length:
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in LENGTH_FORMS:
        raise WorkloadError(f"{where}: {at}: give exactly one of {{fixed: N}}, {{uniform: [lo, hi]}}, "
                            f"{{dataset: name}}, not {spec!r}")
    form, value = next(iter(spec.items()))
    if form == "fixed":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{where}: {at}.fixed: must be a whole number of at least 1, not {value!r}")
    elif form == "uniform":
        if (not isinstance(value, list) or len(value) != 2
                or any(isinstance(item, bool) or not isinstance(item, int) for item in value)
                or not 1 <= value[0] <= value[1]):
            raise WorkloadError(f"{where}: {at}.uniform: must be [lo, hi], whole numbers with 1 <= lo <= hi, "
                                f"not {value!r}")
        value = list(value)
    else:
        if not isinstance(value, str) or not value:
            raise WorkloadError(f"{where}: {at}.dataset: must be a dataset's name, not {value!r}")
        if value not in datasets:
            given = ", ".join(sorted(datasets)) or "none"
            raise WorkloadError(f"{where}: {at}.dataset: {value!r} is not among the datasets given "
                                f"(engine_bench's datasets option: {given})")
    return Length(form, value)


def load_dataset(name: str, path: Path | str, need_output: bool = False) -> list[dict]:
    """The lines of a JSON Lines dataset, each {prompt, output_tokens?}."""
    path = Path(path)
    where = f"dataset {name} ({path})"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadError(f"{where}: cannot be read: {error}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise WorkloadError(f"{where} line {number}: not JSON: {error}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise WorkloadError(f"{where} line {number}: prompt: a non-empty text is required")
        output = row.get("output_tokens")
        if output is not None and (isinstance(output, bool) or not isinstance(output, int) or output < 1):
            raise WorkloadError(f"{where} line {number}: output_tokens: must be a whole number of at least 1")
        if need_output and output is None:
            raise WorkloadError(f"{where} line {number}: output_tokens: required, a workload takes its "
                                f"output lengths from this dataset")
        rows.append({"prompt": row["prompt"], "output_tokens": output})
    if not rows:
        raise WorkloadError(f"{where}: no lines")
    return rows


def count_tokens(text: str) -> int:
    """Tokens of a text as the lab's stand-in counts them."""
    return len(STANDIN_TOKEN.findall(text))


def synthetic_text(rng: random.Random, tokens: int, label: str) -> str:
    """Text of `tokens` stand-in tokens (or of the label's, if more): `label`, then random words
    in sentences of 6 to 17 words."""
    parts = [label]
    count, sentence = count_tokens(label), rng.randint(6, 17)
    while count < tokens:
        if sentence == 0 and count + 1 < tokens:
            parts[-1] += "."
            sentence = rng.randint(6, 17)
        else:
            parts.append(rng.choice(WORDS))
            sentence -= 1
        count += 1
    return " ".join(parts)


def request_count(workload: Workload, concurrency: int) -> int:
    """How many measured bodies to make: the count, or for a duration-bound run a pool."""
    if workload.requests is not None:
        return workload.requests
    return max(DURATION_POOL, 2 * concurrency)


def expand(workload: Workload, model: str, concurrency: int, datasets: dict | None = None,
           find=None) -> list[dict]:
    """The request bodies (warm-up first), the same for the same workload and seed.

    datasets maps names to paths; `find` resolves a relative dataset path."""
    rows = {}
    for name in workload.datasets:
        path = (datasets or {})[name]
        need_output = any(kind.output_tokens.form == "dataset" and kind.output_tokens.value == name
                          for kind in workload.mix)
        rows[name] = load_dataset(name, find(path) if find else path, need_output)
    rng = random.Random(workload.seed)
    weights = [kind.weight for kind in workload.mix]
    bodies = []
    for index in range(workload.warmup + request_count(workload, concurrency)):
        kind = rng.choices(workload.mix, weights)[0]
        bodies.append(_body(workload, kind, model, rng, rows, index))
    return bodies


def _draw(length: Length, rng: random.Random) -> int:
    if length.form == "fixed":
        return length.value
    return rng.randint(*length.value)


def _body(workload: Workload, kind: Kind, model: str, rng: random.Random, rows: dict, index: int) -> dict:
    label = f"{'w' if index < workload.warmup else 'q'}{index}-{kind.name}:"
    if kind.prompt_tokens.form == "dataset":
        row = rng.choice(rows[kind.prompt_tokens.value])
        prompt = row["prompt"]
        if kind.output_tokens.form == "dataset":
            output = row["output_tokens"]
        else:
            output = _draw(kind.output_tokens, rng)
    else:
        prompt_tokens = _draw(kind.prompt_tokens, rng)
        output = _draw(kind.output_tokens, rng)
        prompt = synthetic_text(rng, prompt_tokens, label)
    temperature = workload.temperature if kind.temperature is None else kind.temperature
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": output,
        "ignore_eos": True,
        "temperature": temperature,
        "stream": workload.stream,
    }
    if workload.stream:
        body["stream_options"] = {"include_usage": True}
    if kind.tools:
        body["tools"] = [TOOL]
        body["tool_choice"] = "auto"
    if kind.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": kind.thinking}
    return body
