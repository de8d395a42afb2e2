"""lock_refusal: the first host, by name, whose lock a run's first round did not take."""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.filter.lock_refusal import lock_refusal

RUN = "20261204T070000Z-1"


def taken(run_id=RUN):
    return {"changed": False, "failed": False, "holder": {"run_id": run_id, "taking": True}}


def refused(msg):
    return {"changed": False, "failed": False, "failed_when_result": False, "msg": msg,
            "holder": {"run_id": "20261204T065959Z-7"}}


def test_a_run_that_took_every_host_has_no_refusal():
    hostvars = {name: {"lock_taking": taken()} for name in ("h1", "h2")}
    assert lock_refusal(["h2", "h1"], hostvars, RUN) == ""


def test_the_first_refused_host_by_name_is_named_with_the_modules_message():
    hostvars = {"h1": {"lock_taking": taken()}, "h3": {"lock_taking": refused("/s/lock is held by run B")},
                "h2": {"lock_taking": refused("/s/lock is held by run A")}}
    assert lock_refusal(["h3", "h1", "h2"], hostvars, RUN) == "h2: /s/lock is held by run A"


def test_an_unreachable_host_refuses_the_run():
    hostvars = {"h1": {"lock_taking": {"unreachable": True, "msg": "ssh: connect to host h1 port 22: refused"}},
                "h2": {"lock_taking": taken()}}
    assert lock_refusal(["h1", "h2"], hostvars, RUN) == (
        "h1: unreachable while its lock was taken (ssh: connect to host h1 port 22: refused)")


def test_a_host_with_no_result_left_the_run_before_its_lock():
    assert lock_refusal(["h1"], {"h1": {}}, RUN) == "h1: it left the run before its lock was taken"


def test_a_failure_that_names_no_holder_still_refuses_the_run():
    hostvars = {"h1": {"lock_taking": {"failed": False, "msg": "/s: Permission denied"}}}
    assert lock_refusal(["h1"], hostvars, RUN) == "h1: /s: Permission denied"
