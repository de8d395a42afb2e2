"""lock_round: the hosts a run's first round took, and the first host, by name, it did not."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.filter.lock_round import FilterModule, lock_round

RUN = "20261204T070000Z-1"


def taken(run_id=RUN):
    return {"changed": False, "failed": False, "holder": {"run_id": run_id, "taking": True}}


def refused(msg):
    return {"changed": False, "failed": False, "failed_when_result": False, "msg": msg,
            "holder": {"run_id": "20261204T065959Z-7"}}


def test_a_run_that_took_every_host_names_them_and_no_refusal():
    hostvars = {name: {"lock_taking": taken()} for name in ("h1", "h2")}
    assert lock_round(["h2", "h1"], hostvars, RUN) == {"taken": ["h1", "h2"], "refusal": ""}


def test_the_first_refused_host_by_name_is_named_with_the_modules_message():
    hostvars = {"h1": {"lock_taking": taken()}, "h3": {"lock_taking": refused("/s/lock is held by run B")},
                "h2": {"lock_taking": refused("/s/lock is held by run A")}}
    assert lock_round(["h3", "h1", "h2"], hostvars, RUN) == {
        "taken": ["h1"], "refusal": "h2: /s/lock is held by run A"}


def test_an_unreachable_host_refuses_the_run():
    hostvars = {"h1": {"lock_taking": {"unreachable": True, "msg": "ssh: connect to host h1 port 22: refused"}},
                "h2": {"lock_taking": taken()}}
    assert lock_round(["h1", "h2"], hostvars, RUN) == {
        "taken": ["h2"], "refusal": "h1: unreachable while its lock was taken (ssh: connect to host h1 port 22: refused)"}


def test_hosts_that_take_no_part_or_left_the_play_before_are_neither_taken_nor_refusals():
    hostvars = {"h1": {}, "h2": {"lock_taking": {"skipped": True, "changed": False}}, "h3": {"lock_taking": taken()}}
    assert lock_round(["h1", "h2", "h3"], hostvars, RUN) == {"taken": ["h3"], "refusal": ""}


def test_a_failure_that_names_no_holder_still_refuses_the_run():
    hostvars = {"h1": {"lock_taking": {"failed": False, "msg": "/s: Permission denied"}}}
    assert lock_round(["h1"], hostvars, RUN) == {"taken": [], "refusal": "h1: /s: Permission denied"}


def test_the_filter_is_registered():
    assert FilterModule().filters() == {"lock_round": lock_round}
