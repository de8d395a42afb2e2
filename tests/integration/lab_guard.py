"""Whether this machine may build a lab for a test module now, and the lab a module builds.

Each pytest process builds its labs under lab ids of its own, so that the pytest-xdist workers
(`pytest -n 2`) each run their test modules on their own lab beside the other's, and none of
them touches lab 0, the one `make deploy` builds and a person may have left up: worker gw<n>
(or a run without xdist, as gw0) owns lab ids 2n+1, for its modules' labs, and 2n+2, for a test
that needs a second lab beside its module's.

A lab a test run builds is claimed by the pytest process (a file beside its lab dir). A run
that was interrupted (killed, or its machine stopped) leaves its labs up; the next run takes a lab
left under its lab id down when the process that claimed it has ended, so that a test run
converges after an interrupted one, and refuses one that a running process claims or that no test
run claimed (a person's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def _process_start(pid: int) -> str | None:
    """The process's start time (clock ticks after boot), which tells it from a later process
    given the same pid; None if no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _claim_file(lab_dir: Path) -> Path:
    """Beside the lab dir, not in it: the lab's files are all the lab's."""
    return lab_dir.with_name(lab_dir.name + ".test-run.json")


def claimed_lab_dir(lab_dir: Path) -> Path:
    """Claim `lab_dir` for this pytest process, before a lab is built in it."""
    claim = {"pid": os.getpid(), "start": _process_start(os.getpid())}
    _claim_file(lab_dir).write_text(json.dumps(claim))
    return lab_dir


def _left_by_an_ended_test_run(lab_dir: Path) -> bool:
    try:
        claim = json.loads(_claim_file(lab_dir).read_text())
        pid, start = int(claim["pid"]), claim["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no test run's, or not readable as one: not ours to take down
    return _process_start(pid) != start


def refuse_unless_the_lab_can_be_built(lab_id: int) -> None:
    """Fail the test unless lab `lab_id` can be built now; a lab of that id left by an ended test
    run is taken down first."""
    if os.geteuid() != 0:
        pytest.fail("the lab needs root: it makes network namespaces and mounts", pytrace=False)
    running = lab_builder.running_lab_dir(lab_id)
    if running and _left_by_an_ended_test_run(running):
        print(f"lab {lab_id} in {running} was left up by a test run that ended; taking it down")
        lab_builder.down(running)
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
    lab_dir = claimed_lab_dir(tmp_path_factory.mktemp("lab"))
    yield lab_builder.up(n_hosts=n_hosts, gpus=gpus, lab_dir=lab_dir, lab_id=lab_id,
                         real_engines=real_engines)
    lab_builder.down(lab_dir)
