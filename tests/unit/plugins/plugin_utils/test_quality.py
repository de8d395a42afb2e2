"""plugins/plugin_utils/_quality.py: the scorers, the checks of a set, the gate's arithmetic, and
files/quality/default.yml, whose every reference is recomputed here from its prompt."""

from __future__ import annotations

import ast
import json
import operator
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from gates_defaults import QUALITY_BOUND

from ansible_collections.biv100.serving.plugins.plugin_utils import _quality as quality
from ansible_collections.biv100.serving.plugins.plugin_utils._schema_errors import schema_errors

REPO = Path(__file__).resolve().parents[4]
DEFAULT_SET = REPO / "files" / "quality" / "default.yml"
SETS = DEFAULT_SET.parent
ADA_SCHEMA = {
    "type": "object",
    "required": ["name", "year"],
    "additionalProperties": False,
    "properties": {"name": {"type": "string", "const": "Ada"}, "year": {"type": "integer"}},
}


def case(scorer, reference, **extra):
    return quality.Case(name="c", prompt="p", reference=reference, scorer=scorer, **extra)


def right(scorer, reference, answer, **extra):
    return quality.score_answer(case(scorer, reference, **extra), answer)


# ---- the scorers ---------------------------------------------------------------------------


@pytest.mark.parametrize("answer, expected", [
    ("apple fig pear", True),
    ("  apple fig pear\n", True),       # trimmed
    ("apple fig pear.", False),         # exact is exact
    ("apple  fig pear", False),
    ("Apple fig pear", False),
    ("", False),
])
def test_exact(answer, expected):
    assert right("exact", "apple fig pear", answer) is expected


@pytest.mark.parametrize("reference, answer, expected", [
    (391, "391", True),
    (391, "391.", True),                # a full stop is no decimal point
    (391, " 391\n", True),
    (391, "391.0", True),               # numeric equality
    (391, "**391**", True),
    (391, "17 * 23 = 391", True),       # the last number is the answer
    (391, "391 is the answer", True),
    (391, "3.91", False),
    (391, "392", False),
    (391, "3 91", False),
    (391, "three hundred ninety-one", False),
    (391, "", False),
    (-27, "-27", True),
    (-27, "\u221227", True),            # a typographic minus
    (-27, "27", False),
    (1369, "1,369", True),              # digit groups
    (14074, "14,074.", True),
    (3, "1,2,3", True),                 # a list, not digit groups: its last number
    (0.5, "0.50", True),
])
def test_number(reference, answer, expected):
    assert right("number", reference, answer) is expected


@pytest.mark.parametrize("answer, expected", [("3.1416", True), ("3.13", True), ("3.2", False), ("3", False)])
def test_number_within_a_tolerance(answer, expected):
    assert right("number", 3.14, answer, tolerance=0.01) is expected


@pytest.mark.parametrize("answer, expected", [
    ("C", True),
    (" C)", True),
    ("c", True),                        # the whole answer, either case
    ("(c).", True),
    ("**C**", True),
    ("C) 30", True),
    ("The answer is C.", True),         # no A-E standing alone before it
    ("Answer: C", True),                # the A of Answer does not stand alone
    ("A) 12 is less than C) 30", False),  # the first letter found is A
    ("D", False),
    ("Cat", False),
    ("c is the one", False),            # lower case only as the whole answer
    ("", False),
])
def test_choice(answer, expected):
    assert right("choice", "C", answer) is expected


@pytest.mark.parametrize("answer, expected", [
    ("2024-03-05", True),
    (" 2024-03-05\n", True),
    ("2024-03-05.", False),             # the whole answer must match
    ("Date: 2024-03-05", False),
    ("2024-3-5", False),
])
def test_regex(answer, expected):
    assert right("regex", "2024-03-05", answer) is expected


def test_a_regex_reference_is_a_pattern():
    assert right("regex", r"2024-03-05\.?", "2024-03-05.") and right("regex", r"\d{4}-\d{2}-\d{2}", "1999-12-31")


@pytest.mark.parametrize("answer, expected", [
    ('{"name": "Ada", "year": 1815}', True),
    ('{"year":1815,"name":"Ada"}', True),
    ('  {"name": "Ada", "year": 1815.0}\n', True),          # numbers by value
    ('```json\n{"name": "Ada", "year": 1815}\n```', True),  # one fence around it
    ('```\n{"name": "Ada", "year": 1815}\n```', True),
    ('{"name": "Ada", "year": "1815"}', False),             # a text is no number
    ('{"name": "Ada", "year": 1815, "born": "London"}', False),
    ('{"name": "Ada"}', False),
    ('{"name": "Ada", "year": 1815} and nothing else', False),
    ("{'name': 'Ada', 'year': 1815}", False),               # not JSON
    ('Here it is: ```json\n{"name": "Ada", "year": 1815}\n```', False),
    ("", False),
])
def test_json(answer, expected):
    assert right("json", {"name": "Ada", "year": 1815}, answer) is expected


@pytest.mark.parametrize("reference, answer, expected", [
    ({"ok": True}, '{"ok": 1}', False),          # true is not 1
    ({"count": 1}, '{"count": true}', False),
    ([1, 2], "[1, 2]", True),
    ([1, 2], "[2, 1]", False),
    (None, "null", True),
    (1, "NaN", False),                           # no JSON number
])
def test_json_types(reference, answer, expected):
    assert right("json", reference, answer) is expected


@pytest.mark.parametrize("answer, expected", [
    ('{"name": "Ada", "year": 1815}', True),
    ('```json\n{"year": 1815, "name": "Ada"}\n```', True),
    ('{"name": "Ada", "year": "1815"}', False),
    ('{"name": "Ada", "year": 1815, "extra": 1}', False),
    ('{"name": "Grace", "year": 1815}', False),
    ('{"name": "Ada"}', False),
    ("not json", False),
])
def test_json_schema(answer, expected):
    assert right("json_schema", ADA_SCHEMA, answer) is expected


# ---- answers to scores ---------------------------------------------------------------------


def chat_answer(content, **extra):
    return {"name": "c", "status": 200, "body": {"choices": [{"message": {"role": "assistant", "content": content}}]},
            "error": None, **extra}


@pytest.mark.parametrize("result, content, failure", [
    (chat_answer("391"), "391", None),
    (chat_answer("<think>\n\n</think>\n\n391"), "391", None),   # an empty thinking block left in
    (chat_answer(None), "", None),                             # all of it went elsewhere
    ({"status": None, "error": "timed out after 60 s"}, None, "no answer: timed out after 60 s"),
    ({"status": 500, "body": {"object": "error", "message": "engine dead"}}, None, "HTTP 500: engine dead"),
    ({"status": 400, "body": {"error": {"message": "bad seed"}}}, None, "HTTP 400: bad seed"),
    ({"status": 502, "body": None, "text": "Bad Gateway"}, None, "HTTP 502: Bad Gateway"),
    ({"status": 200, "body": {"choices": []}}, None, "no message in the answer"),
])
def test_answer_content(result, content, failure):
    assert quality.answer_content(result) == (content, failure)


def small_set(tmp_path, text):
    path = tmp_path / "set.yml"
    path.write_text(textwrap.dedent(text))
    return quality.load_set(path)


SMALL = """
    name: small
    defaults: {temperature: 0, seed: 7, max_tokens: 16}
    cases:
      - {name: add, prompt: "Compute 1 + 2. Answer with the number only.", reference: 3, scorer: number}
      - {name: pick, prompt: "Which?", reference: B, scorer: choice, request: {max_tokens: 4}}
      - {name: word, prompt: "Reverse the word 'abc'. Answer with the reversed word only.", reference: cba, scorer: exact}
"""


def test_a_failed_request_scores_zero_for_its_case_only(tmp_path):
    evaluation = quality.evaluate(small_set(tmp_path, SMALL), [
        chat_answer("3"), {"status": 500, "body": {"message": "boom"}}, chat_answer("cba")])
    assert (evaluation.score, evaluation.cases, evaluation.correct) == (2 / 3, 3, 2)
    assert [verdict.as_dict() for verdict in evaluation.failed] == [
        {"name": "pick", "scorer": "choice", "correct": False, "expected": "B", "given": "(HTTP 500: boom)"}]


def test_an_empty_answer_is_wrong_and_says_so(tmp_path):
    evaluation = quality.evaluate(small_set(tmp_path, SMALL), [chat_answer(None), chat_answer(" "), chat_answer("cba")])
    assert [(verdict.correct, verdict.given) for verdict in evaluation.verdicts] == [
        (False, "(empty answer)"), (False, "(empty answer)"), (True, "cba")]


def test_long_answers_are_cut_in_the_verdicts(tmp_path):
    evaluation = quality.evaluate(small_set(tmp_path, SMALL), [chat_answer("word " * 100)] * 3)
    assert evaluation.correct == 0
    assert all(len(verdict.given) <= quality.SHORT_CHARS and verdict.given.endswith("…")
               for verdict in evaluation.verdicts)


def test_answers_must_match_the_cases(tmp_path):
    with pytest.raises(quality.QualityError, match="2 answers came back for the 3 cases"):
        quality.evaluate(small_set(tmp_path, SMALL), [chat_answer("3")] * 2)


def test_the_chat_requests(tmp_path):
    add, pick, _word = quality.chat_requests(small_set(tmp_path, SMALL), "qwen3_5", 30.0)
    assert add == {"name": "add", "method": "POST", "path": "/v1/chat/completions", "timeout": 30.0, "body": {
        "model": "qwen3_5", "messages": [{"role": "user", "content": "Compute 1 + 2. Answer with the number only."}],
        "temperature": 0, "seed": 7, "max_tokens": 16}}
    assert pick["body"]["max_tokens"] == 4          # the case's own field over the set's
    unnamed = quality.chat_requests(small_set(tmp_path, SMALL), None, 30.0)[0]["body"]
    assert "model" not in unnamed                   # the engine's one served model


def test_the_simulated_header():
    assert quality.simulated([chat_answer("1", headers={}), chat_answer("1", headers={"x-biv100-simulated": "1"})])
    assert not quality.simulated([chat_answer("1", headers={"content-type": "application/json"}), chat_answer("1")])


# ---- checking a set ------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("- a list\n", "must be a mapping with name and cases"),
    ("name: x\ncases: [\n", "is not YAML"),
    ("name: x\ncolour: red\ncases: []\n", "unknown keys colour"),
    ("cases: [{name: a, prompt: p, reference: 1, scorer: number}]\n", "name is missing"),
    ("name: x\ncases: []\n", "cases must be a non-empty list"),
    ("name: x\ndefaults: {model: other}\ncases: [{name: a, prompt: p, reference: 1, scorer: number}]\n",
     "defaults: model are filled in by the gate"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 1, scorer: number}, oops]\n", "case 2 is not a mapping"),
    ("name: x\ncases: [{prompt: p, reference: 1, scorer: number}]\n", "case 1: name must be a non-empty text"),
    ("name: x\ncases: [{name: a, prompt: '', reference: 1, scorer: number}]\n", "case a: prompt must be"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 1, scorer: number, colour: red}]\n",
     "case a: unknown keys colour"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 1, scorer: fuzzy}]\n",
     "case a: scorer must be one of exact, number, choice, regex, json, json_schema, not 'fuzzy'"),
    ("name: x\ncases: [{name: a, prompt: p, scorer: number}]\n", "case a: reference is missing"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 2024-03-05, scorer: regex}]\n",
     "case a: reference must be a text for the regex scorer, not date datetime.date(2024, 3, 5) (quote it)"),
    ("name: x\ncases: [{name: a, prompt: p, reference: '391', scorer: number}]\n",
     "case a: reference must be a number for the number scorer"),
    ("name: x\ncases: [{name: a, prompt: p, reference: F, scorer: choice}]\n",
     "case a: reference must be one letter of ABCDE, not 'F'"),
    ("name: x\ncases: [{name: a, prompt: p, reference: '(', scorer: regex}]\n",
     "case a: reference '(' is not a regular expression"),
    ("name: x\ncases: [{name: a, prompt: p, reference: [1], scorer: json_schema}]\n",
     "case a: reference must be a JSON schema (a mapping)"),
    ("name: x\ncases: [{name: a, prompt: p, reference: {type: colour}, scorer: json_schema}]\n",
     "case a: reference is no schema that applies: #/type: 'colour' is not valid under any of the given schemas"),
    # Nested schemas are checked too, when the set is loaded.
    ("name: x\ncases: [{name: a, prompt: p, reference: {properties: {year: {minimum: low}}}, scorer: json_schema}]\n",
     "case a: reference is no schema that applies: #/properties/year/minimum: 'low' is not of type 'number'"),
    ("name: x\ncases: [{name: a, prompt: p, reference: {born: 1815-12-10}, scorer: json}]\n",
     "case a: reference: datetime.date(1815, 12, 10) (date) is no JSON value (quote it)"),
    ("name: x\ncases: [{name: a, prompt: p, reference: x, scorer: exact, tolerance: 1}]\n",
     "case a: tolerance is for the number scorer only"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 1, scorer: number, tolerance: -1}]\n",
     "case a: tolerance must be a number of at least 0"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 1, scorer: number, request: {messages: []}}]\n",
     "case a: request: messages are filled in by the gate"),
    ("name: x\ncases: [{name: a, prompt: p, reference: 1, scorer: number},"
     " {name: a, prompt: q, reference: 2, scorer: number}]\n", "case a: the name is used twice"),
])
def test_a_bad_set_is_refused_naming_the_file_and_the_case(tmp_path, text, message):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(quality.QualityError) as refusal:
        quality.load_set(path)
    assert str(path) in str(refusal.value) and message in str(refusal.value), str(refusal.value)


def test_a_schema_fault_an_answer_brings_out_names_the_set_and_the_case(tmp_path):
    # A $ref is followed only for a value it applies to, so one that does not resolve shows only then.
    path = tmp_path / "set.yml"
    path.write_text("name: x\ncases: [{name: a, prompt: p, scorer: json_schema,"
                    " reference: {properties: {year: {$ref: '#/$defs/year'}}}}]\n")
    loaded = quality.load_set(path)
    assert quality.evaluate(loaded, [chat_answer('{"name": "Ada"}')]).correct == 1
    with pytest.raises(quality.QualityError, match=f"quality set {path} case a: the reference is no schema "
                                                   "that applies: .*does not resolve"):
        quality.evaluate(loaded, [chat_answer('{"year": 1}')])


def test_a_set_is_found_by_name_or_path(tmp_path):
    assert quality.resolve_set("default", SETS) == DEFAULT_SET
    assert quality.resolve_set(str(DEFAULT_SET), SETS) == DEFAULT_SET
    with pytest.raises(quality.QualityError, match=r"no quality set named 'nope' in .* \(there: default"):
        quality.resolve_set("nope", SETS)
    with pytest.raises(quality.QualityError, match="quality set .*/missing.yml does not exist"):
        quality.resolve_set(str(tmp_path / "missing.yml"), SETS)


# ---- the gate ------------------------------------------------------------------------------

SUB168 = {"release": "sub168", "score": 0.96875}


@pytest.mark.parametrize("score, baseline, bound, deviation, passed, msg", [
    (0.90625, SUB168, 0.04, -0.064516, False, "quality 0.906 vs 0.969 of sub168: -6.5 % beyond ±4 %"),
    (0.96875, SUB168, 0.04, 0.0, True, "quality 0.969 vs 0.969 of sub168: +0.0 % within ±4 %"),
    (0.9375, SUB168, 0.04, -0.032258, True, "quality 0.938 vs 0.969 of sub168: -3.2 % within ±4 %"),
    # Higher deviates too: the bound is relative to the reference, both ways.
    (1.0, {"release": "sub9", "score": 0.9}, 0.04, 0.111111, False, "quality 1.000 vs 0.900 of sub9: +11.1 % beyond ±4 %"),
    # On the bound, float arithmetic notwithstanding (0.96 / 1.0 - 1 is -0.040000000000000036).
    (0.96, {"release": "sub1", "score": 1.0}, 0.04, -0.04, True, "quality 0.960 vs 1.000 of sub1: -4.0 % within ±4 %"),
    # Just beyond it: shown with the decimals that make it read as beyond.
    (0.9596, {"release": "sub1", "score": 1.0}, 0.04, -0.0404, False, "quality 0.960 vs 1.000 of sub1: -4.04 % beyond ±4 %"),
    (0.95, {"release": "sub1", "score": 1.0}, 0.025, -0.05, False, "quality 0.950 vs 1.000 of sub1: -5.0 % beyond ±2.5 %"),
])
def test_the_deviation_from_a_baseline(score, baseline, bound, deviation, passed, msg):
    comparison = quality.compare(score, baseline, bound)
    assert comparison.deviation == pytest.approx(deviation, abs=1e-6)
    assert (comparison.passed, comparison.msg) == (passed, msg)


def test_without_a_baseline_the_score_passes_and_becomes_one():
    assert quality.compare(0.96875, None, QUALITY_BOUND) == quality.Comparison(
        None, True, "quality 0.969 (no baseline yet: this release's score becomes one once it is good)")


def test_without_a_baseline_a_zero_score_does_not_pass():
    comparison = quality.compare(0.0, None, QUALITY_BOUND)
    assert comparison.passed is False and comparison.deviation is None and "cannot become one" in comparison.msg


@pytest.mark.parametrize("score", [0.0, 0.5])
def test_a_zero_baseline_bounds_nothing(score):
    comparison = quality.compare(score, {"release": "sub0", "score": 0.0}, QUALITY_BOUND)
    assert comparison.deviation is None and comparison.passed is False
    assert comparison.msg.startswith(f"quality {score:.3f} vs 0.000 of sub0: a zero baseline bounds nothing")


@pytest.mark.parametrize("baseline, bound, message", [
    ({"release": "x", "score": 1.5}, 0.04, "baseline score must be a number from 0 to 1"),
    ({"release": "x", "score": "high"}, 0.04, "baseline score must be a number from 0 to 1"),
    (None, -0.01, "bound must be at least 0"),
])
def test_bad_gate_figures_are_refused(baseline, bound, message):
    with pytest.raises(quality.QualityError, match=message):
        quality.compare(0.5, baseline, bound)


# ---- files/quality/default.yml, recomputed -------------------------------------------------
#
# The forms the lab's engine stand-in answers by computing; a prompt in any other form would
# get no right answer from it. Each form's answer is computed here independently of _quality.

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
DAYS_IN = {2: 29, 4: 30, 6: 30, 9: 30, 11: 30}


def integer_arithmetic(expression: str) -> int:
    def value(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        # bool is an int subclass; True is no integer of the question.
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        raise AssertionError(f"{expression!r}: only integers, + - * // and parentheses")
    return value(ast.parse(expression, mode="eval").body)


def iso_date(text: str) -> str:
    month, day, year = re.fullmatch(r"([A-Z][a-z]+) (\d{1,2}), (\d{4})", text).groups()
    month, day, year = MONTHS.index(month) + 1, int(day), int(year)
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    assert 1 <= day <= (28 + leap if month == 2 else DAYS_IN.get(month, 31)), text
    return f"{year:04d}-{month:02d}-{day:02d}"


def pick(which: str, options: str) -> str:
    numbers = {letter: int(number) for letter, number in re.findall(r"([A-E])\) (\d+)", options)}
    best = (max if which == "largest" else min)(numbers.values())
    (letter,) = [letter for letter, number in numbers.items() if number == best]  # no ties
    return letter


FORMS = [
    (r"Compute (?P<expression>[0-9+\-*/() ]+)\. Answer with the number only\.", {"number"},
     lambda m: integer_arithmetic(m["expression"])),
    (r"Which of these numbers is the (?P<which>largest|smallest)\? (?P<options>[A-E]\) \d+(?: [A-E]\) \d+)+)\. "
     r"Answer with the letter only\.", {"choice"}, lambda m: pick(m["which"], m["options"])),
    (r"How many times does the letter '(?P<letter>[a-z])' appear in '(?P<word>[a-z]+)'\? Answer with the number only\.",
     {"number"}, lambda m: m["word"].count(m["letter"])),
    (r"Sort these words alphabetically, separated by single spaces: (?P<words>[a-z]+(?: [a-z]+)+)\.", {"exact"},
     lambda m: " ".join(sorted(m["words"].split()))),
    (r"Reverse the word '(?P<word>[a-z]+)'\. Answer with the reversed word only\.", {"exact"},
     lambda m: m["word"][::-1]),
    (r'Return a JSON object with keys "name" set to "(?P<name>[^"]+)" and "year" set to (?P<year>\d+), and nothing else\.',
     {"json", "json_schema"}, lambda m: {"name": m["name"], "year": int(m["year"])}),
    (r"Write the date (?P<date>[A-Z][a-z]+ \d{1,2}, \d{4}) in ISO 8601 format \(YYYY-MM-DD\), nothing else\.",
     {"regex"}, lambda m: iso_date(m["date"])),
]


def recomputed(prompt: str):
    """(answer, scorers the form allows) for a prompt in one of the forms."""
    for pattern, scorers, answer in FORMS:
        match = re.fullmatch(pattern, prompt)
        if match:
            return answer(match), scorers
    raise AssertionError(f"{prompt!r} is in none of the forms the stand-in answers")


def as_answer_text(value) -> str:
    return json.dumps(value) if isinstance(value, dict) else str(value)


RAW_CASES = yaml.safe_load(DEFAULT_SET.read_text())["cases"]


@pytest.mark.parametrize("entry", RAW_CASES, ids=[entry["name"] for entry in RAW_CASES])
def test_every_reference_of_the_default_set_is_right(entry):
    answer, scorers = recomputed(entry["prompt"])
    assert entry["scorer"] in scorers, f"{entry['name']}: the {entry['scorer']} scorer for this form"
    reference = entry["reference"]
    if entry["scorer"] in ("number", "exact", "choice", "json"):
        # As JSON, so that 3 and '3' (or 3.0) differ.
        assert json.dumps(reference, sort_keys=True) == json.dumps(answer, sort_keys=True), (reference, answer)
    elif entry["scorer"] == "regex":
        assert re.fullmatch(reference, answer), (reference, answer)
    else:
        assert schema_errors(answer, reference) == []
        # The schema pins the values, not only the shape.
        for wrong in ({**answer, "year": answer["year"] + 1}, {**answer, "name": answer["name"] + "x"},
                      {**answer, "year": str(answer["year"])}, {**answer, "extra": 1}):
            assert schema_errors(wrong, reference), wrong
    # And the gate's own scorer agrees that a model giving that answer is right.
    loaded = {case.name: case for case in quality.load_set(DEFAULT_SET).cases}[entry["name"]]
    assert quality.score_answer(loaded, as_answer_text(answer))


def test_the_default_set():
    default = quality.load_set(DEFAULT_SET)
    assert default.name == "default" and default.description
    assert len(default.cases) >= 30
    assert {case.scorer for case in default.cases} == set(quality.SCORERS)
    assert default.defaults["temperature"] == 0 and isinstance(default.defaults["seed"], int)
    assert default.defaults["max_tokens"] > 0
    assert default.defaults["chat_template_kwargs"] == {"enable_thinking": False}
    assert len({case.prompt for case in default.cases}) == len(default.cases)
