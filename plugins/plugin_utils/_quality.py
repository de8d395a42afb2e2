# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The quality gate: an evaluation set as data, the scorers of its answers, and the comparison
of a release's score with a baseline release's. Controller side only.

A set is a YAML file (files/quality/<name>.yml; `default` is the one the gate runs):

    name: default                         # returned with the score
    description: what the set measures
    defaults:                             # fields of every chat request's body
      temperature: 0
      seed: 1729
      max_tokens: 64
      chat_template_kwargs: {enable_thinking: false}
    cases:
      - name: compute-multiply            # unique in the set
        prompt: Compute 17 * 23. Answer with the number only.    # the user message
        reference: 391                    # what the scorer compares the answer with
        scorer: number
        tolerance: 0                      # number only: how far off still counts (default 0)
        request: {max_tokens: 16}         # optional: body fields over the defaults

Each case is one chat request, `{model, messages: [{role: user, content: prompt}], **defaults,
**request}` (`model`, `messages` and `stream` are the gate's own), sent to
/v1/chat/completions without streaming. Its answer is the first choice's message content, less
a leading `<think>…</think>` block; a request that got no 200 answer scores 0. The scorers, and
what `reference` is for each:

    exact        a string; the answer, trimmed, equals it trimmed
    number       a number; the last number in the answer (`391.`, `= 391`, `1,369`) equals it,
                 or is within `tolerance` of it
    choice       one letter A-E; the first letter A-E standing on its own in the answer (` C)`,
                 `**C**`, `The answer is C.`) - or the whole answer, either case - is it
    regex        a pattern; the answer, trimmed, matches it whole
    json         any JSON value; the answer (trimmed, one ``` fence around it allowed) is JSON
                 equal to it - same types (true is not 1), numbers by value, same keys
    json_schema  a JSON schema (a mapping, of the draft its $schema names, else 2020-12); the
                 answer, read as for json, meets it (_schema_errors.py)

The score is right answers / cases, 0..1. A release is compared with a good release's score
(its baseline): deviation = (score - baseline) / baseline, and the gate passes when
|deviation| <= bound (the gates role passes the competition's, 4 %). A higher score deviates
too: the bound is the reference's, both ways.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._schema_errors import (
    SchemaError,
    check_schema,
    json_equal,
    schema_errors,
)

SCORERS = ("exact", "number", "choice", "regex", "json", "json_schema")
SET_KEYS = {"name", "description", "defaults", "cases"}
CASE_KEYS = {"name", "prompt", "reference", "scorer", "tolerance", "request"}
# Filled in by the gate: the served model, the prompt, and an answer read as one JSON body.
GATE_FIELDS = {"model", "messages", "stream"}
CHOICES = "ABCDE"
CHAT_PATH = "/v1/chat/completions"
SIMULATED_HEADER = "x-biv100-simulated"
SHORT_CHARS = 60
# A score's relative deviation is computed in floats; k/n against a stored k'/n' lands a hair
# off the bound (0.96 vs 1.0 gives -0.040000000000000036), which must still pass.
BOUND_SLACK = 1e-9

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
DIGIT_GROUP_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
LONE_CHOICE = re.compile(r"\W*([A-Ea-e])\W*")
FIRST_CHOICE = re.compile(r"(?<![A-Za-z0-9])([A-E])(?![A-Za-z0-9])")
THINKING = re.compile(r"\A\s*<think>.*?</think>\s*", re.DOTALL)
FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)


class QualityError(ValueError):
    """A set that cannot be run; the message names the file and the case."""


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str
    reference: object
    scorer: str
    tolerance: float = 0
    request: dict | None = None


@dataclass(frozen=True)
class QualitySet:
    name: str
    description: str
    source: str
    defaults: dict
    cases: tuple[Case, ...]


@dataclass(frozen=True)
class CaseVerdict:
    name: str
    scorer: str
    correct: bool
    expected: str
    given: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Evaluation:
    score: float
    cases: int
    correct: int
    verdicts: tuple[CaseVerdict, ...]

    @property
    def failed(self) -> list[CaseVerdict]:
        return [verdict for verdict in self.verdicts if not verdict.correct]


@dataclass(frozen=True)
class Comparison:
    deviation: float | None
    passed: bool
    msg: str


# ---- the set -------------------------------------------------------------------------------


def resolve_set(value: str, folder: Path) -> Path:
    """A set's file: a bare name is files/quality/<name>.yml; anything with a / or a YAML
    suffix is a path (relative to the current folder)."""
    if "/" not in value and not value.endswith((".yml", ".yaml")):
        path = folder / f"{value}.yml"
        if not path.is_file():
            known = sorted(candidate.stem for candidate in folder.glob("*.yml"))
            raise QualityError(f"no quality set named {value!r} in {folder} "
                               f"(there: {', '.join(known) or 'none'})")
        return path
    path = Path(value).expanduser()
    if not path.is_file():
        raise QualityError(f"quality set {path} does not exist")
    return path


def load_set(path: str | Path) -> QualitySet:
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise QualityError(f"quality set {path} cannot be read: {error}") from None
    except yaml.YAMLError as error:
        raise QualityError(f"quality set {path} is not YAML: {error}") from None
    if not isinstance(document, dict):
        raise QualityError(f"quality set {path} must be a mapping with name and cases")
    unknown = set(document) - SET_KEYS
    if unknown:
        raise QualityError(f"quality set {path}: unknown keys {', '.join(sorted(unknown))}")
    if not isinstance(document.get("name"), str) or not document["name"].strip():
        raise QualityError(f"quality set {path}: name is missing")
    description = document.get("description") or ""
    if not isinstance(description, str):
        raise QualityError(f"quality set {path}: description must be text")
    defaults = _request_fields(document.get("defaults"), f"quality set {path}: defaults")
    cases = document.get("cases")
    if not isinstance(cases, list) or not cases:
        raise QualityError(f"quality set {path}: cases must be a non-empty list")
    loaded: list[Case] = []
    seen: set[str] = set()
    for number, entry in enumerate(cases, 1):
        case = _case(entry, path, number)
        if case.name in seen:
            raise QualityError(f"quality set {path} case {case.name}: the name is used twice")
        seen.add(case.name)
        loaded.append(case)
    return QualitySet(document["name"], description.strip(), str(path), defaults, tuple(loaded))


def _request_fields(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise QualityError(f"{where} must be a mapping of request body fields")
    taken = GATE_FIELDS & set(value)
    if taken:
        raise QualityError(f"{where}: {', '.join(sorted(taken))} are filled in by the gate")
    _json_value(value, where)
    return dict(value)


def _case(entry, path: Path, number: int) -> Case:
    if not isinstance(entry, dict):
        raise QualityError(f"quality set {path} case {number} is not a mapping")
    name = entry.get("name")
    where = f"quality set {path} case {name if isinstance(name, str) and name else number}"
    unknown = set(entry) - CASE_KEYS
    if unknown:
        raise QualityError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    for key in ("name", "prompt"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise QualityError(f"{where}: {key} must be a non-empty text")
    scorer = entry.get("scorer")
    if scorer not in SCORERS:
        raise QualityError(f"{where}: scorer must be one of {', '.join(SCORERS)}, not {scorer!r}")
    if "reference" not in entry:
        raise QualityError(f"{where}: reference is missing")
    reference = entry["reference"]
    _check_reference(scorer, reference, where)
    tolerance = entry.get("tolerance", 0)
    if "tolerance" in entry and scorer != "number":
        raise QualityError(f"{where}: tolerance is for the number scorer only")
    if not _is_number(tolerance) or tolerance < 0 or not math.isfinite(tolerance):
        raise QualityError(f"{where}: tolerance must be a number of at least 0")
    request = _request_fields(entry.get("request"), f"{where}: request")
    return Case(name, entry["prompt"], reference, scorer, tolerance, request or None)


def _check_reference(scorer: str, reference, where: str) -> None:
    if scorer in ("exact", "regex", "choice") and not isinstance(reference, str):
        # YAML reads 2024-03-05 as a date and 042 as a number: the text must be quoted.
        raise QualityError(f"{where}: reference must be a text for the {scorer} scorer, not "
                           f"{type(reference).__name__} {reference!r} (quote it)")
    if scorer == "number" and (not _is_number(reference) or not math.isfinite(reference)):
        raise QualityError(f"{where}: reference must be a number for the number scorer, "
                           f"not {reference!r}")
    if scorer == "choice" and reference not in tuple(CHOICES):
        raise QualityError(f"{where}: reference must be one letter of {CHOICES}, not {reference!r}")
    if scorer == "regex":
        try:
            re.compile(reference)
        except re.error as error:
            raise QualityError(f"{where}: reference {reference!r} is not a regular expression: "
                               f"{error}") from None
    if scorer == "json":
        _json_value(reference, f"{where}: reference")
    if scorer == "json_schema":
        if not isinstance(reference, dict):
            raise QualityError(f"{where}: reference must be a JSON schema (a mapping) for the "
                               f"json_schema scorer")
        _json_value(reference, f"{where}: reference")
        try:
            check_schema(reference)
        except SchemaError as error:
            raise QualityError(f"{where}: reference is no schema that applies: {error}") from None


def _json_value(value, where: str) -> None:
    """Refuse what YAML reads and JSON has no value for (dates, non-text keys)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise QualityError(f"{where}: key {key!r} is not a text")
            _json_value(item, where)
    elif isinstance(value, list):
        for item in value:
            _json_value(item, where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise QualityError(f"{where}: {value!r} is no JSON number")
    elif not (value is None or isinstance(value, (str, bool, int, float))):
        raise QualityError(f"{where}: {value!r} ({type(value).__name__}) is no JSON value "
                           f"(quote it)")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- the requests --------------------------------------------------------------------------


def chat_requests(quality_set: QualitySet, served_model_name: str | None, timeout: float) -> list[dict]:
    """engine_probe's `requests`, one per case in the set's order. Without a served name the
    body names no model and the engine answers with the one it serves."""
    requests = []
    for case in quality_set.cases:
        body = {"model": served_model_name} if served_model_name else {}
        body["messages"] = [{"role": "user", "content": case.prompt}]
        body.update(quality_set.defaults)
        body.update(case.request or {})
        requests.append({"name": case.name, "method": "POST", "path": CHAT_PATH, "body": body,
                         "timeout": timeout})
    return requests


# ---- the answers ---------------------------------------------------------------------------


def answer_content(result: dict) -> tuple[str | None, str | None]:
    """(content, None) for an answered chat request; (None, why) for one that failed."""
    if result.get("error"):
        return None, f"no answer: {result['error']}"
    status = result.get("status")
    body = result.get("body")
    if status != 200:
        detail = (body.get("message") or body.get("error")) if isinstance(body, dict) else None
        if isinstance(detail, dict):  # {"error": {"message": ...}}
            detail = detail.get("message") or detail
        detail = detail or result.get("text")
        return None, f"HTTP {status}" + (f": {_flat(detail)}" if detail else "")
    try:
        content = body["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None, "no message in the answer"
    if not isinstance(content, str):
        # Everything went to reasoning_content or a tool call: no answer to the question.
        return "", None
    return THINKING.sub("", content, count=1), None


def score_answer(case: Case, answer: str) -> bool:
    """Whether the answer (the message content) is right for the case."""
    return SCORE[case.scorer](answer, case)


def _exact(answer: str, case: Case) -> bool:
    return answer.strip() == case.reference.strip()


def last_number(answer: str) -> Fraction | None:
    numbers = NUMBER.findall(DIGIT_GROUP_COMMA.sub("", answer.replace("\u2212", "-")))
    return Fraction(numbers[-1]) if numbers else None


def _number(answer: str, case: Case) -> bool:
    given = last_number(answer)
    if given is None:
        return False
    return abs(given - Fraction(str(case.reference))) <= Fraction(str(case.tolerance))


def first_choice(answer: str) -> str | None:
    lone = LONE_CHOICE.fullmatch(answer)
    if lone:
        return lone.group(1).upper()
    found = FIRST_CHOICE.search(answer)
    return found.group(1) if found else None


def _choice(answer: str, case: Case) -> bool:
    return first_choice(answer) == case.reference


def _regex(answer: str, case: Case) -> bool:
    return re.fullmatch(case.reference, answer.strip()) is not None


class _NotJSON(ValueError):
    pass


def _refuse_constant(name: str):
    raise _NotJSON(f"{name} is no JSON number")


def parse_json(answer: str):
    """The answer's JSON value; _NotJSON when it is none. One code fence around it is allowed."""
    text = answer.strip()
    fenced = FENCE.fullmatch(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as error:
        raise _NotJSON(str(error)) from None


def _json(answer: str, case: Case) -> bool:
    try:
        return json_equal(parse_json(answer), case.reference)
    except _NotJSON:
        return False
    except SchemaError as error:  # no jsonschema on the controller
        raise QualityError(f"case {case.name}: {error}") from None


def _json_schema(answer: str, case: Case) -> bool:
    try:
        value = parse_json(answer)
    except _NotJSON:
        return False
    try:
        return not schema_errors(value, case.reference)
    except SchemaError as error:
        # A fault of the set that only checking an answer brings out (a $ref that does not resolve).
        raise QualityError(f"case {case.name}: the reference is no schema that applies: {error}") from None


SCORE = {"exact": _exact, "number": _number, "choice": _choice, "regex": _regex, "json": _json,
         "json_schema": _json_schema}


def evaluate(quality_set: QualitySet, results: list[dict]) -> Evaluation:
    """Each case's answer (engine_probe's results, in the set's order) scored."""
    if len(results) != len(quality_set.cases):
        raise QualityError(f"{len(results)} answers came back for the {len(quality_set.cases)} "
                           f"cases of quality set {quality_set.source}")
    verdicts = []
    for case, result in zip(quality_set.cases, results):
        content, failure = answer_content(result)
        if content is None:
            verdicts.append(CaseVerdict(case.name, case.scorer, False, expected(case), f"({failure})"))
        else:
            try:
                correct = score_answer(case, content)
            except QualityError as error:
                raise QualityError(f"quality set {quality_set.source} {error}") from None
            verdicts.append(CaseVerdict(case.name, case.scorer, correct, expected(case),
                                        _short(content) or "(empty answer)"))
    correct = sum(verdict.correct for verdict in verdicts)
    return Evaluation(correct / len(verdicts), len(verdicts), correct, tuple(verdicts))


def expected(case: Case) -> str:
    if case.scorer in ("json", "json_schema"):
        text = json.dumps(case.reference, separators=(",", ":"), ensure_ascii=False)
        return _short(text if case.scorer == "json" else f"JSON meeting {text}")
    if case.scorer == "regex":
        return _short(f"/{case.reference}/")
    if case.scorer == "number" and case.tolerance:
        return f"{case.reference} ± {case.tolerance}"
    return _short(str(case.reference))


def _flat(text) -> str:
    return _short(str(text))


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHORT_CHARS else text[:SHORT_CHARS - 1] + "…"


def simulated(results: list[dict]) -> bool:
    """Whether any answer came from the lab's stand-in rather than a model."""
    return any(SIMULATED_HEADER in (result.get("headers") or {}) for result in results)


# ---- the gate ------------------------------------------------------------------------------


def compare(score: float, baseline: dict | None, bound: float) -> Comparison:
    """The score against a baseline release's {release, score}, within ±bound (relative)."""
    if bound < 0:
        raise QualityError(f"bound must be at least 0, not {bound}")
    if baseline is None:
        if score == 0:
            # Without this, a release that answers nothing right could pass and become the
            # baseline every later release is held to.
            return Comparison(None, False, "quality 0.000 (no baseline yet, and a score of 0 "
                                           "cannot become one: no case was answered right)")
        return Comparison(None, True, f"quality {score:.3f} (no baseline yet: this release's "
                                      f"score becomes one once it is good)")
    release, reference = baseline.get("release"), baseline.get("score")
    if not _is_number(reference) or not 0 <= reference <= 1:
        raise QualityError(f"baseline score must be a number from 0 to 1, not {reference!r}")
    if reference == 0:
        # A relative deviation from 0 is undefined: no score is within any bound of it.
        return Comparison(None, False, f"quality {score:.3f} vs 0.000 of {release}: a zero "
                                       f"baseline bounds nothing; measure a good release again")
    deviation = (score - reference) / reference
    passed = abs(deviation) <= bound + BOUND_SLACK
    return Comparison(deviation, passed, f"quality {score:.3f} vs {reference:.3f} of {release}: "
                                         f"{_percent(deviation, bound, passed)} "
                                         f"{'within' if passed else 'beyond'} ±{bound * 100:g} %")


def _percent(deviation: float, bound: float, passed: bool) -> str:
    """The deviation in percent, with as many decimals as it takes not to read like the other
    verdict (-4.04 % is beyond ±4 %, not "-4.0 % beyond")."""
    for decimals in range(1, 5):
        shown = round(deviation * 100, decimals)
        if (abs(shown) <= bound * 100 + BOUND_SLACK) == passed:
            break
    return f"{deviation * 100:+.{decimals}f} %"
