"""The engine role's defaults, read from the role: Sub168 and the allocator options are defined
there once, and the tests compare against that one definition."""

from __future__ import annotations

from pathlib import Path

import yaml

DEFAULTS = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "roles" / "engine" / "defaults" / "main.yml").read_text())

# Sub168, the engine parameters proven on the platform (snake_case, as engine_args takes them).
SUB168 = DEFAULTS["engine_args"]
# The deployment's PYTORCH_CUDA_ALLOC_CONF options.
DEFAULT_ALLOCATOR_OPTIONS = DEFAULTS["engine_allocator"]
