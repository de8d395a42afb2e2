# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Functional probes as data: loading and checking suites, filling in the engine's values,
and judging answers with jmespath. Controller side only.

A suite file is a YAML list of probes:

    - name: chat-basic                      # unique across the suites of a run
      tags: [chat]
      checks: protocol                      # or model (see below)
      guards: a plain question gets one assistant answer    # the failure this probe catches
      request:
        method: POST                        # GET by default
        path: /v1/chat/completions
        body: {messages: [{role: user, content: Hi}], max_tokens: 16}   # or raw_body: "{"
        stream: false                       # true: the answer is read as server-sent events
        timeout: 60
        concurrent: 1                       # copies sent at once (answers in `responses`)
        repeat: 1                           # copies sent one after the other (likewise)
        auth: true                          # send the API key
      expect:                               # jmespath over the answer; each must be truthy
        - status == `200`
        - body.choices[0].message.content != ''

`checks` says what a pass proves. `protocol`: the server's side of the API, which any model's
engine must get right whatever its weights say - status codes, error shapes, `n`, token limits,
null content, streaming chunks, usage, guided JSON and tool-call shapes (whose decoding is
constrained by the server, so a request asks for what constrained decoding can finish within its
token budget). `model`: what a trained model says - an answer that follows the instructions, a
tool it chose to call, its thinking closed, the same text twice. A host whose model has random
weights (the lab's real engine) is gated on the `protocol` probes (probe_checks).

A chat body without `model` asks for the served model. Strings of the request and the
expectations may name the engine's values as `${name}`: in a request, a whole string `${name}`
is the value with its type, and inside a string its text; in an expectation, the value as a
jmespath literal (`max_model_len == ${max_model_len}`). In a body, `{$repeat: "word ", times: N}`
stands for the text repeated N times (N a number or `${name}`), expanded on the host.

An expectation reads the answer - `status`, `body` (the JSON), `text` (an answer that is not
JSON), `stream` (a streamed answer: `choices` assembled per index, `usage`, `done`,
`event_count`, the first 50 `events`), `responses` (every copy of a concurrent or repeated
request), `latency_ms`, `error` - and `request`, the probe's request with its values filled in
(before `$repeat` is expanded), so that what was asked for is written once:

    - schema_ok(from_json(body.choices[0].message.content),
                request.body.response_format.json_schema.schema)

Besides jmespath's own functions, expectations may call these, which a judge of an
OpenAI-compatible server needs and jmespath lacks:

    from_json(text)              the JSON value the text holds; null when it is not JSON (or null).
                                 Strict: NaN and Infinity are not JSON; whitespace around is.
    json_valid(text)             true when the text is one JSON value (false for null); tells
                                 an answer of `null` from one that does not parse
    schema_errors(value, schema) the list of what makes value invalid against the JSON Schema
                                 (the draft its $schema names, else 2020-12; $refs within the
                                 schema), checked by the jsonschema package (see
                                 _schema_errors.py), each naming the JSON pointer of the place;
                                 empty when valid
    schema_ok(value, schema)     true when schema_errors is empty
    regex_match(text, pattern)   true when Python's re.search finds pattern in text
    regex_fullmatch(text, pattern)  true when pattern matches the whole text

A schema is an object (or a boolean): a JSON literal in the expectation
(`` `{"type": "object"}` ``), a value (`${answer_schema}`), a part of the request
(`request.body.tools[0].function.parameters`) or a multi-select built of them
(`{type: 'array', items: request.body.tools[0].function.parameters}`). A pattern is Python
`re` syntax in a raw string literal ('^chatcmpl-'). Calling a function that does not exist or
with the wrong number of arguments, and a literal pattern that is not a regular expression,
fail the suite when it is loaded; a schema that cannot be applied (one its draft's
meta-schema refuses, a $ref that does not resolve) fails the expectation, naming why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic
from ansible_collections.biv100.serving.plugins.plugin_utils._schema_errors import (
    SchemaError,
    schema_errors,
)

# jmespath is a controller requirement (requirements.txt), not one of ansible-core's: without it
# the plugins still load, and a run that has probes to judge fails naming the package.
try:
    import jmespath
    from jmespath.exceptions import JMESPathError
    from jmespath.functions import Functions, signature
except ImportError as error:
    jmespath = None
    JMESPATH_IMPORT_ERROR: ImportError | None = error

    class JMESPathError(ValueError):
        """Stands in for jmespath's error class, which nothing raises without jmespath."""

    class Functions:
        """Stands in for jmespath's function table, which nothing calls without jmespath."""

        FUNCTION_TABLE: dict = {}

    def signature(*_arguments):
        return lambda function: function

else:
    JMESPATH_IMPORT_ERROR = None

PROBE_KEYS = {"name", "tags", "checks", "guards", "request", "expect"}
# What a probe's pass proves (module docstring).
CHECKS = ("protocol", "model")
REQUEST_KEYS = {"method", "path", "body", "raw_body", "stream", "timeout", "concurrent", "repeat",
                "auth"}
CHAT_PATH = "/v1/chat/completions"
VALUE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
EXCERPT_CHARS = 400


class SuiteError(ValueError):
    """A suite that cannot be run; the message names the file and the probe."""


class ExpectationError(JMESPathError):
    """A function of the expectations that cannot judge with its arguments (a pattern that is
    not a regular expression, a schema that cannot be applied); the expectation fails."""


def _parse_json(text):
    """(whether text is one JSON value, that value)."""
    if not isinstance(text, str):
        return False, None
    try:
        return True, json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):
        return False, None


def _not_json(constant):
    raise ValueError(f"{constant} is not JSON")


def _regex(pattern: str, function: str):
    try:
        return re.compile(pattern)
    except re.error as error:
        raise ExpectationError(f"{function}: {pattern!r} is not a regular expression: "
                               f"{error}") from None


class ProbeFunctions(Functions):
    """jmespath's functions, and those judging an OpenAI-compatible server needs (module
    docstring): strict JSON parsing, JSON Schema validation, regular expressions."""

    @signature({"types": ["string", "null"]})
    def _func_from_json(self, text):
        return _parse_json(text)[1]

    @signature({"types": ["string", "null"]})
    def _func_json_valid(self, text):
        return _parse_json(text)[0]

    @signature({"types": []}, {"types": ["object", "boolean"]})
    def _func_schema_errors(self, value, schema):
        try:
            return schema_errors(value, schema)
        except SchemaError as error:
            raise ExpectationError(f"the schema cannot be applied: {error}") from None

    @signature({"types": []}, {"types": ["object", "boolean"]})
    def _func_schema_ok(self, value, schema):
        return not self._func_schema_errors(value, schema)

    @signature({"types": ["string"]}, {"types": ["string"]})
    def _func_regex_match(self, text, pattern):
        return _regex(pattern, "regex_match").search(text) is not None

    @signature({"types": ["string"]}, {"types": ["string"]})
    def _func_regex_fullmatch(self, text, pattern):
        return _regex(pattern, "regex_fullmatch").fullmatch(text) is not None


OWN_FUNCTIONS = ("from_json", "json_valid", "schema_errors", "schema_ok", "regex_match",
                 "regex_fullmatch")
PATTERN_FUNCTIONS = ("regex_match", "regex_fullmatch")


def _options():
    return jmespath.Options(custom_functions=ProbeFunctions())


@dataclass
class Probe:
    name: str
    source: str  # file the probe comes from
    guards: str
    request: dict
    expect: list[str]
    tags: list[str] = field(default_factory=list)
    checks: str = "protocol"


def suite_files(paths: list[str]) -> list[Path]:
    """The YAML files of the given files and folders (a folder's *.yml, sorted)."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.glob("*.yml")) + sorted(path.glob("*.yaml"))
        elif path.is_file():
            files.append(path)
        else:
            raise SuiteError(f"probe suite {path} does not exist")
    return files


def load_suites(paths: list[str]) -> list[Probe]:
    if jmespath is None:
        raise SuiteError(f"the probes' expectations need the jmespath Python package on the controller "
                         f"(requirements.txt): {JMESPATH_IMPORT_ERROR}")
    probes: list[Probe] = []
    seen: dict[str, str] = {}
    for path in suite_files(paths):
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise SuiteError(f"probe suite {path} is not YAML: {error}") from None
        if not isinstance(document, list):
            raise SuiteError(f"probe suite {path} must be a list of probes")
        for number, entry in enumerate(document, 1):
            probe = _probe(entry, f"{path} probe {number}", str(path))
            if probe.name in seen:
                raise SuiteError(f"{path}: probe {probe.name} is also defined in {seen[probe.name]}")
            seen[probe.name] = str(path)
            probes.append(probe)
    return probes


def most_choices(probes: list[Probe]) -> int:
    """The most choices (`n`) a probe's request asks for as a number: an engine whose max_num_seqs
    is below it answers that probe with a 400 and fails the functional gate by construction. (A
    probe that asks for more on purpose writes its `n` as a placeholder, such as
    ${n_above_max_num_seqs}, and expects that 400.)"""
    counts = [probe.request.get("body", {}).get("n") for probe in probes if isinstance(probe.request.get("body"), dict)]
    return max([count for count in counts if isinstance(count, int) and not isinstance(count, bool)] + [1])


def _probe(entry, where: str, source: str) -> Probe:
    if not isinstance(entry, dict):
        raise SuiteError(f"{where} is not a mapping")
    where = f"{source} probe {entry.get('name', where.rsplit(' ', 1)[-1])}"
    unknown = set(entry) - PROBE_KEYS
    if unknown:
        raise SuiteError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
    for key in ("name", "checks", "guards", "request", "expect"):
        if not entry.get(key):
            raise SuiteError(f"{where}: {key} is missing")
    if entry["checks"] not in CHECKS:
        raise SuiteError(f"{where}: checks is {entry['checks']!r}, not one of {', '.join(CHECKS)}")
    request, expect = entry["request"], entry["expect"]
    if not isinstance(request, dict) or not isinstance(request.get("path"), str):
        raise SuiteError(f"{where}: request must be a mapping with a path")
    unknown = set(request) - REQUEST_KEYS
    if unknown:
        raise SuiteError(f"{where}: unknown request keys {', '.join(sorted(unknown))}")
    if not isinstance(expect, list) or not all(isinstance(item, str) for item in expect):
        raise SuiteError(f"{where}: expect must be a list of jmespath expressions")
    for expression in expect:
        _compile(VALUE.sub("`0`", expression), where)  # the values come later
    return Probe(name=str(entry["name"]), source=source, guards=str(entry["guards"]),
                 request=request, expect=expect, tags=list(entry.get("tags") or []),
                 checks=entry["checks"])


def _compile(expression: str, where: str) -> None:
    try:
        parsed = jmespath.compile(expression).parsed
    except JMESPathError as error:
        raise SuiteError(f"{where}: expect {expression!r} is not jmespath: {error}") from None
    _check_calls(parsed, f"{where}: expect {expression!r}")


def _check_calls(node, where: str) -> None:
    """Every function called exists and gets its number of arguments, and every literal
    pattern compiles, so that a typo fails the suite before any request is sent."""
    if not isinstance(node, dict):
        return
    if node.get("type") == "function_expression":
        name, arguments = node["value"], node.get("children") or []
        spec = ProbeFunctions.FUNCTION_TABLE.get(name)
        if spec is None:
            raise SuiteError(f"{where} calls {name}(), which is neither one of jmespath's "
                             f"functions nor one of {', '.join(OWN_FUNCTIONS)}")
        expected = spec["signature"]
        variadic = bool(expected) and expected[-1].get("variadic")
        if len(arguments) < len(expected) or (not variadic and len(arguments) > len(expected)):
            raise SuiteError(f"{where} calls {name}() with {len(arguments)} arguments, "
                             f"{'at least ' if variadic else ''}{len(expected)} expected")
        if name in PATTERN_FUNCTIONS and arguments[1].get("type") == "literal" \
                and isinstance(arguments[1].get("value"), str):
            try:
                _regex(arguments[1]["value"], name)
            except ExpectationError as error:
                raise SuiteError(f"{where}: {error}") from None
    for child in node.get("children") or []:
        _check_calls(child, where)


def jmespath_literal(value) -> str:
    """A value as a jmespath JSON literal, so ${name} reads as that value in an expectation."""
    return "`%s`" % json.dumps(value).replace("`", "\\`")


def select(probes: list[Probe], tags: list[str], skip: list[str],
           skip_tags: list[str] = (), checks: list[str] = ()) -> list[Probe]:
    """The probes carrying one of tags (all when tags is empty) that check one of checks (all
    when empty), less those named in skip and those carrying one of skip_tags."""
    unknown = set(skip) - {probe.name for probe in probes}
    if unknown:
        raise SuiteError(f"probe_skip names no probe: {', '.join(sorted(unknown))}")
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise SuiteError(f"probe_checks: {', '.join(sorted(unknown))} is none of {', '.join(CHECKS)}")
    return [probe for probe in probes
            if (not tags or set(tags) & set(probe.tags)) and probe.name not in skip
            and not set(skip_tags) & set(probe.tags) and (not checks or probe.checks in checks)]


def render(value, values: dict, where: str):
    """The request with ${name} filled in from the engine's values."""
    if isinstance(value, dict):
        rendered = {key: render(item, values, where) for key, item in value.items()}
        if "$repeat" in value and (set(value) != {"$repeat", "times"}
                                   or not isinstance(rendered["times"], int)
                                   or rendered["times"] < 0):
            raise SuiteError(f"{where}: $repeat takes a text and a number of times")
        return rendered
    if isinstance(value, list):
        return [render(item, values, where) for item in value]
    if isinstance(value, str):
        whole = VALUE.fullmatch(value)
        if whole:
            return _value(whole.group(1), values, where)
        return VALUE.sub(lambda match: str(_value(match.group(1), values, where)), value)
    return value


def with_values(probe: Probe, values: dict) -> Probe:
    """The probe with its request and expectations filled in from the engine's values."""
    where = f"{probe.source} probe {probe.name}"
    request = render(probe.request, values, where)
    body = request.get("body")
    if request["path"] == CHAT_PATH and isinstance(body, dict) and "model" not in body:
        request["body"] = {"model": values["served_model_name"], **body}
    expect = [VALUE.sub(lambda match: jmespath_literal(_value(match.group(1), values, where)),
                        item) for item in probe.expect]
    for expression in expect:
        _compile(expression, where)
    return Probe(probe.name, probe.source, probe.guards, request, expect, probe.tags, probe.checks)


def _value(name: str, values: dict, where: str):
    if name not in values:
        raise SuiteError(f"{where}: ${{{name}}} is none of {', '.join(sorted(values))}")
    return values[name]


def module_request(probe: Probe) -> dict:
    """What engine_probe sends for a probe filled in by with_values."""
    return {"name": probe.name, **probe.request}


def truthy(value) -> bool:
    """jmespath's truth: false, null, and empty strings, lists and objects are false."""
    return value not in (False, None, "", [], {})


@dataclass
class Verdict:
    name: str
    guards: str
    passed: bool
    latency_ms: float | None
    failed_expectation: str | None = None
    excerpt: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def judge(probe: Probe, answer: dict) -> Verdict:
    """The first expectation the answer does not meet, with an excerpt of the answer."""
    data = dict(answer, request=probe.request)
    options = _options()
    for expression in probe.expect:
        try:
            met = truthy(jmespath.search(expression, data, options=options))
        except JMESPathError as error:  # a type error on this answer's shape, a bad schema
            met, expression = False, f"{expression} ({error})"
        if not met:
            return Verdict(probe.name, probe.guards, False, answer.get("latency_ms"),
                           expression, excerpt(answer))
    return Verdict(probe.name, probe.guards, True, answer.get("latency_ms"))


def excerpt(answer: dict) -> str:
    shown = {key: answer.get(key) for key in ("status", "error", "body", "text", "stream")
             if answer.get(key) is not None}
    if shown.get("stream"):
        shown["stream"] = {key: value for key, value in shown["stream"].items() if key != "events"}
    text = json.dumps(shown, ensure_ascii=False, default=str)
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"


def table(verdicts: list[Verdict]) -> list[str]:
    """One line per probe: mark, name, latency."""
    width = max((len(verdict.name) for verdict in verdicts), default=0)
    return [f"{'pass' if verdict.passed else 'FAIL'}  {verdict.name:<{width}}  "
            f"{_ms(verdict.latency_ms)}" for verdict in verdicts]


def _ms(latency):
    return "-" if latency is None else f"{latency:.0f} ms"


def write_results(path: str, document: dict) -> None:
    """The run's JSON artifact, written whole or not at all."""
    write_atomic(path, json.dumps(document, indent=1, ensure_ascii=False, default=str))
