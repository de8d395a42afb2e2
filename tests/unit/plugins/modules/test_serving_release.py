"""biv100.serving.serving_release on a state store written as serving_overlay writes it."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.biv100.serving.plugins.modules import serving_release

SERVING_CHAT = "entrypoints/openai/serving_chat.py"
DROPPED = "entrypoints/openai/extra.py"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def store(tmp_path):
    """A package with the release's serving_chat.py installed and the dropped file absent, and
    the store naming release sub510 current."""
    package = tmp_path / "vllm"
    (package / "entrypoints" / "openai").mkdir(parents=True)
    (package / SERVING_CHAT).write_bytes(b"release content\n")
    state = tmp_path / "state"
    record_dir = state / "releases" / "sub510"
    record_dir.mkdir(parents=True)
    (record_dir / "release.json").write_text(json.dumps({
        "id": "sub510", "status": "pending", "created_at": "2026-11-29T00:00:00Z",
        "digests": {SERVING_CHAT: sha256(b"release content\n"), DROPPED: None}}))
    os.symlink("releases/sub510", state / "current")
    return {"package": package, "state": state, "record": record_dir / "release.json"}


@pytest.fixture
def release(run_module, store):
    def run(**args):
        return run_module(serving_release, dict(
            package_root=str(store["package"]), state_dir=str(store["state"]), **args))
    return run


def test_marking_the_current_release_good_records_it_once(release, store):
    marked = release(state="good", reason="49/49 probes passed").result
    again = release(state="good").result

    assert (marked["changed"], marked["release"], marked["previous_status"], marked["status"]) == (
        True, "sub510", "pending", "good")
    record = json.loads(store["record"].read_text())
    assert record["status"] == "good"
    assert record["history"][-1]["reason"] == "49/49 probes passed"
    assert (again["changed"], again["status"]) == (False, "good")


def test_check_mode_reports_and_records_nothing(release, store):
    checked = release(state="failed", reason="probe n-two failed", _ansible_check_mode=True).result
    assert checked["changed"] and checked["status"] == "failed"
    assert json.loads(store["record"].read_text())["status"] == "pending"


def test_installed_files_are_checked_against_the_release(release, store):
    assert release().result["drift"] == []
    (store["package"] / SERVING_CHAT).write_bytes(b"edited by hand\n")
    (store["package"] / DROPPED).write_bytes(b"back again\n")

    drift = release().result["drift"]

    assert drift == [
        f"{DROPPED}: installed {sha256(b'back again' + bytes([10]))[:12]}..., release absent",
        f"{SERVING_CHAT}: installed {sha256(b'edited by hand' + bytes([10]))[:12]}..., "
        f"release {sha256(b'release content' + bytes([10]))[:12]}...",
    ]


def test_a_host_without_releases_has_nothing_to_mark(run_module, tmp_path):
    args = dict(package_root=str(tmp_path), state_dir=str(tmp_path / "state"))
    assert run_module(serving_release, args).result["release"] is None
    failed, result = run_module(serving_release, dict(args, state="good"))
    assert failed and "no release" in result["msg"]


def test_a_check_run_may_mark_the_release_it_would_stage(release, store):
    checked = release(release="sub511", state="good", _ansible_check_mode=True).result
    assert (checked["changed"], checked["release"], checked["status"]) == (True, "sub511", "good")
    failed, result = release(release="sub511", state="good")
    assert failed and "release sub511 has no record" in result["msg"]


def test_marking_good_with_keep_good_prunes_what_is_not_needed(release, store):
    old = store["state"] / "releases" / "sub100"
    old.mkdir()
    (old / "release.json").write_text(json.dumps({"id": "sub100", "status": "good",
                                                  "created_at": "2026-01-01T00:00:00Z"}))
    marked = release(state="good", keep_good=1).result
    assert marked["removed"] == ["sub100"] and not old.exists()
    assert (store["state"] / "releases" / "sub510").is_dir()


def test_a_release_file_reached_through_a_link_is_drift_even_with_the_same_content(release, store):
    openai = store["package"] / "entrypoints" / "openai"
    openai.rename(store["package"] / "elsewhere")  # the same bytes, behind a link now
    os.symlink("../elsewhere", openai)
    assert release().result["drift"] == [
        f"{DROPPED}: entrypoints/openai is a symlink to ../elsewhere",
        f"{SERVING_CHAT}: entrypoints/openai is a symlink to ../elsewhere",
    ]


GATES = {"instances": {"vllm": {"bench": {"score": 8437.1, "simulated": True},
                                "quality": {"score": 0.969, "passed": True}}}}


def good_predecessor(store, release="sub509", gates=None):
    """An earlier release, marked good with `gates`, that sub510's record names as previous."""
    folder = store["state"] / "releases" / release
    folder.mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps({
        "id": release, "status": "good", "digests": {}, "gates": gates,
        "history": [{"status": "good", "at": "2026-11-28T00:00:00Z", "reason": ""}]}))
    record = json.loads(store["record"].read_text())
    record["previous"] = release
    store["record"].write_text(json.dumps(record))


def test_the_gates_figures_are_recorded_with_the_verdict_and_the_first_quality_score_becomes_the_baseline(
        release, store):
    before = release().result
    assert (before["gates"], before["last_good"], before["quality_baseline"]) == (None, None, None)

    marked = release(state="good", gates=GATES).result
    again = release(state="good", gates=GATES).result

    assert marked["changed"] and not again["changed"]
    assert json.loads(store["record"].read_text())["gates"] == GATES
    assert marked["quality_baseline"] == {"release": "sub510", "score": 0.969}
    assert json.loads((store["state"] / "baseline" / "quality.json").read_text()) == {
        "release": "sub510", "score": 0.969}


def test_a_later_good_release_does_not_move_the_baseline(release, store):
    baseline = store["state"] / "baseline" / "quality.json"
    baseline.parent.mkdir()
    baseline.write_text(json.dumps({"release": "sub168", "score": 0.9}))

    marked = release(state="good", gates=GATES).result

    assert marked["quality_baseline"] == {"release": "sub168", "score": 0.9}
    assert json.loads(baseline.read_text()) == {"release": "sub168", "score": 0.9}


def test_the_last_good_release_before_this_one_is_reported_with_its_figures(release, store):
    good_predecessor(store, gates=GATES)

    read = release().result

    assert not read["changed"] and read["last_good"] == {"release": "sub509", "gates": GATES}


def test_a_named_quality_baseline_is_that_releases_own_score_or_a_clear_error(release, store):
    good_predecessor(store, gates=GATES)
    assert release(quality_baseline="sub509").result["quality_baseline"] == {"release": "sub509", "score": 0.969}

    missing = release(quality_baseline="sub100")
    assert missing.failed and "quality_baseline sub100" in missing.result["msg"]


def with_release_files(store, registry_pristine=b"vendor registry\n"):
    """The release's own copy of serving_chat.py, the vendor's protocol.py installed, and a kept
    pristine registry.py whose installed file the release changed."""
    staged = store["state"] / "releases" / "sub510" / "files" / SERVING_CHAT
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"release content\n")
    (store["package"] / "entrypoints" / "openai" / "protocol.py").write_bytes(b"vendor protocol\n")
    registry = store["package"] / "model_executor" / "models" / "registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_bytes(b"patched registry\n")
    base = store["state"] / "base"
    base.mkdir()
    (base / "index.json").write_text(json.dumps({"model_executor/models/registry.py": sha256(registry_pristine)}))


def test_export_returns_the_record_the_installed_bytes_and_the_vendors_digests(release, store):
    with_release_files(store)
    (store["package"] / "entrypoints" / "openai" / "__pycache__").mkdir()
    (store["package"] / "entrypoints" / "openai" / "__pycache__" / "protocol.cpython-311.pyc").write_bytes(b"x")

    exported = release(release="sub510", state="exported").result

    assert (exported["changed"], exported["status"]) == (False, "pending")
    assert exported["record"]["digests"] == {SERVING_CHAT: sha256(b"release content\n"), DROPPED: None}
    assert exported["contents"] == {SERVING_CHAT: "cmVsZWFzZSBjb250ZW50Cg=="}
    # The kept pristine copy stands for the vendor's file where the collection overlaid it; a
    # byte-code cache is no file of the vendor's.
    assert exported["vendor"] == {
        DROPPED: None,
        "entrypoints/openai/protocol.py": sha256(b"vendor protocol\n"),
        SERVING_CHAT: sha256(b"release content\n"),
        "model_executor/models/registry.py": sha256(b"vendor registry\n"),
    }
    assert exported["unsafe"] == {}


def test_export_of_a_release_the_host_lacks_says_so_without_failing(release, store):
    exported = release(release="sub999", state="exported").result
    assert (exported.get("failed"), exported["status"], exported["record"]) == (None, None, None)


def test_export_names_a_serving_file_reached_through_a_link_and_leaves_it_out(release, store, tmp_path):
    with_release_files(store)
    (tmp_path / "elsewhere.py").write_bytes(b"not the vendor's\n")
    os.symlink(tmp_path / "elsewhere.py", store["package"] / "entrypoints" / "openai" / "linked.py")

    exported = release(release="sub510", state="exported").result

    assert "entrypoints/openai/linked.py" not in exported["vendor"]
    assert "symlink" in exported["unsafe"]["entrypoints/openai/linked.py"]


def test_export_fails_naming_a_file_missing_from_the_release(release, store):
    with_release_files(store)
    (store["state"] / "releases" / "sub510" / "files" / SERVING_CHAT).unlink()
    failed = release(release="sub510", state="exported").result
    assert failed["failed"] and SERVING_CHAT in failed["msg"] and "missing from the release" in failed["msg"]


# --- each state takes its own options ---------------------------------------------------------


@pytest.mark.parametrize("state, options, message", [
    ("query", {"reason": "probes passed"}, "reason belongs to state=good or failed or platform, not state=query"),
    ("query", {"gates": GATES}, "gates belongs to state=good or failed, not state=query"),
    ("query", {"keep_good": 5}, "keep_good belongs to state=good, not state=query"),
    ("failed", {"reason": "probe n-two failed", "quality_baseline": "sub168"},
     "quality_baseline belongs to state=query or good, not state=failed"),
    ("failed", {"reason": "probe n-two failed", "keep_good": 5, "keep_failed_days": 7},
     "keep_failed_days belongs to state=good, not state=failed; keep_good belongs to state=good, not state=failed"),
    ("exported", {"release": "sub510", "engine": {"args": {}}},
     "engine belongs to state=good or failed, not state=exported"),
    ("exported", {"release": "sub510", "quality_baseline": "first_good"},
     "quality_baseline belongs to state=query or good, not state=exported"),
])
def test_an_option_of_another_state_is_refused_naming_it_and_its_states(release, store, state, options, message):
    before = store["record"].read_bytes()

    failed, result = release(state=state, **options)

    assert failed and result["msg"] == message
    assert store["record"].read_bytes() == before


@pytest.mark.parametrize("state, missing", [("failed", "reason"), ("exported", "release")])
def test_a_state_refuses_to_run_without_the_option_it_requires(release, store, state, missing):
    failed, result = release(state=state)
    # ansible-core's required_if words the message; it names the state and the option.
    assert failed and f"state is {state}" in result["msg"] and result["msg"].endswith(f": {missing}")


@pytest.mark.parametrize("options, message", [
    ({"keep_failed_days": 7}, "keep_failed_days is given without keep_good"),
    ({"keep_good": 0}, "keep_good must be at least 1, got 0"),
    ({"quality_baseline": "sub100", "gates": GATES}, "quality_baseline sub100"),
])
def test_a_good_verdict_with_options_it_cannot_honour_is_refused_before_the_record_changes(
        release, store, options, message):
    failed, result = release(state="good", **options)
    assert failed and message in result["msg"]
    assert json.loads(store["record"].read_text())["status"] == "pending"
    assert not (store["state"] / "baseline" / "quality.json").exists()


def test_query_is_the_default_and_reads_only(release, store):
    before = store["record"].read_bytes()

    default, query = release().result, release(state="query").result

    assert default == query
    assert (query["changed"], query["release"], query["status"]) == (False, "sub510", "pending")
    assert "previous_status" not in query and "removed" not in query
    assert "diff" not in release(_ansible_diff=True).result
    assert store["record"].read_bytes() == before


def test_every_option_of_the_good_state_is_recorded_or_used(release, store):
    engine = {"instances": {"vllm": {"args": {"tensor_parallel_size": 4}}}}

    marked = release(state="good", reason="75/75 probes passed", engine=engine, gates=GATES,
                     quality_baseline="first_good", keep_good=5, keep_failed_days=7, _ansible_diff=True).result

    record = json.loads(store["record"].read_text())
    assert (record["status"], record["engine"], record["gates"]) == ("good", engine, GATES)
    assert (marked["changed"], marked["removed"], marked["quality_baseline"]) == (
        True, [], {"release": "sub510", "score": 0.969})
    assert marked["diff"] == {"before": {"status": "pending"}, "after": {"status": "good"}}


def test_a_failed_release_keeps_its_reason_engine_and_figures_and_never_becomes_the_baseline(release, store):
    engine = {"instances": {"vllm": {"args": {"tensor_parallel_size": 4}}}}

    failed = release(state="failed", reason="lab-h1: the gates phase failed", engine=engine, gates=GATES).result

    record = json.loads(store["record"].read_text())
    assert (failed.get("failed"), failed["changed"], failed["previous_status"], failed["status"]) == (
        None, True, "pending", "failed")
    assert (record["status"], record["engine"], record["gates"]) == ("failed", engine, GATES)
    assert record["history"][-1]["reason"] == "lab-h1: the gates phase failed"
    assert failed["quality_baseline"] is None and "removed" not in failed
    assert not (store["state"] / "baseline" / "quality.json").exists()


def test_the_quality_score_is_that_of_the_first_instance_by_name_that_has_one():
    quality = {"quality": {"score": 0.9}}
    # A record that names no instance holds none (the 0.1 collection never wrote another shape).
    assert serving_release.quality_score({"gates": quality}) is None
    assert serving_release.quality_score({"gates": {"instances": {"vllm-2": quality, "vllm-1": {"quality": None}}}}) == 0.9
    assert serving_release.quality_score({"gates": {"instances": {"vllm": {"bench": {}}}}}) is None
    assert serving_release.quality_score({}) is None


# --- what the release changed, and what the platform said -----------------------------------------


def write_record(store, release_id, **record):
    folder = store["state"] / "releases" / release_id
    folder.mkdir(parents=True)
    (folder / "release.json").write_text(json.dumps(dict(id=release_id, **record)))


def test_a_verdict_records_what_the_release_changed_against_the_last_good_one(release, store):
    chat = {"entry": "chat", "source": "fast path", "place": "serving_chat.py", "change": "overlay",
            "proven_by": [], "paths": [SERVING_CHAT]}
    write_record(store, "sub509", status="good", digests={SERVING_CHAT: "older"}, mappings=[chat], entries=["chat"],
                 engine={"instances": {"vllm": {"args": {"max_num_seqs": 2}, "allocator": {}, "env": {}}}})
    record = json.loads(store["record"].read_text())
    store["record"].write_text(json.dumps(dict(record, previous="sub509", mappings=[chat], entries=["chat"])))
    engine = {"instances": {"vllm": {"args": {"max_num_seqs": 4}, "allocator": {}, "env": {}}}}
    mappings = [{"settings": ["engine_args.max_num_seqs"], "source": "tune.yml", "proven_by": ["n-two"]}]

    marked = release(state="good", engine=engine, mappings=mappings).result
    again = release(state="good", engine=engine, mappings=mappings).result

    # The dropped file is absent in both releases (and the vendor never had it): no change.
    assert [(row["kind"], row["source"], row["what"]) for row in marked["changes"]] == [
        ("file", "fast path", SERVING_CHAT),
        ("setting", "tune.yml", "max_num_seqs 2 -> 4"),
    ]
    assert json.loads(store["record"].read_text())["changes"] == marked["changes"]
    assert (again["changed"], again["changes"]) == (False, marked["changes"])
    assert release().result["changes"] == marked["changes"]


def test_the_platforms_verdict_is_kept_beside_the_teams_once_each_time_it_changes(release, store):
    release(state="good")

    failed = release(state="platform", verdict="failed", reason="n=3 cascaded into OOM", _ansible_diff=True).result
    again = release(state="platform", verdict="failed", reason="n=3 cascaded into OOM").result
    passed = release(state="platform", verdict="passed", figures={"score": 8437}).result

    assert (failed["changed"], failed["status"], failed["platform"][0]["verdict"]) == (True, "good", "failed")
    assert failed["diff"]["after"]["platform"]["reason"] == "n=3 cascaded into OOM"
    assert (again["changed"], len(again["platform"])) == (False, 1)
    assert [said["verdict"] for said in passed["platform"]] == ["passed", "failed"]
    assert passed["platform"][0]["figures"] == {"score": 8437}
    assert json.loads(store["record"].read_text())["status"] == "good"


def test_a_platform_verdict_for_a_release_the_host_lacks_or_a_failure_without_a_reason(release, store):
    before = store["record"].read_bytes()

    absent = release(state="platform", release="sub999", verdict="passed").result
    failed, unexplained = release(state="platform", verdict="failed")

    assert (absent["changed"], absent["status"]) == (False, None)
    assert failed and unexplained["msg"].startswith("verdict=failed needs a reason")
    assert store["record"].read_bytes() == before


# --- the vendor's base as the quality baseline -----------------------------------------------------


def test_the_bases_quality_score_is_recorded_once_and_is_the_baseline_base_names(release, store):
    scored = {"score": 0.95, "cases": 20, "correct": 19, "simulated": True, "msg": "0.950"}

    first = release(state="baseline", quality=scored, _ansible_diff=True).result
    again = release(state="baseline", quality=dict(scored, score=0.5)).result
    marked = release(state="good", gates=GATES, quality_baseline="base").result

    kept = json.loads((store["state"] / "baseline" / "quality-base.json").read_text())
    assert {key: kept[key] for key in ("release", "score", "cases", "correct", "simulated")} == {
        "release": "base", "score": 0.95, "cases": 20, "correct": 19, "simulated": True}
    assert first["changed"] and first["diff"]["after"]["quality_baseline"] == kept
    assert (again["changed"], again["quality_baseline"]) == (False, kept)
    # The base's score stands: the first good release does not become the baseline.
    assert marked["quality_baseline"] == {"release": "base", "score": 0.95}
    assert release(quality_baseline="base").result["quality_baseline"] == {"release": "base", "score": 0.95}
    assert not (store["state"] / "baseline" / "quality.json").exists()


def test_a_host_whose_base_was_never_scored_is_held_to_its_first_good_release(release, store):
    marked = release(state="good", gates=GATES, quality_baseline="base").result

    assert marked["quality_baseline"] == {"release": "sub510", "score": 0.969}
    assert release(quality_baseline="base").result["quality_baseline"] == {"release": "sub510", "score": 0.969}


def test_a_base_score_without_a_score_is_refused_and_check_mode_records_nothing(release, store):
    failed, result = release(state="baseline", quality={"msg": "no answer"})
    checked = release(state="baseline", quality={"score": 0.9}, _ansible_check_mode=True).result

    assert failed and result["msg"].startswith("quality has no score")
    assert checked["changed"] and not (store["state"] / "baseline" / "quality-base.json").exists()


def test_a_verdict_for_a_run_that_lost_the_hosts_lock_records_nothing_and_names_the_holder(release, store,
                                                                                           monkeypatch):
    (store["state"] / "lock").write_text(json.dumps({"run_id": "run-B", "user": "alice", "controller": "ctl2"}))
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-A")
    before = store["record"].read_text()

    refused = release(state="good", reason="49/49 probes passed")

    assert refused.failed and refused.result["msg"] == (
        "marking the current release good refused, nothing changed on this host: run run-A no longer holds its lock, "
        f"{store['state']}/lock is held by run run-B (alice@ctl2)")
    assert store["record"].read_text() == before
    # The run that holds it records the verdict.
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-B")
    assert release(state="good", reason="49/49 probes passed").result["status"] == "good"
