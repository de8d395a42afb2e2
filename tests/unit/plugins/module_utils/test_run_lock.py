"""The write fence of module_utils/_run_lock.py: a write only for the run the lock names, under
the flock serving_lock takes to change the lock."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._run_lock import NotHeld, fenced


def lock(state_dir, run_id):
    (state_dir / "lock").write_text(json.dumps({"run_id": run_id, "user": "deploy", "controller": "ctl1"}))


def flock_is_free(state_dir) -> bool:
    """Whether another open of the state dir (as serving_lock's, in another process) gets its flock now."""
    fd = os.open(state_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_run_the_lock_names_writes_under_the_locks_flock(tmp_path):
    lock(tmp_path, "run-A")
    with fenced(str(tmp_path), "run-A") as holder:
        assert holder["run_id"] == "run-A"
        assert not flock_is_free(tmp_path), "a take-over could change the lock mid-write"
    assert flock_is_free(tmp_path)


@pytest.mark.parametrize("holder", ["run-B", None])
def test_another_runs_lock_or_none_refuses_before_the_write(tmp_path, holder):
    if holder:
        lock(tmp_path, holder)
    wrote = []
    with pytest.raises(NotHeld, match="staging sub510 refused, nothing changed on this host: run run-A no longer"):
        with fenced(str(tmp_path), "run-A", writing="staging sub510"):
            wrote.append(True)
    assert wrote == [] and flock_is_free(tmp_path)


def test_the_run_comes_from_the_modules_environment_and_none_fences_nothing(tmp_path, monkeypatch):
    lock(tmp_path, "run-B")
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-A")
    with pytest.raises(NotHeld, match="is held by run run-B"):
        with fenced(str(tmp_path)):
            pass
    monkeypatch.delenv("BIV100_SERVING_RUN")
    with fenced(str(tmp_path)) as holder:
        assert holder is None


def test_a_missing_state_dir_refuses_without_making_it(tmp_path):
    with pytest.raises(NotHeld, match="holds no lock here"):
        with fenced(str(tmp_path / "state"), "run-A"):
            pass
    assert not (tmp_path / "state").exists()
