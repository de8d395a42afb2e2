"""The run record: each phase boundary kept, a failure named by the phase and instance the record
is in, a cached record of another run started afresh, and the ledger's lines made from it."""

from __future__ import annotations

import re

import pytest

from ansible_collections.biv100.serving.plugins.filter.verify_problems import verify_problems
from ansible_collections.biv100.serving.plugins.plugin_utils import _run_record as run_record

INSTANCE = {"name": "vllm-2", "label": "gpu1/vllm-2", "record": {"args": {"max_num_seqs": 2}}}


def boundary(record=None, run="r1", **given):
    return run_record.update(record, run=run, host="gpu1", **given)


def test_a_run_starts_holding_the_lock_and_each_boundary_keeps_what_its_phase_proved():
    record = boundary()
    assert (record["phase"], record["state"], record["instances"]) == ("lock", "pending", {})

    record = boundary(record, phase="guard", staged={"release": "sub511", "payload_digest": "ab12",
                                                     "changed_files": ["a.py"], "changed": True, "mappings": []})
    record = boundary(record, phase="engine", instance=INSTANCE)
    record = boundary(record, engine={"changed": True, "command": ["/usr/bin/python3", "-m", "vllm", "--port", "8001"]})
    record = boundary(record, phase="gates", probed={"summary": "75/75 probes passed", "probes": [], "failed_probes": []})

    entry = record["instances"]["vllm-2"]
    assert (record["release"], record["changed"], record["files_changed"]) == ("sub511", True, ["a.py"])
    assert entry["engine"] == INSTANCE["record"] and entry["restarted"] is True
    assert entry["engine_args"] == ["--port", "8001"] and entry["summary"] == "75/75 probes passed"
    assert (record["phase"], record["instance"]) == ("gates", "vllm-2")


def test_verify_keeps_each_instances_findings_and_its_healthy_line():
    record = boundary(boundary(), phase="done", instance=INSTANCE, verified={
        "engine": {"running": True, "pid": 4242, "drift": ["argument --max-num-seqs: running 4, desired 2"]},
        "probes": {"summary": "74/75 probes passed", "probes": [
            {"name": "n-two", "passed": False, "guards": "n above max_num_seqs", "failed_expectation": "status 200"}]}})
    entry = record["instances"]["vllm-2"]
    assert entry["findings"] == ["engine drift: argument --max-num-seqs: running 4, desired 2",
                                 "probe n-two failed (guards: n above max_num_seqs): expected status 200"]
    assert entry["healthy"] == "gpu1/vllm-2: engine pid 4242, 74/75 probes passed"
    # What the filter reports of the host takes the instance's findings as the record kept them.
    assert verify_problems({"guard": {"guard": {"mismatches": []}}, "release": {"release": "sub511"},
                            "instances": record["instances"]}) == entry["findings"]


def test_a_failure_names_the_instance_the_phase_and_the_task_in_one_line():
    record = boundary(boundary(), phase="probes", instance=INSTANCE)
    failed = boundary(record, failed={"msg": "1 of 75 probes failed\nfirst n-two: 400\nsecond"},
                      failed_task="Probe the engine")
    assert failed["failure"] == ("gpu1/vllm-2: the probes phase failed at 'Probe the engine': 1 of 75 probes "
                                 "failed [2 more lines in its output above]")
    # Before any phase the run only held the host's lock; a host-wide phase names the host.
    assert boundary(failed={"msg": "held by run R"}, failed_task="Check")["failure"] == (
        "gpu1: the lock phase failed at 'Check': held by run R")


def test_a_cached_record_of_another_run_is_started_afresh():
    earlier = boundary(boundary(run="r0", phase="canary", instance=INSTANCE), run="r0", failed={"msg": "x"},
                       failed_task="t")
    record = boundary(earlier, run="r1", phase="stage")
    assert record["run"] == "r1" and record["instances"] == {} and "failure" not in record


def test_the_rollback_keeps_what_it_proved_instance_by_instance():
    record = boundary(boundary(), rolled_back={"release": "sub510", "from_release": "sub511", "changed_files": ["a.py"]})
    record = boundary(record, instance=INSTANCE, probed={"summary": "75/75 probes passed", "probes": []})
    assert (record["phase"], record["release"], record["state"]) == ("rollback", "sub510", "rolled back")
    assert record["rollback"] == {"from": "sub511", "to": "sub510", "files": ["a.py"]}
    assert record["rollback_proven"] == {"vllm-2": "75/75 probes passed"}


@pytest.mark.parametrize(("given", "named"), [
    ({"phase": "nap"}, "phase 'nap' is not one of lock, base, stage"),
    ({"probed": {"summary": "1/1"}}, "probed is an engine instance's result: name the instance"),
    ({"staged": "sub511"}, "staged must be a task's result (a dict), not str"),
])
def test_an_input_the_record_cannot_take_is_named(given, named):
    with pytest.raises(run_record.RunRecordError, match=re.escape(named)):
        boundary(**given)


def test_a_host_of_several_instances_has_a_ledger_line_per_instance_with_the_hosts_release():
    record = boundary(phase="done", staged={"release": "sub511", "payload_digest": "ab12", "changed_files": []})
    for name in ("vllm-1", "vllm-2"):
        record = boundary(record, instance={"name": name, "label": f"gpu1/{name}"},
                          probed={"summary": f"75/75 probes passed on {name}", "probes": []})
    lines = run_record.ledger_lines(record)
    assert sorted(lines) == ["gpu1/vllm-1", "gpu1/vllm-2"]
    assert lines["gpu1/vllm-2"]["release"] == "sub511" and "probe_verdicts" not in lines["gpu1/vllm-2"]
    assert list(run_record.ledger_lines(boundary(phase="done"))) == ["gpu1"]
