"""The settings' mappings a deploy records: serving_mappings and the proposal's, checked and merged."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._mapping import (
    MappingError,
    declared_settings,
    mapping_problems,
    setting_mappings,
)

ALLOCATOR = {"settings": "engine_allocator", "source": "buddy_allocator.cu", "change": "PYTORCH_CUDA_ALLOC_CONF",
             "proven_by": ["two-long-prompts-at-once"]}


def test_a_declaration_names_its_settings_as_a_list_and_keeps_place_to_the_section():
    (mapping,) = setting_mappings([ALLOCATOR], "serving_mappings")

    assert mapping == {"settings": ["engine_allocator"], "source": "buddy_allocator.cu",
                       "change": "PYTORCH_CUDA_ALLOC_CONF", "proven_by": ["two-long-prompts-at-once"]}


@pytest.mark.parametrize("raw, message", [
    ({"settings": "engine_args.dtype"}, "serving_mappings must be a list of mappings, got dict"),
    ([{"settings": "engine_args.dtype"}], "serving_mappings[0]: source is required"),
    ([{"settings": "dtype", "source": "x"}], "serving_mappings[0]: 'dtype' is not a setting"),
    ([{"settings": [], "source": "x"}], "serving_mappings[0]: settings must name one setting or a list"),
    ([{"settings": "engine_args.dtype", "source": "x", "why": "y"}], "serving_mappings[0]: unknown keys why"),
    ([{"settings": "engine_args.dtype", "source": " "}], "serving_mappings[0]: source must be a non-empty text"),
    ([ALLOCATOR, {"settings": ["engine_args.dtype", "engine_allocator"], "source": "x"}],
     "serving_mappings[1]: engine_allocator is mapped by serving_mappings[0] already"),
])
def test_a_declaration_that_cannot_be_recorded_is_named_by_the_variable_and_its_position(raw, message):
    with pytest.raises(MappingError) as error:
        setting_mappings(raw, "serving_mappings")
    assert str(error.value).startswith(message)
    assert mapping_problems(raw) == [str(error.value)]


def test_the_proposals_declarations_come_first_so_that_they_win_for_a_setting_both_name():
    inventory = [{"settings": "engine_args.max_num_seqs", "source": "Sub168"}]
    proposal = [{"settings": "engine_args.max_num_seqs", "source": "tune.yml run 20261204T101500Z"}]

    declared = declared_settings(inventory, proposal)

    assert [mapping["source"] for mapping in declared] == ["tune.yml run 20261204T101500Z", "Sub168"]
    assert mapping_problems(inventory, proposal) == []
    assert mapping_problems(None, "no") == ["serving_tune_mappings must be a list of mappings, got str"]
