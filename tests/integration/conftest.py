"""The integration tests' labs: each test module builds its own in pytest's temporary folder
and takes it down after, so no test depends on (or disturbs) a lab a person left up."""

from __future__ import annotations

import pytest
from lab_guard import refuse_unless_the_lab_can_be_built

import lab as lab_builder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab of the default 4 hosts (one of each variant, h4 a second vendor host)."""
    refuse_unless_the_lab_can_be_built()
    lab_dir = tmp_path_factory.mktemp("lab")
    yield lab_builder.up(n_hosts=4, lab_dir=lab_dir)
    lab_builder.down(lab_dir)
