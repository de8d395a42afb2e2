"""The integration tests' labs: each test module builds its own in pytest's temporary folder,
under its pytest process's lab id (lab_guard: one per pytest-xdist worker, never lab 0), with its
own inventory in the lab dir, and takes it down after; so no test depends on (or disturbs) a lab
a person left up or another worker's."""

from __future__ import annotations

import pytest
from lab_guard import built_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab of the default 4 hosts (one of each variant, h4 a second vendor host)."""
    yield from built_lab(tmp_path_factory)
