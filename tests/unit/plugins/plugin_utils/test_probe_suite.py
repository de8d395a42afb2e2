"""Probe suites: what a bad suite is refused for, how values fill a probe, how answers are judged."""

from __future__ import annotations

import textwrap

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils import _probe_suite
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import (
    SuiteError,
    judge,
    load_suites,
    module_request,
    select,
    table,
    with_values,
)

VALUES = {"served_model_name": "qwen3_5", "max_model_len": 256000, "long_prompt_words": 12288}
PROBE = """
- name: chat
  tags: [chat]
  guards: no answer
  request:
    method: POST
    path: /v1/chat/completions
    body:
      messages: [{role: user, content: {$repeat: "hi ", times: "${long_prompt_words}"}}]
      max_tokens: "${max_model_len}"
      metadata: "len ${max_model_len}"
  expect:
    - status == `200`
    - body.model == ${served_model_name}
"""


def suite(tmp_path, text, name="suite.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_values_fill_requests_with_their_types_and_expectations_as_literals(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    filled = with_values(probe, VALUES)
    request = module_request(filled)

    assert request["body"]["model"] == "qwen3_5"  # a chat body without model asks for the served one
    assert request["body"]["max_tokens"] == 256000 and request["body"]["metadata"] == "len 256000"
    # $repeat stays for the host to expand: long prompts never travel.
    assert request["body"]["messages"][0]["content"] == {"$repeat": "hi ", "times": 12288}
    assert filled.expect[1] == 'body.model == `"qwen3_5"`'


def test_judging_names_the_first_unmet_expectation_with_an_excerpt(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    filled = with_values(probe, VALUES)

    good = judge(filled, {"status": 200, "body": {"model": "qwen3_5"}, "latency_ms": 5.0})
    bad = judge(filled, {"status": 200, "body": {"model": "other"}, "latency_ms": 7.0})

    assert good.passed and good.failed_expectation is None
    assert not bad.passed and bad.failed_expectation == 'body.model == `"qwen3_5"`'
    assert '"other"' in bad.excerpt
    assert table([good, bad]) == ["pass  chat  5 ms", "FAIL  chat  7 ms"]


def test_an_expectation_on_a_missing_part_of_the_answer_fails(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    verdict = judge(with_values(probe, VALUES), {"status": None, "error": "connection refused"})
    assert not verdict.passed and "connection refused" in verdict.excerpt


@pytest.mark.parametrize("text, message", [
    ("- {name: a, guards: g, request: {path: /health}}\n", "expect is missing"),
    ("- {name: a, guards: g, request: {path: /health}, expect: ['status ==']}\n", "is not jmespath"),
    ("- {name: a, guards: g, request: {path: /health, verb: GET}, expect: [status]}\n",
     "unknown request keys verb"),
    ("- {name: a, guards: g, colour: red, request: {path: /health}, expect: [status]}\n",
     "unknown keys colour"),
    ("name: a\n", "must be a list of probes"),
    ("- [a\n", "is not YAML"),
])
def test_a_bad_suite_is_refused_naming_its_file_and_probe(tmp_path, text, message):
    path = suite(tmp_path, text)
    with pytest.raises(SuiteError, match=message) as refused:
        load_suites([path])
    assert path in str(refused.value)


def test_a_probe_name_is_unique_across_suites(tmp_path):
    first = suite(tmp_path, "- {name: a, guards: g, request: {path: /health}, expect: [status]}\n")
    second = suite(tmp_path, "- {name: a, guards: g, request: {path: /x}, expect: [status]}\n",
                   "more.yml")
    with pytest.raises(SuiteError, match="probe a is also defined in"):
        load_suites([first, second])


def test_without_jmespath_loading_a_suite_names_the_missing_package(tmp_path, monkeypatch):
    # As the import sanity test loads the plugins: ansible-core alone, no jmespath.
    monkeypatch.setattr(_probe_suite, "jmespath", None)
    monkeypatch.setattr(_probe_suite, "JMESPATH_IMPORT_ERROR", ImportError("No module named 'jmespath'"))
    with pytest.raises(SuiteError, match=r"need the jmespath Python package on the controller"):
        load_suites([suite(tmp_path, PROBE)])


def test_an_unknown_value_and_a_missing_suite_are_refused(tmp_path):
    (probe,) = load_suites([suite(tmp_path, PROBE)])
    with pytest.raises(SuiteError, match=r"\$\{long_prompt_words\} is none of"):
        with_values(probe, {"served_model_name": "q", "max_model_len": 1})
    with pytest.raises(SuiteError, match="does not exist"):
        load_suites([str(tmp_path / "nowhere.yml")])


def test_folders_tags_and_skips_select_probes(tmp_path):
    folder = tmp_path / "suites"
    folder.mkdir()
    suite(folder, "- {name: a, tags: [x], guards: g, request: {path: /a}, expect: [status]}\n", "1.yml")
    suite(folder, "- {name: b, tags: [y], guards: g, request: {path: /b}, expect: [status]}\n", "2.yml")
    probes = load_suites([str(folder)])

    assert [probe.name for probe in select(probes, [], [])] == ["a", "b"]
    assert [probe.name for probe in select(probes, ["y"], [])] == ["b"]
    assert [probe.name for probe in select(probes, [], ["a"])] == ["b"]
    with pytest.raises(SuiteError, match="probe_skip names no probe: c"):
        select(probes, [], ["c"])
