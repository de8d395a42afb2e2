"""Tuning spaces: the shipped one loads and searches around Sub168, a bad one is refused naming its
file and key, ranges are exact, candidates are the incumbent first then the grid with stable
ids, and the deploy's checks sort out the invalid ones."""

from __future__ import annotations

import hashlib
import json
import textwrap

import pytest
import yaml
from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS, SUB168

from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import (
    TUNE_DIR,
    TuneSpaceError,
    candidate_problems,
    candidates,
    largest_candidate,
    load_space,
    make_candidate,
    screen_candidates,
    settings_id,
    space_path,
)

INCUMBENT = {"engine_args": dict(SUB168), "engine_allocator": dict(DEFAULT_ALLOCATOR_OPTIONS), "engine_env": {}}

SPACE = """
name: mine
engine_args:
  max_num_seqs: [2, 4]
  gpu_memory_utilization: {range: [0.85, 0.95], step: 0.05}
engine_allocator:
  expandable_segments: [null, true]
budget: {max_candidates: 8, max_minutes: 10}
"""


def write(tmp_path, text, name="space.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_the_shipped_space_searches_sub168s_parameters_and_an_allocator_option():
    space = load_space("default")
    assert space["name"] == "default" and space["file"] == str(TUNE_DIR / "default.yml")
    # Sub168's own values are among those searched, so the host's setting is a point of the grid.
    assert SUB168["max_num_seqs"] in space["engine_args"]["max_num_seqs"]
    assert SUB168["max_num_batched_tokens"] in space["engine_args"]["max_num_batched_tokens"]
    assert space["engine_allocator"] == {"expandable_segments": [None, True]}
    # gpu_memory_utilization is the memory step-down's, from Sub168's value.
    assert space["memory"]["start"] == SUB168["gpu_memory_utilization"]
    assert space["budget"] == {"max_candidates": 25, "max_minutes": 30, "min_factor": 0.25}


def test_the_shipped_space_fits_its_budget_as_a_grid_whatever_the_memory_step_down_chooses():
    space = load_space("default")
    for ceiling in (None, 0.95, 0.9, 0.8):
        listed = candidates(space, INCUMBENT, ceiling)
        assert len(listed) <= space["budget"]["max_candidates"]
        assert len(listed) == (24 if ceiling in (None, 0.95) else 25)  # Sub168 is one of the 24 at 0.95


def test_a_name_is_found_under_files_tune_and_a_path_as_given(tmp_path):
    assert space_path("default") == TUNE_DIR / "default.yml"
    path = write(tmp_path, SPACE)
    assert load_space(str(path))["name"] == "mine"
    assert space_path("space.yml", find=lambda name: tmp_path / name) == path
    with pytest.raises(TuneSpaceError, match=r"'nosuch' is not one of files/tune \(default\) nor a path"):
        space_path("nosuch")
    with pytest.raises(TuneSpaceError, match=r"tune space file .*/missing.yml does not exist"):
        load_space(str(tmp_path / "missing.yml"))


def test_ranges_are_counted_in_decimal(tmp_path):
    # Float steps would give 0.9500000000000001, 0.30000000000000004 and miss the high end.
    text = """
        name: r
        engine_args:
          gpu_memory_utilization: {range: [0.85, 0.95], step: 0.05}
          swap_space: {range: [0.1, 0.3], step: 0.1}
          max_num_seqs: {range: [2, 9], step: 3}
          cpu_offload_gb: {range: [1, 2], step: 0.25}
        budget: {max_candidates: 2, max_minutes: 1}
    """
    loaded = load_space(str(write(tmp_path, text)))
    assert loaded["engine_args"] == {"gpu_memory_utilization": [0.85, 0.9, 0.95],
                                     "swap_space": [0.1, 0.2, 0.3],
                                     "max_num_seqs": [2, 5, 8],
                                     "cpu_offload_gb": [1.0, 1.25, 1.5, 1.75, 2.0]}
    assert [type(value) for value in loaded["engine_args"]["max_num_seqs"]] == [int, int, int]
    assert [repr(value) for value in loaded["engine_args"]["gpu_memory_utilization"]] == ["0.85", "0.9", "0.95"]


@pytest.mark.parametrize("change, error", [
    ("surprise: 1", r"space.yml: unknown keys surprise \(known: budget, description, "),
    ("name: ''", r"space.yml: name: a text is required"),
    ("engine_args: [1]", r"space.yml: engine_args: a mapping of keys to their values is required"),
    ("engine_args: {max_num_seqs: 4}", r"space.yml: engine_args.max_num_seqs: give a list of values or "
                                       r"\{range: \[lo, hi\], step: s\}, not 4"),
    ("engine_args: {max_num_seqs: []}", r"space.yml: engine_args.max_num_seqs: an empty list gives nothing"),
    ("engine_args: {max_num_seqs: [2, 4, 2]}", r"space.yml: engine_args.max_num_seqs: 2 is listed twice"),
    ("engine_args: {swap_space: [4, 4.0]}", r"space.yml: engine_args.swap_space: 4.0 is listed twice"),
    ("engine_args: {max_num_seqs: [[2]]}", r"space.yml: engine_args.max_num_seqs: \[2\] is not a value"),
    ("engine_args: {max_num_seqs: {range: [8, 2], step: 2}}",
     r"space.yml: engine_args.max_num_seqs.range: lo 8 is above hi 2"),
    ("engine_args: {max_num_seqs: {range: [2, 8], step: 0}}",
     r"space.yml: engine_args.max_num_seqs.step: must be a number above 0, not 0"),
    ("engine_args: {max_num_seqs: {range: [2, 8]}}",
     r"space.yml: engine_args.max_num_seqs: a range is \{range: \[lo, hi\], step: s\}"),
    ("engine_args: {max_num_seqs: {range: [a, 8], step: 1}}",
     r"space.yml: engine_args.max_num_seqs.range: must be \[lo, hi\], two numbers"),
    ("engine_args: {max_num_seqs: {range: [1, 100000], step: 1}}",
     r"space.yml: engine_args.max_num_seqs: the range gives 100000 values; at most 1000"),
    ("engine_args: {port: [8000, 8001]}", r"space.yml: engine_args.port: the engine role sets it"),
    ("engine_args: {api_key: [secret]}", r"space.yml: engine_args.api_key: the engine role sets it"),
    ("engine_env: {PYTORCH_CUDA_ALLOC_CONF: ['expandable_segments:True']}",
     r"space.yml: engine_env.PYTORCH_CUDA_ALLOC_CONF: the engine role writes it from other settings"),
    ("engine_env: {VLLM_API_KEY: [x]}", r"space.yml: engine_env.VLLM_API_KEY: the engine role writes it"),
    ("engine_env: {'1BAD': ['x']}", r"space.yml: engine_env.1BAD: not an environment variable's name"),
    ("budget: null", r"space.yml: budget: required"),
    ("budget: {max_candidates: 1, max_minutes: 5}",
     r"space.yml: budget.max_candidates: must be a whole number of at least 2 \(the incumbent and one other\)"),
    ("budget: {max_candidates: 4}", r"space.yml: budget.max_minutes: must be a number above 0, not None"),
    ("budget: {max_candidates: 4, max_minutes: 5, min_factor: 0}",
     r"space.yml: budget.min_factor: must be a number above 0 and at most 1, not 0"),
    ("budget: {max_candidates: 4, max_minutes: 5, hours: 1}", r"space.yml: budget: unknown keys hours"),
    ("memory: {step: 0.05}", r"space.yml: memory.floor: must be a fraction above 0 and at most 1, not None"),
    ("memory: {step: 0.05, floor: 0.9, start: 0.8}", r"space.yml: memory.start: 0.8 is below memory.floor 0.9"),
    ("memory: {step: 0.05, floor: 0.8, down: 1}", r"space.yml: memory: unknown keys down"),
])
def test_a_bad_space_is_refused_naming_its_file_and_key(tmp_path, change, error):
    # The change replaces one top-level key of SPACE.
    document = {**yaml.safe_load(SPACE), **yaml.safe_load(change)}
    path = write(tmp_path, yaml.safe_dump(document))
    with pytest.raises(TuneSpaceError, match=error) as refused:
        load_space(str(path))
    assert str(refused.value).startswith(str(path) + ": ")


def test_a_space_that_searches_nothing_or_too_much_is_refused(tmp_path):
    with pytest.raises(TuneSpaceError, match=r"space.yml: nothing to search"):
        load_space(str(write(tmp_path, "name: x\nbudget: {max_candidates: 2, max_minutes: 1}\n")))
    wide = "name: x\nbudget: {max_candidates: 2, max_minutes: 1}\nengine_env:\n" + "".join(
        f"  V{number}: {{range: [1, 10], step: 1}}\n" for number in range(5))
    with pytest.raises(TuneSpaceError, match=r"space.yml: the space holds 100000 candidates; at most 10000"):
        load_space(str(write(tmp_path, wide)))


def test_a_file_that_is_not_a_space_is_refused(tmp_path):
    with pytest.raises(TuneSpaceError, match=r"space.yml: a tune space is a mapping"):
        load_space(str(write(tmp_path, "- 1\n")))
    with pytest.raises(TuneSpaceError, match=r"space.yml: not YAML"):
        load_space(str(write(tmp_path, "name: [\n")))


def test_the_incumbent_comes_first_then_the_grid_in_the_spaces_order(tmp_path):
    space = load_space(str(write(tmp_path, SPACE)))
    listed = candidates(space, INCUMBENT)
    assert listed[0]["incumbent"] is True and listed[0]["engine_args"] == SUB168
    assert [candidate["incumbent"] for candidate in listed[1:]] == [False] * (len(listed) - 1)
    points = [(candidate["engine_args"]["max_num_seqs"], candidate["engine_args"]["gpu_memory_utilization"],
               candidate["engine_allocator"].get("expandable_segments")) for candidate in listed[1:]]
    # Sub168 (2, 0.95, unset) is the incumbent: left out of the grid, the rest in order, last key fastest.
    assert points == [(2, 0.85, None), (2, 0.85, True), (2, 0.9, None), (2, 0.9, True), (2, 0.95, True),
                      (4, 0.85, None), (4, 0.85, True), (4, 0.9, None), (4, 0.9, True), (4, 0.95, None),
                      (4, 0.95, True)]
    # Everything not searched is the incumbent's.
    for candidate in listed:
        assert {key: value for key, value in candidate["engine_args"].items()
                if key not in ("max_num_seqs", "gpu_memory_utilization")} == {
            key: value for key, value in SUB168.items() if key not in ("max_num_seqs", "gpu_memory_utilization")}
        assert {key: value for key, value in candidate["engine_allocator"].items()
                if key != "expandable_segments"} == DEFAULT_ALLOCATOR_OPTIONS
    assert candidates(space, INCUMBENT) == listed


def test_ids_are_digests_of_the_settings_alone():
    candidate = make_candidate(INCUMBENT, incumbent=True)
    canonical = json.dumps({"engine_args": SUB168, "engine_allocator": DEFAULT_ALLOCATOR_OPTIONS, "engine_env": {}},
                           sort_keys=True, separators=(",", ":"))
    assert candidate["id"] == "c" + hashlib.sha256(canonical.encode()).hexdigest()[:10]
    # Pinned (sha256 of {"engine_allocator":{},"engine_args":{"max_num_seqs":4},"engine_env":{}}): a run
    # resumed with a later checkout finds the ids it wrote.
    assert settings_id({"engine_args": {"max_num_seqs": 4}, "engine_allocator": {}, "engine_env": {}}) == "c68d0cef7d5"
    # Neither the order of the keys nor being the incumbent changes it; a null is an unset key.
    shuffled = {"engine_env": {}, "engine_allocator": dict(reversed(list(DEFAULT_ALLOCATOR_OPTIONS.items()))),
                "engine_args": dict(reversed(list(SUB168.items())))}
    assert make_candidate(shuffled)["id"] == candidate["id"]
    assert make_candidate({**INCUMBENT, "engine_env": {"X": None}})["id"] == candidate["id"]
    assert make_candidate({**INCUMBENT, "engine_env": {"X": "1"}})["id"] != candidate["id"]


def test_a_null_value_unsets_the_key(tmp_path):
    text = SPACE.replace("expandable_segments: [null, true]", "max_split_size_mb: [null]")
    listed = candidates(load_space(str(write(tmp_path, text))), INCUMBENT)
    assert all("max_split_size_mb" not in candidate["engine_allocator"] for candidate in listed[1:])
    assert listed[0]["engine_allocator"] == DEFAULT_ALLOCATOR_OPTIONS


def test_the_memory_step_downs_choice_caps_gpu_memory_utilization(tmp_path):
    space = load_space(str(write(tmp_path, SPACE)))
    utilizations = {candidate["engine_args"]["gpu_memory_utilization"] for candidate in candidates(space, INCUMBENT, 0.9)[1:]}
    assert utilizations == {0.85, 0.9}
    # None of the space's values fits under it: the choice itself.
    assert {candidate["engine_args"]["gpu_memory_utilization"]
            for candidate in candidates(space, INCUMBENT, 0.8)[1:]} == {0.8}
    # A space that does not search it runs every candidate at the choice; the incumbent keeps its own.
    bare = load_space(str(write(tmp_path, SPACE.replace(
        "  gpu_memory_utilization: {range: [0.85, 0.95], step: 0.05}\n", ""))))
    listed = candidates(bare, INCUMBENT, 0.9)
    assert listed[0]["engine_args"]["gpu_memory_utilization"] == 0.95
    assert {candidate["engine_args"]["gpu_memory_utilization"] for candidate in listed[1:]} == {0.9}


def test_the_largest_candidate_takes_the_spaces_largest_sizes(tmp_path):
    text = SPACE.replace("max_num_seqs: [2, 4]", "max_num_seqs: [8, null, 2]\n  max_num_batched_tokens: [2048, 8192]")
    largest = largest_candidate(load_space(str(write(tmp_path, text))), INCUMBENT, 0.9)
    assert largest["engine_args"] == {**SUB168, "max_num_seqs": 8, "max_num_batched_tokens": 8192,
                                      "gpu_memory_utilization": 0.9}
    # With the expandable segments the space tries, which leave the start's peak unfragmented.
    assert largest["engine_allocator"] == {**DEFAULT_ALLOCATOR_OPTIONS, "expandable_segments": True}
    assert largest["incumbent"] is False
    untried = text.replace("engine_allocator:\n  expandable_segments: [null, true]\n", "")
    assert untried != text
    largest = largest_candidate(load_space(str(write(tmp_path, untried, "untried.yml"))), INCUMBENT, 0.9)
    assert largest["engine_allocator"] == DEFAULT_ALLOCATOR_OPTIONS


def test_the_incumbent_must_be_mappings():
    with pytest.raises(TuneSpaceError, match=r"the incumbent's engine_env is list: a mapping"):
        candidates({"engine_args": {}, "engine_allocator": {}, "engine_env": {}}, {**INCUMBENT, "engine_env": ["X"]})


def test_the_deploys_checks_judge_each_candidate():
    assert not candidate_problems(make_candidate(INCUMBENT))
    unknown = make_candidate({**INCUMBENT, "engine_args": {**SUB168, "max_num_seqz": 4}})
    assert candidate_problems(unknown) == [
        "engine_args.max_num_seqz is not an argument of vLLM 0.10.1.1's OpenAI server (did you mean max_num_seqs?)"]
    # The host's own CLI decides which names exist.
    flags = ["--" + name.replace("_", "-") for name in SUB168]
    assert not candidate_problems(make_candidate(INCUMBENT), known_flags=flags)
    assert candidate_problems(make_candidate({**INCUMBENT, "engine_args": {**SUB168, "swap_space": 4}}),
                              known_flags=flags) == ["engine_args.swap_space is not an argument of the host's vLLM "
                                                     "OpenAI server"]
    unchunked = make_candidate({**INCUMBENT, "engine_args": {**SUB168, "enable_chunked_prefill": False}})
    assert "set engine_args.enable_chunked_prefill to true" in candidate_problems(unchunked)[0]
    assert candidate_problems(make_candidate(INCUMBENT), gpus_free=2) == [
        "engine_args.tensor_parallel_size is 4 but the host has 2 free GPUs"]
    expandable = make_candidate({**INCUMBENT, "engine_allocator": {"expandable_segments": True}})
    assert not candidate_problems(expandable, torch_version="2.1.0")
    assert candidate_problems(expandable, torch_version="2.0.1") == [
        'PYTORCH_CUDA_ALLOC_CONF: expandable_segments needs torch 2.1 or later and the host has 2.0.1: PyTorch '
        'fails at start-up with "Unrecognized CachingAllocator option: expandable_segments"']


def test_screening_keeps_the_order_and_names_each_invalid_candidates_problems(tmp_path):
    listed = candidates(load_space(str(write(tmp_path, SPACE))), INCUMBENT)
    valid, invalid = screen_candidates(listed, torch_version="2.0.1")
    assert valid == [candidate for candidate in listed if "expandable_segments" not in candidate["engine_allocator"]]
    assert [candidate["id"] for candidate in invalid] == [
        candidate["id"] for candidate in listed if "expandable_segments" in candidate["engine_allocator"]]
    assert all(candidate["problems"][0].startswith("PYTORCH_CUDA_ALLOC_CONF: expandable_segments needs torch 2.1")
               for candidate in invalid)


def test_a_winner_on_the_edge_of_the_space_is_said_with_the_values_beyond_it():
    from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import edge_notes

    space = {"engine_args": {"max_num_seqs": [1, 2, 4, 8], "max_num_batched_tokens": [2048, 3072, 4096],
                             "gpu_memory_utilization": [0.9, 0.95], "dtype": ["half"]}}
    incumbent = {"engine_args": {"max_num_seqs": 2, "max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.9}}
    largest = {"engine_args": {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.95}}
    assert edge_notes(space, largest, incumbent) == [
        "max_num_seqs 8 is the largest value the space tries: try 16, 32 next",
        "max_num_batched_tokens 2048 is the smallest value the space tries: try 1024 next"]
    # The smallest of a doubling that starts at 1 has nothing beyond; an inside value, nothing to say.
    assert edge_notes(space, {"engine_args": {"max_num_seqs": 1}}, incumbent) == []
    assert edge_notes(space, {"engine_args": {"max_num_seqs": 4, "max_num_batched_tokens": 3072}}, incumbent) == []
