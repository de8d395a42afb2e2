"""Benchmark workloads: the shipped ones load, a bad one is refused naming its file and key,
and expansion gives the same request bodies for the same seed."""

from __future__ import annotations

import json
import textwrap

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import (
    BENCH_DIR,
    WorkloadError,
    count_tokens,
    expand,
    load_workload,
    shortened,
    workload_path,
)

GOOD = """
name: mine
requests: 10
warmup: 2
seed: 5
mix:
  - name: chat
    weight: 3
    prompt_tokens: {uniform: [100, 200]}
    output_tokens: {uniform: [10, 20]}
  - name: tools
    prompt_tokens: {fixed: 50}
    output_tokens: {fixed: 7}
    tools: true
    thinking: false
    temperature: 0.6
"""


def write(tmp_path, text, name="workload.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name", ["default", "competition"])
def test_the_shipped_workloads_load_and_expand(name):
    workload = load_workload(workload_path(name))
    bodies = expand(workload, "qwen3_5", concurrency=2)
    assert len(bodies) == workload.warmup + workload.requests
    assert all(body["ignore_eos"] is True and body["stream"] is True and body["temperature"] == 0
               and body["stream_options"] == {"include_usage": True} and body["model"] == "qwen3_5"
               for body in bodies)


def test_the_default_workload_is_the_labs_short_one_at_a_load_no_release_chooses():
    workload = load_workload(workload_path("default"))
    assert (workload.warmup, workload.requests, workload.concurrency, workload.stream) == (2, 24, 8, True)
    assert load_workload(workload_path("competition")).concurrency == 8
    bodies = expand(workload, "qwen3_5", concurrency=workload.concurrency)
    assert all(128 <= body["max_tokens"] <= 256 for body in bodies)
    assert all(960 <= count_tokens(body["messages"][0]["content"]) <= 1088 for body in bodies)


def test_expansion_is_deterministic_from_the_seed(tmp_path):
    workload = load_workload(write(tmp_path, GOOD))
    first = json.dumps(expand(workload, "m", 2))
    assert json.dumps(expand(load_workload(write(tmp_path, GOOD)), "m", 2)) == first
    workload.seed = 6
    assert json.dumps(expand(workload, "m", 2)) != first


def test_each_body_follows_its_kind(tmp_path):
    bodies = expand(load_workload(write(tmp_path, GOOD)), "qwen3_5", 2)
    assert len(bodies) == 12
    chat = [body for body in bodies if "tools" not in body]
    tools = [body for body in bodies if "tools" in body]
    assert chat and tools
    for body in chat:
        # A synthetic prompt has the drawn number of tokens as the stand-in counts them.
        assert 100 <= count_tokens(body["messages"][0]["content"]) <= 200
        assert 10 <= body["max_tokens"] <= 20 and body["temperature"] == 0.0
        assert "chat_template_kwargs" not in body
    for body in tools:
        assert count_tokens(body["messages"][0]["content"]) == 50 and body["max_tokens"] == 7
        assert body["tool_choice"] == "auto" and body["tools"][0]["function"]["name"] == "get_weather"
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["temperature"] == 0.6
    # The warm-up requests come first; no two prompts begin alike.
    assert bodies[0]["messages"][0]["content"].startswith("w0-") and bodies[2]["messages"][0]["content"].startswith("q2-")
    assert len({body["messages"][0]["content"][:40] for body in bodies}) == 12


def test_a_workload_without_streaming_asks_for_no_stream_options(tmp_path):
    bodies = expand(load_workload(write(tmp_path, GOOD + "stream: false\n")), "m", 1)
    assert all(body["stream"] is False and "stream_options" not in body for body in bodies)


def test_a_duration_bound_workload_gets_a_pool_of_distinct_requests(tmp_path):
    text = GOOD.replace("requests: 10", "duration_seconds: 30")
    assert len(expand(load_workload(write(tmp_path, text)), "m", 4)) == 2 + 32
    assert len(expand(load_workload(write(tmp_path, text)), "m", 40)) == 2 + 80


def test_a_dataset_gives_prompts_and_output_lengths(tmp_path):
    data = tmp_path / "set.jsonl"
    data.write_text('{"prompt": "first question", "output_tokens": 33}\n\n{"prompt": "second", "output_tokens": 44}\n')
    text = """
        name: data
        requests: 6
        mix:
          - prompt_tokens: {dataset: qa}
            output_tokens: {dataset: qa}
    """
    bodies = expand(load_workload(write(tmp_path, text), {"qa": str(data)}), "m", 1, {"qa": str(data)})
    pairs = {(body["messages"][0]["content"], body["max_tokens"]) for body in bodies}
    assert pairs <= {("first question", 33), ("second", 44)} and len(bodies) == 6


def test_a_relative_dataset_path_is_found_by_the_callers_rule(tmp_path):
    (tmp_path / "set.jsonl").write_text('{"prompt": "p"}\n')
    text = "name: d\nrequests: 1\nmix: [{prompt_tokens: {dataset: qa}, output_tokens: {fixed: 3}}]\n"
    workload = load_workload(write(tmp_path, text), {"qa": "set.jsonl"})
    bodies = expand(workload, "m", 1, {"qa": "set.jsonl"}, find=lambda path: str(tmp_path / path))
    assert bodies[0]["messages"][0]["content"] == "p" and bodies[0]["max_tokens"] == 3


@pytest.mark.parametrize("text, where", [
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}}]\nconcurency: 2\n",
     ": unknown keys concurency"),
    ("requests: 1\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}}]\n", ": name: a text is required"),
    ("name: x\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}}]\n",
     ": requests or duration_seconds: one is required"),
    ("name: x\nrequests: 0\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}}]\n",
     ": requests: must be at least 1, not 0"),
    ("name: x\nrequests: 1\nmix: []\n", ": mix: a non-empty list"),
    ("name: x\nrequests: 1\nstream: yes please\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}}]\n",
     ": stream: must be true or false"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 1}}]\n", ": mix[0].output_tokens: required"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 1, uniform: [1, 2]}, output_tokens: {fixed: 1}}]\n",
     ": mix[0].prompt_tokens: give exactly one of"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {uniform: [9, 2]}, output_tokens: {fixed: 1}}]\n",
     ": mix[0].prompt_tokens.uniform: must be [lo, hi]"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 0}}]\n",
     ": mix[0].output_tokens.fixed: must be a whole number of at least 1"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}, weight: 0}]\n",
     ": mix[0].weight: must be above 0"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}, colour: red}]\n",
     ": mix[0]: unknown keys colour"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {dataset: other}, output_tokens: {fixed: 1}}]\n",
     ": mix[0].prompt_tokens.dataset: 'other' is not among the datasets given (engine_bench's datasets option: qa)"),
    ("name: x\nrequests: 1\nmix: [{prompt_tokens: {fixed: 5}, output_tokens: {dataset: qa}}]\n",
     ": mix[0].output_tokens: {dataset: qa} takes the output length of the prompt's line"),
    ("name: x\nrequests: 1\nmix: [{name: a, prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}},"
     " {name: a, prompt_tokens: {fixed: 1}, output_tokens: {fixed: 1}}]\n", ": mix: the kind name 'a' is used twice"),
    ("- just\n- a list\n", ": a workload is a mapping"),
    ("name: [unclosed\n", ": not YAML"),
])
def test_a_bad_workload_is_refused_naming_the_file_and_the_key(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(WorkloadError) as refusal:
        load_workload(path, {"qa": "x.jsonl"})
    assert str(refusal.value).startswith(f"{path}: ") and where in str(refusal.value), str(refusal.value)


@pytest.mark.parametrize("lines, problem", [
    ('{"prompt": "a", "output_tokens": 3}\nnot json\n', "line 2: not JSON"),
    ('{"prompt": ""}\n', "line 1: prompt: a non-empty text is required"),
    ('{"prompt": "a", "output_tokens": 0}\n', "line 1: output_tokens: must be a whole number of at least 1"),
    ('{"prompt": "a"}\n', "line 1: output_tokens: required"),
    ("\n", ": no lines"),
])
def test_a_bad_dataset_is_refused_naming_the_file_and_the_line(tmp_path, lines, problem):
    data = tmp_path / "set.jsonl"
    data.write_text(lines)
    text = "name: d\nrequests: 1\nmix: [{prompt_tokens: {dataset: qa}, output_tokens: {dataset: qa}}]\n"
    workload = load_workload(write(tmp_path, text), {"qa": str(data)})
    with pytest.raises(WorkloadError) as refusal:
        expand(workload, "m", 1, {"qa": str(data)})
    assert str(refusal.value).startswith(f"dataset qa ({data})") and problem in str(refusal.value), str(refusal.value)


def test_a_workload_is_a_name_of_files_bench_or_a_path(tmp_path):
    assert workload_path("default") == BENCH_DIR / "default.yml"
    path = write(tmp_path, GOOD)
    assert workload_path(str(path)) == path
    assert workload_path("workload.yml", find=lambda given: str(tmp_path / given)) == path
    with pytest.raises(WorkloadError, match=r"'nosuch' is not one of files/bench \(competition, default\)"):
        workload_path("nosuch")
    with pytest.raises(WorkloadError, match="does not exist"):
        workload_path(str(tmp_path / "absent.yml"))


def test_a_shortened_workload_measures_its_fraction_with_the_same_warmup_seed_and_mix(tmp_path):
    workload = load_workload(write(tmp_path, GOOD))
    quarter = shortened(workload, 0.25)
    assert (quarter.requests, quarter.warmup, quarter.seed, quarter.mix) == (3, 2, 5, workload.mix)
    assert shortened(workload, 0.01).requests == 1
    assert shortened(workload, 1.0) is workload
    timed = load_workload(write(tmp_path, GOOD.replace("requests: 10", "duration_seconds: 40"), "timed.yml"))
    assert (shortened(timed, 0.5).duration_seconds, shortened(timed, 0.5).requests) == (20.0, None)
