"""biv100.serving.canary_analysis through ActionModule.run(): the sides as the playbook gathers
them, paired by instance and trial, with the A/A trials before the change; a historical baseline
read from a release record; the verdict as data; the analysis written with every pair on the
controller; and bad input refused before anything is judged."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.biv100.serving.plugins.action import canary_analysis as analysis_action


def bench(rate, label, count=24):
    return {"label": label, "score": 10000.0 * rate, "output_tps": 2500.0 * rate, "simulated": True,
            "samples": {"output_tps": [3000.0 * rate] * count, "ttft_ms": [25.0 / rate] * count,
                        "tpot_ms": [0.2 / rate] * count, "e2e_ms": [60.0 / rate] * count}}


def trials(*rates, label="h1"):
    return [bench(rate, label) for rate in rates]


PROBES = [[{"name": "a", "passed": True}, {"name": "b", "passed": True}]]


def run_action(args: dict, tmp_path: Path, check_mode=False):
    arguments = {"quality_margin": 0.04, "trials": 3, "results_dir": str(tmp_path / "canary"), **args}
    task = SimpleNamespace(args=arguments, check_mode=check_mode, async_val=0, action="biv100.serving.canary_analysis")
    action = analysis_action.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None,
                                          DataLoader(), Templar(loader=DataLoader(), variables={}), None)
    return action.run(task_vars={})


def sides(canary_rates, baseline_rates, **baseline):
    return {"canary": {"host": "h1", "release": "sub511", "benches": trials(*canary_rates), "qualities": [1.0],
                       "probes": PROBES},
            "baseline": {"host": "h2", "release": "sub510", "benches": trials(*baseline_rates, label="h2"),
                         "qualities": [1.0],
                         "probes": PROBES, **baseline}}


def test_a_slower_canary_fails_as_data_and_the_analysis_is_written_with_its_pairs(tmp_path):
    result = run_action(sides([0.90, 0.91, 0.89], [1.0, 1.01, 0.99]), tmp_path)

    assert not result.get("failed") and not result["changed"]
    assert (result["verdict"], result["score"], result["promote"]) == ("fail", 0.0, False)
    assert result["baseline"] == {"host": "h2", "kind": "same window", "release": "sub510"} and result["simulated"]
    assert result["msg"].startswith("h1: canary analysis fail, score 0 after 3 trials against h2 (same window, sub510)")
    assert result["msg"].endswith("[simulated]") and result["trials_before"] == 0
    written = json.loads(Path(result["results_file"]).read_text())
    assert result["results_file"] == str(tmp_path / "canary" / "sub511" / "h1.json")
    assert written["verdict"] == "fail" and written["pairs"]["score"] == [[9000.0, 10000.0], [9100.0, 10100.0],
                                                                          [8900.0, 9900.0]]
    assert written["pairs"]["quality"] == [[1.0, 1.0]] and written["pairs_before"]["score"] == []


def test_the_trials_before_the_change_take_the_hosts_own_gap_out(tmp_path):
    # h1 is 6 % slower than h2 by nature, before the change and after it.
    arguments = sides([0.94, 0.95, 0.93], [1.0, 1.01, 0.99])
    alone = run_action(arguments, tmp_path)
    arguments["before"] = {"canary": trials(0.94, 0.941, 0.939), "baseline": trials(1.0, 1.001, 0.999, label="h2")}
    judged = run_action(arguments, tmp_path)

    assert not alone["promote"]
    assert (judged["verdict"], judged["promote"], judged["trials_before"]) == ("pass", True, 3)
    assert "after 3 trials (3 before the change) against h2" in judged["msg"]


def test_a_historical_baseline_is_read_from_the_gates_its_release_recorded(tmp_path):
    recorded = {"instances": {"vllm": {"bench": bench(1.0, "h1"), "quality": {"score": 1.0}}}}
    arguments = sides([1.0, 1.002, 0.998], [])
    arguments["baseline"] = {"kind": "historical", "release": "sub510", "gates": recorded, "instances": ["vllm"]}
    # A/A trials mean nothing against a record: they are not asked for, and not used.
    arguments["before"] = {"canary": trials(0.5, 0.5, 0.5), "baseline": trials(1.0, 1.0, 1.0, label="h2")}

    result = run_action(arguments, tmp_path)

    assert result["baseline"] == {"host": None, "kind": "historical", "release": "sub510"}
    assert "after 3 trials against h1 (historical, sub510)" in result["msg"] and result["verdict"] == "pass"
    score = {metric["name"]: metric for metric in result["metrics"]}["score"]
    assert (score["canary"]["count"], score["baseline"]["count"], score["trials"]) == (3, 3, 3)
    assert score["baseline"]["min"] == score["baseline"]["max"] == 10000.0


def test_check_mode_judges_and_writes_nothing(tmp_path):
    result = run_action(sides([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]), tmp_path, check_mode=True)

    assert result["verdict"] == "pass" and result["results_file"] is None
    assert not (tmp_path / "canary").exists()


@pytest.mark.parametrize(("change", "message"), [
    ({"canary": {"host": "h1", "release": "../up"}}, "canary.release must be a plain name such as sub510"),
    ({"baseline": {"release": "sub510"}}, "a same-window baseline needs its host"),
    ({"baseline": {"kind": "historical", "release": "sub510"}}, "a historical baseline needs the gates"),
    ({"accept": ["fail"]}, "serving_canary_accept: fail cannot be accepted"),
])
def test_bad_input_is_refused_naming_it(tmp_path, change, message):
    with pytest.raises(AnsibleActionFail, match=message.replace(".", r"\.")):
        run_action({**sides([1.0], [1.0]), **change}, tmp_path)
    assert not (tmp_path / "canary").exists()
