"""Whether this machine may build a lab for a test module now, and the lab a module builds."""

from __future__ import annotations

import os

import pytest

import lab as lab_builder


def refuse_unless_the_lab_can_be_built() -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root: it makes network namespaces and mounts", pytrace=False)
    running = lab_builder.running_lab_dir()
    if running:
        pytest.fail(
            f"a lab is up in {running}; these tests build their own and only one can be up. "
            f"Take it down first: {lab_builder.LAB_DIR_ENV}={running} python tests/lab/lab.py down",
            pytrace=False,
        )


def built_lab(tmp_path_factory, n_hosts: int = 4, gpus: dict | None = None):
    """Yield a lab of n_hosts (and `gpus` per host, as lab.up takes them) in pytest's temporary
    folder, then take it down: the body of a test module's `lab` fixture."""
    refuse_unless_the_lab_can_be_built()
    lab_dir = tmp_path_factory.mktemp("lab")
    yield lab_builder.up(n_hosts=n_hosts, gpus=gpus, lab_dir=lab_dir)
    lab_builder.down(lab_dir)
