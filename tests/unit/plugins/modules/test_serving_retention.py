"""biv100.serving.serving_retention on release records of known ages."""

from __future__ import annotations

import json
import os
import time

import pytest

from ansible_collections.biv100.serving.plugins.modules import serving_retention

DAY = 86400


def stamp(days_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - days_ago * DAY))


@pytest.fixture
def store(tmp_path):
    """Releases r1 (oldest) .. r8 with these statuses; r8 current, r6 the last good one."""
    statuses = {"r1": "good", "r2": "failed", "r3": "good", "r4": "rolled_back", "r5": "good",
                "r6": "good", "r7": "failed", "r8": "pending"}
    ages = {"r1": 40, "r2": 30, "r3": 20, "r4": 10, "r5": 5, "r6": 3, "r7": 2, "r8": 1}
    previous = None
    for name, status in statuses.items():
        folder = tmp_path / "releases" / name
        (folder / "files").mkdir(parents=True)
        (folder / "release.json").write_text(json.dumps(
            {"id": name, "status": status, "created_at": stamp(ages[name]), "previous": previous}))
        previous = name
    os.symlink("releases/r8", tmp_path / "current")
    return tmp_path


def releases(store):
    return sorted(name for name in os.listdir(store / "releases") if not name.startswith("."))


def test_keeps_the_newest_good_the_current_the_last_good_and_young_failures(run_module, store):
    result = run_module(serving_retention, dict(state_dir=str(store), keep_good=2, keep_failed_days=14)).result

    # r8 current, r6 and r5 the two newest proven (r6 also the last good), r7 failed 2 days ago.
    assert result["kept"] == ["r8", "r7", "r6", "r5"]
    assert result["removed"] == ["r4", "r3", "r2", "r1"] and result["changed"]
    assert releases(store) == ["r5", "r6", "r7", "r8"]
    again = run_module(serving_retention, dict(state_dir=str(store), keep_good=2)).result
    assert (again["changed"], again["removed"]) == (False, [])


def test_check_mode_removes_nothing_and_an_interrupted_removal_is_finished(run_module, store):
    checked = run_module(serving_retention, dict(state_dir=str(store), keep_good=1, _ansible_check_mode=True)).result
    assert checked["changed"] and releases(store) == [f"r{i}" for i in range(1, 9)]
    (store / "releases" / ".removing-r0").mkdir()  # a removal a run did not finish
    run_module(serving_retention, dict(state_dir=str(store), keep_good=5, keep_failed_days=100))
    assert not (store / "releases" / ".removing-r0").exists()


def test_keep_good_below_one_is_refused(run_module, store):
    failed, result = run_module(serving_retention, dict(state_dir=str(store), keep_good=0))
    assert failed and "keep_good must be at least 1" in result["msg"]
