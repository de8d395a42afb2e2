"""Sub168 and the allocator options are defined once, in the engine role's defaults: they are the
brief's values, and no inventory, filter or play carries a copy that could drift from them."""

import re
import subprocess
from pathlib import Path

import jinja2
import yaml
from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS, SUB168

REPO = Path(__file__).resolve().parents[3]


def test_the_engine_role_defaults_are_sub168_and_the_default_allocator():
    # The parameter set proven on the platform, as the brief states it.
    assert SUB168 == {"max_model_len": 256000, "max_num_seqs": 2, "gpu_memory_utilization": 0.95,
                      "max_num_batched_tokens": 4096, "enable_chunked_prefill": True,
                      "enforce_eager": True, "dtype": "half", "tensor_parallel_size": 4}
    assert DEFAULT_ALLOCATOR_OPTIONS == {"max_split_size_mb": 512, "garbage_collection_threshold": 0.8}


def test_the_production_inventory_takes_sub168_from_the_role_and_preflight_follows_engine_args():
    group_vars = yaml.safe_load((REPO / "inventory" / "biv100" / "group_vars" / "biv100.yml").read_text())
    assert "engine_args" not in group_vars and "preflight_tensor_parallel_size" not in group_vars
    preflight = yaml.safe_load((REPO / "roles" / "preflight" / "defaults" / "main.yml").read_text())
    tensor_parallel_size = jinja2.Environment().from_string(preflight["preflight_tensor_parallel_size"])
    # What the default comes to, rendered with the engine's arguments: Sub168's, or a team's.
    assert tensor_parallel_size.render(engine_args=SUB168) == "4"
    assert tensor_parallel_size.render(engine_args={**SUB168, "tensor_parallel_size": 8}) == "8"


def settings_text(name: str) -> str:
    """A file's text less its documentation: a module's DOCUMENTATION and EXAMPLES strings and a
    plugin's documentation file show Sub168 as an example, they do not set it."""
    text = (REPO / name).read_text()
    if name.startswith("plugins/") and name.endswith((".yml", ".yaml")):
        return ""
    return re.sub(r'r?"""(?s:.*?)"""', "", text) if name.endswith(".py") else text


def test_no_tracked_file_but_the_engine_defaults_sets_sub168s_context_length():
    # 256000 bound to max_model_len anywhere else (a YAML key, a Python dict) is a copy.
    tracked = subprocess.run(["git", "ls-files", "*.yml", "*.yaml", "*.py"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    setting = re.compile(r"max_model_len\W{1,4}256000\b")
    holders = [name for name in tracked if not name.startswith("tests/") and setting.search(settings_text(name))]
    assert holders == ["roles/engine/defaults/main.yml"]
