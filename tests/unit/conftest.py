"""Shared set-up of the unit tests: the real vLLM source trees."""

from __future__ import annotations

import pytest
import vllm_sources  # tests/lab is on the path through pytest.ini, like the collection


@pytest.fixture(scope="session")
def vllm_trees():
    """The `vllm/` package folder of each release in LAYOUT_VERSIONS, fetched once and cached."""
    return {
        version: vllm_sources.ensure_tree(version) / "vllm"
        for version in vllm_sources.LAYOUT_VERSIONS
    }
