"""A tuning run's files: candidates.jsonl appended line by line and read back for a resumed run,
a torn last line left out and named, and proposal.yml, the whole settings to deploy."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from engine_defaults import DEFAULT_ALLOCATOR_OPTIONS, SUB168

from ansible_collections.biv100.serving.plugins.plugin_utils._tune_results import (
    TuneRecordError,
    append_candidate,
    bench_figures,
    candidate_record,
    changed_settings,
    proposal,
    read_candidates,
    read_records,
    write_proposal,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_space import make_candidate

INCUMBENT = make_candidate({"engine_args": dict(SUB168), "engine_allocator": dict(DEFAULT_ALLOCATOR_OPTIONS),
                            "engine_env": {}}, incumbent=True)
FASTER = make_candidate({**INCUMBENT, "engine_args": {**SUB168, "max_num_seqs": 8, "max_num_batched_tokens": 8192},
                         "engine_allocator": {**DEFAULT_ALLOCATOR_OPTIONS, "expandable_segments": True}})
BENCH = {"score": 9100.5, "output_tps": 6000.0, "input_tps": 24000.0, "requests": 24, "simulated": True,
         "ttft_ms": {"mean": 200.0, "p99": 310.0}, "tpot_ms": {"p99": 2.5}, "samples": {"ttft_ms": [1.0]}}


def record(candidate=FASTER, status="measured", **extra):
    if status == "measured":
        extra.setdefault("figures", bench_figures(BENCH))
    return candidate_record(candidate, status, round_number=1, factor=1.0, time="2026-01-01T00:00:00Z", **extra)


def test_a_record_keeps_the_settings_the_status_and_the_figures():
    assert record() == {
        "id": FASTER["id"], "incumbent": False,
        "settings": {"engine_args": FASTER["engine_args"], "engine_allocator": FASTER["engine_allocator"],
                     "engine_env": {}},
        "status": "measured", "round": 1, "factor": 1.0, "time": "2026-01-01T00:00:00Z",
        "figures": {"score": 9100.5, "output_tps": 6000.0, "input_tps": 24000.0, "ttft_p99_ms": 310.0,
                    "tpot_p99_ms": 2.5, "requests": 24, "simulated": True, "gate_score": None}}
    assert bench_figures({"score": 1.0})["ttft_p99_ms"] is None
    assert bench_figures({"score": 1.0, "gate": {"score": 2.0, "passed": False}})["gate_score"] == 2.0
    assert candidate_record(FASTER, "invalid", problems=["x"])["time"].endswith("Z")


@pytest.mark.parametrize("status, extra, error", [
    ("measured", {}, "a measured record needs its figures with a score"),
    ("measured", {"figures": {"output_tps": 1.0}}, "a measured record needs its figures with a score"),
    ("invalid", {}, "an? invalid record needs its problems"),
    ("failed_to_start", {}, "a failed_to_start record needs its log_tail"),
    ("missed_gate", {"figures": {"score": 1.0}}, "a missed_gate record needs its gates"),
    ("done", {}, "status 'done' is none of measured, missed_gate, failed_to_start, invalid, started"),
])
def test_a_record_without_what_its_status_needs_is_refused(status, extra, error):
    with pytest.raises(TuneRecordError, match=f"candidate {FASTER['id']}: {error}"):
        candidate_record(FASTER, status, **extra)


def test_records_are_appended_and_read_back_by_candidate(tmp_path):
    path = tmp_path / "run" / "candidates.jsonl"
    first = record(INCUMBENT, "missed_gate", figures={"score": 7000.0}, gates=["score 7000 < 8000"])
    append_candidate(path, first)
    append_candidate(path, record(FASTER, "failed_to_start", log_tail="torch.OutOfMemoryError: CUDA out of memory"))
    later = {**record(), "round": 2, "factor": 1.0}
    append_candidate(path, later)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0]) == first
    assert [entry["status"] for entry in read_records(path)] == ["missed_gate", "failed_to_start", "measured"]
    # By candidate, the last record of each: what a resumed run has measured.
    assert read_candidates(path) == {INCUMBENT["id"]: first, FASTER["id"]: later}
    assert read_records(tmp_path / "nothing-yet.jsonl") == [] and read_candidates(tmp_path / "no.jsonl") == {}


def test_a_torn_last_line_is_left_out_named_and_cut_by_the_next_append(tmp_path):
    path = tmp_path / "candidates.jsonl"
    append_candidate(path, record(INCUMBENT, "invalid", problems=["p"]))
    whole = json.dumps(record())
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(whole[:40])  # the run was killed while writing its second line
    warnings = []
    assert list(read_candidates(path, warnings.append)) == [INCUMBENT["id"]]
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}: line 2 was cut short")
    assert whole[:40] in warnings[0] and "its candidate counts as not run" in warnings[0]
    # Read without a warn, it is left out all the same.
    assert list(read_candidates(path)) == [INCUMBENT["id"]]
    append_candidate(path, record())
    assert [entry["id"] for entry in read_records(path, warnings.append)] == [INCUMBENT["id"], FASTER["id"]]
    assert len(warnings) == 1 and path.read_text().endswith("\n")
    # A torn line even when its JSON happens to be complete: only the newline ends a line.
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(whole)
    assert len(read_records(path, warnings.append)) == 2 and len(warnings) == 2


def test_a_damaged_line_before_the_last_is_an_error_naming_it(tmp_path):
    path = tmp_path / "candidates.jsonl"
    append_candidate(path, record())
    with open(path, "a", encoding="utf-8") as stream:
        stream.write("{not json\n")
    append_candidate(path, record())
    with pytest.raises(TuneRecordError, match=rf"{path}: line 2: not JSON"):
        read_records(path)
    path.write_text('{"id": "c1", "status": "lost"}\n')
    with pytest.raises(TuneRecordError, match=rf"{path}: line 1: status 'lost' is none of"):
        read_records(path)
    path.write_text('["c1"]\n')
    with pytest.raises(TuneRecordError, match=rf"{path}: line 1 is not a mapping"):
        read_records(path)


def test_a_record_that_is_not_json_is_refused_and_nothing_written(tmp_path):
    path = tmp_path / "candidates.jsonl"
    with pytest.raises(TuneRecordError, match=rf"{path}: the record of {FASTER['id']} is not JSON"):
        append_candidate(path, {**record(), "figures": {"score": float("nan")}})
    with pytest.raises(TuneRecordError, match=rf"{path}: the record has no id"):
        append_candidate(path, {"status": "measured"})
    assert not path.exists()


def test_each_append_is_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: (synced.append(descriptor), real_fsync(descriptor)))
    append_candidate(tmp_path / "candidates.jsonl", record())
    append_candidate(tmp_path / "candidates.jsonl", record())
    # The line each time, and the folder once, when the file is new.
    assert len(synced) == 3


def test_the_proposal_is_the_whole_settings_to_deploy_with_what_they_were_measured_against():
    best = record()
    incumbent = record(INCUMBENT, figures={"score": 8200.0, "output_tps": 5500.0, "ttft_p99_ms": 290.0,
                                           "simulated": True})
    text = proposal(best, incumbent, {"run": "20260101T000000Z", "host": "biv100-01", "release": "sub510",
                                      "workload": "default", "judge": "pass, score 92 out of 100"},
                    inventory="inventory/biv100")
    # Exactly the extra vars, each dict whole: -e replaces a dict.
    assert yaml.safe_load(text) == {"engine_args": FASTER["engine_args"], "engine_allocator": FASTER["engine_allocator"],
                                    "engine_env": {}, "serving_tune_mappings": [
        {"settings": ["engine_args.max_num_batched_tokens", "engine_args.max_num_seqs"],
         "source": "tune.yml run 20260101T000000Z", "change": "tuned launch parameter"},
        {"settings": ["engine_allocator.expandable_segments"], "source": "tune.yml run 20260101T000000Z",
         "change": "tuned PYTORCH_CUDA_ALLOC_CONF"}]}
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[0] == f"# tune.yml proposes candidate {FASTER['id']}. Deploy it through the canary and every gate:"
    assert "#   ansible-playbook deploy.yml -i inventory/biv100 -e @build/tune/20260101T000000Z/proposal.yml" in header
    assert "# host: biv100-01" in header and "# judge: pass, score 92 out of 100" in header
    assert (f"# measured against the incumbent {INCUMBENT['id']}: score 9100.5 vs 8200.0, output 6000.0 vs 5500.0 "
            "tok/s, TTFT p99 310.0 vs 290.0 ms") in header
    assert ("# changed: engine_args.max_num_batched_tokens 4096 -> 8192; engine_args.max_num_seqs 2 -> 8; "
            "engine_allocator.expandable_segments (unset) -> true") in header
    assert "# The figures are simulated: measured against the lab's engine stand-in." in header
    assert text.index("---") > text.index(header[-1])


def test_changed_settings_name_each_setting_a_record_sets_otherwise_than_the_incumbent():
    assert changed_settings(record(INCUMBENT), record()) == [
        "engine_args.max_num_batched_tokens 4096 -> 8192", "engine_args.max_num_seqs 2 -> 8",
        "engine_allocator.expandable_segments (unset) -> true"]
    assert changed_settings(INCUMBENT, record(INCUMBENT)) == []


def test_without_a_better_candidate_the_proposal_says_the_incumbent_stays():
    incumbent = record(INCUMBENT)
    text = proposal(incumbent, incumbent, {"note": "line\nbreaks are folded"})
    assert text.startswith("# tune.yml found no candidate that beats the incumbent")
    assert "# note: line breaks are folded" in text and "# changed" not in text
    assert yaml.safe_load(text) == {**{key: INCUMBENT[key] for key in ("engine_args", "engine_allocator", "engine_env")},
                                    "serving_tune_mappings": []}


def test_the_proposal_is_written_whole(tmp_path):
    path = tmp_path / "tune" / "run" / "proposal.yml"
    write_proposal(path, record(), record(INCUMBENT), {"run": "run"})
    assert path.read_text() == proposal(record(), record(INCUMBENT), {"run": "run"})
    assert os.listdir(path.parent) == ["proposal.yml"]
