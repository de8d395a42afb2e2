"""The shipped examples of the mapping record are the product brief's: its four rows and its six
fixed failure points, each proven by checks that exist."""

from __future__ import annotations

from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._mapping import GUARD, declared_settings
from ansible_collections.biv100.serving.plugins.plugin_utils._payload import read_manifest

ROOT = Path(__file__).resolve().parents[2]
PROBES = {probe["name"] for probe in yaml.safe_load((ROOT / "files/probes/default.yml").read_text(encoding="utf-8"))}
SUB168 = yaml.safe_load((ROOT / "roles/engine/defaults/main.yml").read_text(encoding="utf-8"))["engine_args"]
MANIFEST = read_manifest(ROOT / "files/serving")


def group_vars(inventory: str) -> dict:
    return yaml.safe_load((ROOT / "inventory" / inventory / "group_vars/biv100.yml").read_text(encoding="utf-8"))


FLEET = declared_settings(group_vars("biv100")["serving_mappings"])


def brief_row(mappings, source):
    return next((mapping["place"], mapping["change"]) for mapping in mappings if mapping["source"] == source)


def test_the_fleets_inventory_maps_the_allocator_every_sub168_parameter_and_dtype_as_the_brief_does():
    assert brief_row(FLEET, "buddy_allocator.cu") == ("computility-run.yaml env", "PYTORCH_CUDA_ALLOC_CONF")
    assert brief_row(FLEET, "device_reduce policy_selector") == (
        "computility-run.yaml params", "launch parameters aligned with Sub168")
    assert brief_row(FLEET, "tuning_find_bound_sorted_values") == ("yaml --dtype half", "type-size adaptation")
    covered = {name for mapping in FLEET for name in mapping["settings"]}
    assert {f"engine_args.{name}" for name in SUB168} <= covered
    assert "engine_allocator" in covered


def test_the_fast_path_row_is_planned_until_an_entry_carries_it():
    built = [entry.mapping.get("change") for entry in MANIFEST.entries]
    planned = [(row["source"], row["place"], row["change"]) for row in MANIFEST.planned]
    assert ("agent_reduce_by_key ConsumeTile", "serving_chat.py", "fast path / safe path split") in planned
    assert "fast path / safe path split" not in built


def test_the_brief_six_failure_points_are_declared_each_fixed_by_something_real_and_proven():
    points = {point["name"]: point for point in MANIFEST.failure_points}
    assert set(points) == {"n-above-max-num-seqs", "max-completion-tokens", "tool-result-after-null-content",
                           "thinking-uses-up-tool-budget", "two-long-prompts-at-once", "model-layer-untouched"}
    entries = {entry.name for entry in MANIFEST.entries}
    assert points["n-above-max-num-seqs"]["fixed_by"] in entries
    assert points["thinking-uses-up-tool-budget"]["fixed_by"] in entries
    assert points["model-layer-untouched"]["proven_by"] == [GUARD]


def test_every_check_a_shipped_mapping_or_failure_point_names_is_a_probe_of_the_suite_or_the_guard():
    lab = declared_settings(group_vars("lab")["serving_mappings"])
    named = {name for point in MANIFEST.failure_points for name in point["proven_by"]}
    named |= {name for entry in MANIFEST.entries for name in entry.mapping.get("proven_by", [])}
    named |= {name for mapping in FLEET + lab for name in mapping["proven_by"]}
    assert named - PROBES <= {GUARD}


def test_the_lab_declares_the_fleets_mappings_so_that_its_ledger_draws_the_same_table():
    lab = declared_settings(group_vars("lab")["serving_mappings"])
    assert all(mapping in lab for mapping in FLEET)
