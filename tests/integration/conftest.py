"""The integration tests' labs: each test module builds its own in pytest's temporary folder,
under its pytest process's lab id (lab_guard: one per pytest-xdist worker, never lab 0), with its
own inventory in the lab dir, and takes it down after; so no test depends on (or disturbs) a lab
a person left up or another worker's."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest
from lab_guard import built_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab of the default 4 hosts (one of each variant, h4 a second vendor host)."""
    yield from built_lab(tmp_path_factory)


# The modules by the time they take, longest first (make integration lists the slowest steps).
# pytest-xdist hands each worker whole modules in the order collected (make integration passes
# --no-loadscope-reorder, whose default orders them by their number of tests): the long ones
# start first and the short ones even out the workers' ends. A module not listed goes last. The
# canary analysis' comes after enough others that the real engine's, which it may not run beside
# (one_cpu_heavy_module_at_a_time), has ended by the time a worker takes it.
HERE = Path(__file__).parent
LONGEST_FIRST = ("test_real_engine", "test_deploy_playbook", "test_tune", "test_canary_analysis", "test_rollback",
                 "test_instances", "test_gates", "test_submission", "test_facts_playbook", "test_release_cycle",
                 "test_lab", "test_secrets")


def pytest_collection_modifyitems(items):
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    # These modules' tests only, in the places they held (a run may collect the unit tests too);
    # a stable sort, so each module's tests keep their order.
    places = [index for index, item in enumerate(items) if item.path.parent == HERE]
    ordered = sorted((items[index] for index in places), key=lambda item: rank.get(item.path.stem, len(rank)))
    for index, item in zip(places, ordered):
        items[index] = item


@pytest.fixture(scope="module")
def one_cpu_heavy_module_at_a_time(tmp_path_factory):
    """For the modules that run one at a time, whichever worker has them: the real engine
    computes on a whole CPU for minutes, and the canary analysis judges the stand-in's timing,
    which the lab's two cores cannot keep beside it. Held by a module from before its lab is
    built until its last test ended, another module using it waits until then: an flock on a
    file of the test run's temporary folder (the workers' common parent), released with the
    process should it die."""
    with open(tmp_path_factory.getbasetemp().parent / "one-cpu-heavy-module.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
