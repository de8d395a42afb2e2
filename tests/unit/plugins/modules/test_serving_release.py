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
    marked = release(status="good", reason="49/49 probes passed").result
    again = release(status="good").result

    assert (marked["changed"], marked["release"], marked["previous_status"], marked["status"]) == (
        True, "sub510", "pending", "good")
    record = json.loads(store["record"].read_text())
    assert record["status"] == "good"
    assert record["history"][-1]["reason"] == "49/49 probes passed"
    assert (again["changed"], again["status"]) == (False, "good")


def test_check_mode_reports_and_records_nothing(release, store):
    checked = release(status="failed", _ansible_check_mode=True).result
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
    failed, result = run_module(serving_release, dict(args, status="good"))
    assert failed and "no release" in result["msg"]


def test_a_check_run_may_mark_the_release_it_would_stage(release, store):
    checked = release(release="sub511", status="good", _ansible_check_mode=True).result
    assert (checked["changed"], checked["release"], checked["status"]) == (True, "sub511", "good")
    failed, result = release(release="sub511", status="good")
    assert failed and "release sub511 has no record" in result["msg"]


def test_marking_good_with_keep_good_prunes_what_is_not_needed(release, store):
    old = store["state"] / "releases" / "sub100"
    old.mkdir()
    (old / "release.json").write_text(json.dumps({"id": "sub100", "status": "good",
                                                  "created_at": "2026-01-01T00:00:00Z"}))
    marked = release(status="good", keep_good=1).result
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
