"""biv100.serving.serving_lock (host half) through AnsibleModule, on a temporary state dir."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.biv100.serving.plugins.modules import serving_lock

# What the action adds to the task's arguments.
OURS = {"_controller": "ctl1", "_user": "deploy", "_pid": 4242}
OTHER = {
    "run_id": "20260508T221003Z-118",
    "controller": "ctl2",
    "user": "alice",
    "pid": 777,
    "playbook": "deploy.yml",
    "release": "sub509",
    "acquired_at": "2026-05-08T22:10:04Z",
}


@pytest.fixture
def lock_path(tmp_path):
    return tmp_path / "state" / "lock"


@pytest.fixture
def lock(lock_path, run_module):
    """Run the module for run `run-1` on the state dir above; returns (failed, result)."""

    def run(**args):
        defaults = dict(
            OURS,
            run_id="run-1",
            playbook="deploy.yml",
            release="sub510",
            state_dir=str(lock_path.parent),
        )
        args = dict(defaults, **args)
        return run_module(serving_lock, args)

    return run


def held_by(lock_path, holder):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path.write_text(json.dumps(holder))


def holder_in(lock_path):
    return json.loads(lock_path.read_text())


def warning_messages(result):
    return [warning["event"]["msg"] for warning in result.get("warnings", [])]


def test_a_free_lock_is_taken_naming_this_run(lock, lock_path):
    failed, result = lock()
    assert not failed and result["changed"] is True
    holder = holder_in(lock_path)
    assert holder == dict(
        run_id="run-1",
        controller="ctl1",
        user="deploy",
        pid=4242,
        playbook="deploy.yml",
        release="sub510",
        acquired_at=holder["acquired_at"],
    )
    assert holder["acquired_at"].endswith("Z")
    assert result["holder"] == holder and result["lock"] == str(lock_path)
    assert [path.name for path in lock_path.parent.iterdir()] == ["lock"]


def test_taking_it_again_in_the_same_run_changes_nothing(lock, lock_path):
    lock()
    written = lock_path.read_text()
    failed, result = lock(release="another")
    assert not failed and result["changed"] is False
    assert lock_path.read_text() == written
    assert result["holder"] == json.loads(written)


def test_a_lock_held_by_another_run_is_refused_naming_the_holder(lock, lock_path):
    held_by(lock_path, OTHER)
    failed, result = lock()
    assert failed
    assert result["msg"] == (
        "%s is held by run 20260508T221003Z-118 (alice@ctl2, pid 777, playbook deploy.yml, "
        "release sub509) since 2026-05-08T22:10:04Z" % lock_path
    )
    assert result["holder"] == OTHER
    assert holder_in(lock_path) == OTHER


def test_break_lock_takes_it_over(lock, lock_path):
    held_by(lock_path, OTHER)
    failed, result = lock(break_lock=True)
    assert not failed and result["changed"] is True
    assert result["previous_holder"] == OTHER
    assert holder_in(lock_path)["run_id"] == "run-1"
    assert "took the lock over from run 20260508T221003Z-118" in result["msg"]


def test_a_stale_run_named_by_the_action_is_taken_over(lock, lock_path):
    held_by(lock_path, OTHER)
    failed, result = lock(_break_stale=OTHER["run_id"])
    assert not failed and result["previous_holder"] == OTHER
    assert holder_in(lock_path)["run_id"] == "run-1"


def test_a_run_that_took_the_lock_since_the_stale_one_is_not_overrun(lock, lock_path):
    held_by(lock_path, dict(OTHER, run_id="newer"))
    failed, result = lock(_break_stale=OTHER["run_id"])
    assert failed and result["holder"]["run_id"] == "newer"
    assert holder_in(lock_path)["run_id"] == "newer"


@pytest.fixture
def holder_still_runs(started_process):
    """A process of OTHER's run on this host, as a module of it left by a killed controller."""
    return started_process(["sleep", "60"], env=dict(os.environ, BIV100_SERVING_RUN=OTHER["run_id"]))


@pytest.mark.parametrize("take_over", [{"break_lock": True}, {"_break_stale": OTHER["run_id"]}],
                         ids=["break_lock", "stale"])
def test_no_takeover_while_the_holder_still_runs_on_the_host(lock, lock_path, holder_still_runs, take_over):
    held_by(lock_path, OTHER)
    pid = holder_still_runs.pid
    for check_mode in (True, False):
        failed, result = lock(_ansible_check_mode=check_mode, **take_over)
        assert failed and holder_in(lock_path) == OTHER
        [process] = result["holder_processes"]
        assert (process["pid"], process["command"]) == (pid, "sleep 60")
        assert result["holder"] == OTHER
        assert result["msg"] == (
            "%s is held by run 20260508T221003Z-118 (alice@ctl2, pid 777, playbook deploy.yml, "
            "release sub509) since 2026-05-08T22:10:04Z, which still runs on this host: pid %d "
            "(sleep 60, since %s). The lock is not taken over while they run: end that run's "
            "leftover ansible-playbook workers on ctl2, then wait for these processes to end or "
            "end them (kill %d), and run again" % (lock_path, pid, process["started_at"], pid)
        )
    holder_still_runs.kill()
    holder_still_runs.wait()
    failed, result = lock(**take_over)
    assert not failed and result["previous_holder"] == OTHER
    assert holder_in(lock_path)["run_id"] == "run-1"


def test_processes_of_another_run_do_not_keep_the_lock(lock, lock_path, started_process):
    held_by(lock_path, OTHER)
    started_process(["sleep", "60"], env=dict(os.environ, BIV100_SERVING_RUN="run-1"))
    failed, result = lock(break_lock=True)
    assert not failed and result["previous_holder"] == OTHER


def test_an_unreadable_lock_still_holds_the_host(lock, lock_path):
    held_by(lock_path, OTHER)
    lock_path.write_text("{half a lo")
    failed, result = lock()
    assert failed and "unreadable lock" in result["msg"] and str(lock_path) in result["msg"]
    failed, result = lock(break_lock=True)
    assert not failed and holder_in(lock_path)["run_id"] == "run-1"


# --- two rounds: taking, then held --------------------------------------------------------


def test_a_lock_taken_in_the_first_round_is_marked_held_in_the_second(lock, lock_path):
    failed, result = lock(state="taking")
    assert not failed and result["changed"] is True and result["msg"] == "this run is taking the lock"
    taking = holder_in(lock_path)
    assert taking["taking"] is True and taking["run_id"] == "run-1"
    failed, result = lock(state="taking")
    assert not failed and result["changed"] is False and holder_in(lock_path) == taking
    failed, result = lock()
    assert not failed and result["changed"] is True
    held = holder_in(lock_path)
    assert held == {key: value for key, value in taking.items() if key != "taking"}
    assert result["holder"] == held
    # Held stays held: a later first round of the same run does not undo the second.
    failed, result = lock(state="taking")
    assert not failed and result["changed"] is False and holder_in(lock_path) == held


def older_run_taking(**fields):
    """A run begun a second before ours (ids begin with the run's start time), taking the lock
    since a moment ago."""
    return {**OTHER, "run_id": "20260508T221003Z-118", "taking": True,
            "acquired_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}


def our_later_run(lock):
    def run(**args):
        return lock(run_id="20260508T221004Z-9", **args)

    return run


def once_the_older_run_ends_its_round(monkeypatch, lock_path, then):
    """Where this run would wait, the older run's round ends: `then` is what it leaves."""
    waits = []

    def older_round_ends(_seconds):
        waits.append(holder_in(lock_path))
        if then is None:
            lock_path.unlink()
        else:
            held_by(lock_path, then)

    monkeypatch.setattr(serving_lock.time, "sleep", older_round_ends)
    return waits


def test_a_run_waits_for_an_older_one_still_taking_and_is_refused_once_it_holds(lock, lock_path, monkeypatch):
    taking = older_run_taking()
    held_by(lock_path, taking)
    held = dict(OTHER, run_id="20260508T221003Z-118")
    waits = once_the_older_run_ends_its_round(monkeypatch, lock_path, then=held)
    failed, result = our_later_run(lock)(state="taking")
    assert waits == [taking]
    assert failed and result["holder"] == held and holder_in(lock_path) == held
    assert "is held by run 20260508T221003Z-118" in result["msg"]


def test_a_run_waits_for_an_older_one_still_taking_and_takes_the_lock_it_gives_back(lock, lock_path, monkeypatch):
    held_by(lock_path, older_run_taking())
    waits = once_the_older_run_ends_its_round(monkeypatch, lock_path, then=None)
    failed, result = our_later_run(lock)(state="taking")
    assert len(waits) == 1
    assert not failed and holder_in(lock_path)["run_id"] == "20260508T221004Z-9"
    assert "previous_holder" not in result


def test_an_older_run_is_refused_at_once_by_a_younger_one_still_taking(lock, lock_path, monkeypatch):
    younger = dict(OTHER, run_id="20260508T221004Z-9", taking=True)
    held_by(lock_path, younger)
    waits = once_the_older_run_ends_its_round(monkeypatch, lock_path, then=None)
    failed, result = lock(run_id="20260508T221003Z-118", state="taking")
    assert failed and not waits and holder_in(lock_path) == younger
    assert result["msg"].endswith("since 2026-05-08T22:10:04Z, still taking its other hosts")


@pytest.mark.parametrize("began", ["2026-05-08T22:10:04Z", "now"], ids=["long-ago", "wait-0"])
def test_a_run_still_taking_past_the_wait_refuses_the_younger_at_once_naming_it(lock, lock_path, monkeypatch, began):
    # Begun taking longer ago than the wait, or now with no wait: stuck or gone.
    stuck = older_run_taking(**({} if began == "now" else {"acquired_at": began}))
    held_by(lock_path, stuck)
    waits = once_the_older_run_ends_its_round(monkeypatch, lock_path, then=None)
    failed, result = our_later_run(lock)(state="taking", wait=0 if began == "now" else 60)
    assert failed and not waits and holder_in(lock_path) == stuck
    assert "is held by run 20260508T221003Z-118" in result["msg"]
    assert result["msg"].endswith("still taking its other hosts")


def test_breaking_the_lock_of_an_older_run_still_taking_does_not_wait(lock, lock_path, monkeypatch):
    taking = older_run_taking()
    held_by(lock_path, taking)
    waits = once_the_older_run_ends_its_round(monkeypatch, lock_path, then=None)
    failed, result = our_later_run(lock)(state="taking", break_lock=True)
    assert not failed and not waits and result["previous_holder"] == taking


def take_every_host(args, hosts, out, start):
    """One run's two rounds, as the lock role plays them, in its own process: every host as
    taking, then every host held, or what it took given back at the first refusal."""
    sys.stdout = open(os.devnull, "w")
    start.wait()

    def module(state_dir, **extra):
        with patch_module_args(dict(args, state_dir=state_dir, **extra)):
            try:
                serving_lock.main()
            except SystemExit as exit_info:
                return exit_info.code == 0
        return True

    taken = []
    for state_dir in hosts:
        if not module(state_dir, state="taking"):
            for held in taken:
                module(held, state="absent")
            break
        taken.append(state_dir)
    else:
        for state_dir in hosts:
            module(state_dir)
    with open(out, "w") as result:
        json.dump(len(taken) == len(hosts), result)


@pytest.mark.parametrize("seed", range(3))
def test_of_runs_taking_the_same_hosts_in_any_order_exactly_one_holds_them_all(tmp_path, seed):
    """Each run takes the hosts in an order of its own (the forks of a play finish in any
    order), at the same instant as the others."""
    hosts = [str(tmp_path / ("host-%d" % index)) for index in range(3)]
    order = random.Random(seed)
    context = multiprocessing.get_context("fork")
    start = context.Barrier(4)
    runs = []
    for index in range(4):
        args = dict(OURS, run_id="20260508T221003Z-%d" % index, wait=30)
        out = tmp_path / ("run-%d.json" % index)
        child = context.Process(target=take_every_host, args=(args, order.sample(hosts, 3), str(out), start))
        child.start()
        runs.append((args["run_id"], child, out))
    for _run_id, child, _out in runs:
        child.join(120)
    winners = [run_id for run_id, _child, out in runs if json.loads(out.read_text())]
    assert len(winners) == 1
    for state_dir in hosts:
        holder = holder_in(Path(state_dir) / "lock")
        assert holder["run_id"] == winners[0] and "taking" not in holder


def test_releasing_our_lock_removes_it(lock, lock_path):
    lock()
    failed, result = lock(state="absent")
    assert not failed and result["changed"] is True and result["holder"] is None
    assert not lock_path.exists()


def test_releasing_a_free_lock_changes_nothing(lock):
    failed, result = lock(state="absent")
    assert not failed and result["changed"] is False


def test_releasing_another_runs_lock_leaves_it_with_a_warning(lock, lock_path):
    held_by(lock_path, OTHER)
    failed, result = lock(state="absent")
    assert not failed and result["changed"] is False
    assert holder_in(lock_path) == OTHER
    [warning] = warning_messages(result)
    assert "run 20260508T221003Z-118" in warning and "left in place" in warning


def test_check_mode_takes_nothing_but_reports_the_change(lock, lock_path):
    failed, result = lock(_ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert not lock_path.exists()


def test_check_mode_still_refuses_a_lock_held_by_another_run(lock, lock_path):
    held_by(lock_path, OTHER)
    failed, result = lock(_ansible_check_mode=True)
    assert failed and result["holder"] == OTHER


def test_check_mode_neither_breaks_nor_releases(lock, lock_path):
    held_by(lock_path, OTHER)
    failed, result = lock(break_lock=True, _ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert holder_in(lock_path) == OTHER
    lock_path.unlink()
    lock()
    failed, result = lock(state="absent", _ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert lock_path.exists()


def test_diff_shows_the_lock_before_and_after(lock, lock_path):
    held_by(lock_path, OTHER)
    _failed, result = lock(break_lock=True, _ansible_diff=True)
    assert json.loads(result["diff"]["before"]) == OTHER
    assert json.loads(result["diff"]["after"])["run_id"] == "run-1"
    _failed, result = lock(state="absent", _ansible_diff=True)
    assert (
        json.loads(result["diff"]["before"])["run_id"] == "run-1" and result["diff"]["after"] == ""
    )


def test_no_diff_unless_asked(lock):
    _failed, result = lock()
    assert result["changed"] is True and "diff" not in result


def run_in_a_child(args, out, start):
    """One deployment's task in its own process, started with the others at `start`."""
    sys.stdout = open(out, "w")
    start.wait()
    with patch_module_args(args):
        try:
            serving_lock.main()
        except SystemExit:
            pass
    sys.stdout.flush()


def race(tmp_path, args_per_run):
    """Run the module once per args at the same instant; returns each run's result."""
    context = multiprocessing.get_context("fork")
    start = context.Barrier(len(args_per_run))
    outs = [tmp_path / ("run-%d.json" % index) for index in range(len(args_per_run))]
    children = [
        context.Process(target=run_in_a_child, args=(args, str(out), start))
        for args, out in zip(args_per_run, outs)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    return [json.loads(out.read_text()) for out in outs]


def test_of_runs_starting_together_exactly_one_takes_the_lock(tmp_path, lock_path):
    runs = [
        dict(OURS, run_id="run-%d" % index, state_dir=str(lock_path.parent)) for index in range(8)
    ]
    results = race(tmp_path, runs)
    winners = [result["holder"]["run_id"] for result in results if not result.get("failed")]
    assert len(winners) == 1
    assert holder_in(lock_path)["run_id"] == winners[0]
    assert all(
        "is held by run %s" % winners[0] in result["msg"]
        for result in results
        if result.get("failed")
    )


def test_of_runs_breaking_the_same_stale_lock_together_exactly_one_takes_it(tmp_path, lock_path):
    held_by(lock_path, OTHER)
    runs = [
        dict(
            OURS,
            run_id="run-%d" % index,
            state_dir=str(lock_path.parent),
            _break_stale=OTHER["run_id"],
        )
        for index in range(8)
    ]
    results = race(tmp_path, runs)
    winners = [result["holder"]["run_id"] for result in results if not result.get("failed")]
    assert len(winners) == 1
    assert holder_in(lock_path)["run_id"] == winners[0]
