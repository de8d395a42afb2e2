"""The engine role's YAML defaults and the filters' constants are one parameter set, twice
written (role defaults cannot import Python): they must not drift apart."""

from pathlib import Path

import yaml

from ansible_collections.biv100.serving.plugins.filter.allocator_conf import DEFAULT_ALLOCATOR_OPTIONS
from ansible_collections.biv100.serving.plugins.filter.engine_cli_args import SUB168

REPO = Path(__file__).resolve().parents[3]


def test_the_engine_role_defaults_are_sub168_and_the_default_allocator():
    defaults = yaml.safe_load((REPO / "roles" / "engine" / "defaults" / "main.yml").read_text())
    assert defaults["engine_args"] == SUB168
    assert defaults["engine_allocator"] == DEFAULT_ALLOCATOR_OPTIONS


def test_the_production_inventory_carries_sub168_and_derives_preflight_from_it():
    group_vars = yaml.safe_load((REPO / "inventory" / "biv100" / "group_vars" / "biv100.yml").read_text())
    assert group_vars["engine_args"] == SUB168
    assert group_vars["preflight_tensor_parallel_size"] == "{{ engine_args.tensor_parallel_size }}"
