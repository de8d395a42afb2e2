"""Whether this machine may build a lab for a test module now, and the lab a module builds.

Each pytest process builds its labs under lab ids of its own, so that the pytest-xdist workers
(`pytest -n 2`) each run their test modules on their own lab beside the other's, and none of
them touches lab 0, the one `make deploy` builds and a person may have left up: worker gw<n>
(or a run without xdist, as gw0) owns lab ids 2n+1, for its modules' labs, and 2n+2, for a test
that needs a second lab beside its module's.
"""

from __future__ import annotations

import os

import pytest

import lab as lab_builder


def _worker_number() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw"))


def module_lab_id() -> int:
    """The lab id of this process's test modules' labs."""
    return 2 * _worker_number() + 1


def second_lab_id() -> int:
    """A lab id of this process's that no module lab uses, for a lab beside the module's."""
    return 2 * _worker_number() + 2


def refuse_unless_the_lab_can_be_built(lab_id: int) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root: it makes network namespaces and mounts", pytrace=False)
    running = lab_builder.running_lab_dir(lab_id)
    if running and (running / "lab.json").exists():
        pytest.fail(
            f"lab {lab_id} is up in {running}; these tests build their own under that lab id. "
            f"Take it down first: {lab_builder.LAB_DIR_ENV}={running} python tests/lab/lab.py down",
            pytrace=False,
        )


def built_lab(tmp_path_factory, n_hosts: int = 4, gpus: dict | None = None,
              real_engines: tuple[str, ...] = ()):
    """Yield a lab of n_hosts (and `gpus` per host and the hosts of `real_engines`, as lab.up
    takes them) in pytest's temporary folder, under this process's module lab id, then take it
    down: the body of a test module's `lab` fixture."""
    lab_id = module_lab_id()
    refuse_unless_the_lab_can_be_built(lab_id)
    lab_dir = tmp_path_factory.mktemp("lab")
    yield lab_builder.up(n_hosts=n_hosts, gpus=gpus, lab_dir=lab_dir, lab_id=lab_id,
                         real_engines=real_engines)
    lab_builder.down(lab_dir)
