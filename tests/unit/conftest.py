"""Shared set-up of the unit tests: import paths and the real vLLM source trees."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# The checkout is the collection biv100.serving through the committed link
# collections/ansible_collections/biv100/serving, so FQCN imports resolve from this tree.
sys.path.insert(0, str(REPO_ROOT / "collections"))
# tests/lab is a folder of scripts, not a package.
sys.path.insert(0, str(REPO_ROOT / "tests" / "lab"))

import vllm_sources  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def vllm_trees():
    """The `vllm/` package folder of each release in LAYOUT_VERSIONS, fetched once and cached."""
    return {
        version: vllm_sources.ensure_tree(version) / "vllm"
        for version in vllm_sources.LAYOUT_VERSIONS
    }
