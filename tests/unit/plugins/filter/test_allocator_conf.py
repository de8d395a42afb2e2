import pytest

from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS

from ansible_collections.biv100.serving.plugins.filter.allocator_conf import FilterModule
from ansible_collections.biv100.serving.plugins.plugin_utils._allocator_conf import (
    ALLOCATOR_OPTIONS,
    allocator_conf,
    allocator_conf_problems,
)


def refused(key):
    return f'PyTorch fails at start-up with "Unrecognized CachingAllocator option: {key}"'


# ---- rendering ----------------------------------------------------------------------------


def test_options_render_in_alphabetical_order_with_pytorch_booleans():
    options = {
        "max_split_size_mb": 512,
        "expandable_segments": True,
        "release_lock_on_cudamalloc": False,
    }
    assert allocator_conf(options) == (
        "expandable_segments:True,max_split_size_mb:512,release_lock_on_cudamalloc:False"
    )


def test_a_dict_of_roundup_intervals_renders_in_the_bracketed_form():
    options = {"roundup_power2_divisions": {256: 1, 512: 2, ">": 8}}
    assert allocator_conf(options) == "roundup_power2_divisions:[256:1,512:2,>:8]"


def test_the_default_is_the_conservative_pair_and_valid_on_an_old_torch():
    assert allocator_conf(DEFAULT_ALLOCATOR_OPTIONS) == (
        "garbage_collection_threshold:0.8,max_split_size_mb:512"
    )
    assert allocator_conf_problems(DEFAULT_ALLOCATOR_OPTIONS, torch_version="1.13.1") == []


# ---- problems -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conf",
    [
        "max_split_size_mb:21",
        "garbage_collection_threshold:0.6",
        "expandable_segments:False",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[256:1,512:2,>:8]",
        "roundup_power2_divisions:[256:1, 512:2, >:8],max_split_size_mb:128",
        "backend:cudaMallocAsync",
        "backend:native",
        "max_non_split_rounding_mb:64",
        "release_lock_on_cudamalloc:True",
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:128",
        "pinned_use_background_threads:False",
        "",
    ],
)
def test_values_pytorch_accepts(conf):
    assert allocator_conf_problems(conf) == []


FRACTION = "it must be a number between 0 and 1, both excluded"


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("max_split_size_mb", "20", "it must be a whole number of MB above 20"),
        ("max_split_size_mb", "512MB", "it must be a whole number of MB above 20"),
        ("garbage_collection_threshold", "1", FRACTION),
        ("garbage_collection_threshold", "0", FRACTION),
        ("garbage_collection_threshold", "high", FRACTION),
        ("expandable_segments", "true", "it must be True or False, in exactly that case"),
        ("release_lock_on_cudamalloc", "1", "it must be True or False, in exactly that case"),
        ("pinned_use_cuda_host_register", "yes", "it must be True or False, in exactly that case"),
        ("pinned_use_background_threads", "TRUE", "it must be True or False, in exactly that case"),
        ("backend", "cuda", "it must be native or cudaMallocAsync"),
        ("max_non_split_rounding_mb", "-1", "it must be a whole number of MB"),
        ("pinned_num_register_threads", "256", "it must be a power of 2 no larger than 128"),
        ("pinned_num_register_threads", "3", "it must be a power of 2 no larger than 128"),
    ],
)
def test_values_pytorch_refuses_are_named_with_the_reason(key, value, reason):
    assert allocator_conf_problems(f"{key}:{value}") == [
        f"PYTORCH_CUDA_ALLOC_CONF: {key} is {value}: {reason}"
    ]


@pytest.mark.parametrize(
    "value", ["3", "0", "[256:3,>:8]", "[255:1]", "[256:1,512:2", "[256:1,>]"]
)
def test_roundup_divisions_outside_powers_of_two_or_the_interval_form(value):
    (problem,) = allocator_conf_problems(f"roundup_power2_divisions:{value}")
    assert problem.startswith(f"PYTORCH_CUDA_ALLOC_CONF: roundup_power2_divisions is {value}: ")


def test_an_unknown_key_says_how_pytorch_fails():
    assert allocator_conf_problems("max_split_size_mb:512,expandable_segment:True") == [
        f"PYTORCH_CUDA_ALLOC_CONF: expandable_segment is not an allocator option: "
        f"{refused('expandable_segment')}"
    ]


def test_a_key_without_a_value():
    assert allocator_conf_problems("expandable_segments") == [
        "PYTORCH_CUDA_ALLOC_CONF: expandable_segments has no value: "
        "the form is expandable_segments:<value>"
    ]


def test_a_key_newer_than_the_hosts_torch():
    assert allocator_conf_problems("expandable_segments:True", torch_version="2.0.1+corex.3.2") == [
        "PYTORCH_CUDA_ALLOC_CONF: expandable_segments needs torch 2.1 or later and the host has "
        f"2.0.1+corex.3.2: {refused('expandable_segments')}"
    ]
    assert allocator_conf_problems("expandable_segments:True", torch_version="2.1.0") == []


@pytest.mark.parametrize("key", sorted(ALLOCATOR_OPTIONS))
def test_every_key_is_refused_by_the_torch_before_its_own(key):
    major, minor = ALLOCATOR_OPTIONS[key].since
    older = f"{major - 1}.99" if minor == 0 else f"{major}.{minor - 1}"
    (problem,) = allocator_conf_problems(f"{key}:True", torch_version=older)
    assert f"{key} needs torch {major}.{minor} or later" in problem


def test_a_torch_version_that_is_not_one():
    assert allocator_conf_problems("max_split_size_mb:512", torch_version="corex") == [
        "torch version 'corex' does not start with major.minor"
    ]


def test_a_dict_is_checked_as_it_would_be_rendered():
    assert allocator_conf_problems({"expandable_segments": "true", "max_split_size_mb": 512}) == [
        "PYTORCH_CUDA_ALLOC_CONF: expandable_segments is true: "
        "it must be True or False, in exactly that case"
    ]


def test_every_problem_is_reported_at_once():
    conf = "max_split_size_mb:8,roundup_power2_divisions:[256:1,512:3,>:8],bogus:1,backend:x"
    assert len(allocator_conf_problems(conf)) == 4


def test_the_filter_is_exported_under_its_name():
    assert FilterModule().filters() == {"allocator_conf": allocator_conf}
