"""serving_overlay's host half: inventory, and installing a release atomically and only once."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys

import pytest

from ansible_collections.biv100.serving.plugins.modules import serving_overlay

CHAT = "entrypoints/openai/serving_chat.py"
NEW_PARSER = "reasoning/mine_parser.py"
VENDOR_CHAT = b"# the vendor's chat serving\n"


def sha(data):
    return hashlib.sha256(data).hexdigest() if data is not None else None


@pytest.fixture
def host(tmp_path):
    package = tmp_path / "site-packages" / "vllm"
    (package / "entrypoints" / "openai").mkdir(parents=True)
    (package / "reasoning").mkdir()
    (package / CHAT).write_bytes(VENDOR_CHAT)
    return {"_package_root": str(package), "state_dir": str(tmp_path / "state")}


@pytest.fixture
def run(run_module):
    def overlay(args, check_mode=False, diff=False):
        failed, result = run_module(serving_overlay, dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff))
        assert failed == bool(result.get("failed")), result
        return result

    return overlay


def release(run, host, name, files, check_mode=False, diff=False, **options):
    items = [
        {"path": path, "sha256": sha(data), **({"content": base64.b64encode(data).decode()} if send else {})}
        for path, (data, send) in files.items()
    ]
    args = dict(host, _state="present", release=name, _files=items, _interpreter=sys.executable,
                record={"payload_digest": "d-" + name}, **options)
    return run(args, check_mode=check_mode, diff=diff)


def installed(host, path):
    full = os.path.join(host["_package_root"], path)
    return open(full, "rb").read() if os.path.exists(full) else None


def state(host, *parts):
    return os.path.join(host["state_dir"], *parts)


def test_a_first_release_keeps_the_vendor_copy_and_switches_current(host, run):
    result = release(run, host, "sub510", {CHAT: (b"# ours\n", True), NEW_PARSER: (b"X = 1\n", True)})
    assert result["changed"] and result["changed_files"] == [CHAT, NEW_PARSER]
    assert installed(host, CHAT) == b"# ours\n" and installed(host, NEW_PARSER) == b"X = 1\n"
    assert open(state(host, "base", CHAT), "rb").read() == VENDOR_CHAT
    index = json.load(open(state(host, "base", "index.json")))
    assert index == {CHAT: sha(VENDOR_CHAT), NEW_PARSER: None}
    assert os.readlink(state(host, "current")) == "releases/sub510"
    record = json.load(open(state(host, "releases", "sub510", "release.json")))
    assert record["status"] == "pending" and record["previous"] is None
    assert record["files"][CHAT] == {"before": sha(VENDOR_CHAT), "after": sha(b"# ours\n")}
    assert record["payload_digest"] == "d-sub510"
    assert open(state(host, "releases", "sub510", "files", CHAT), "rb").read() == b"# ours\n"


def test_the_same_release_again_changes_nothing(host, run):
    release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    again = release(run, host, "sub510", {CHAT: (b"# ours\n", False)})
    assert again["changed"] is False and again["changed_files"] == []


def test_check_mode_reports_and_diffs_but_writes_nothing(host, run):
    result = release(run, host, "sub510", {CHAT: (b"# ours\n", True)}, check_mode=True, diff=True)
    assert result["changed"] and result["changed_files"] == [CHAT]
    assert "# the vendor's chat serving" in result["diff"]["before"] and "# ours" in result["diff"]["after"]
    assert installed(host, CHAT) == VENDOR_CHAT
    assert not os.path.exists(host["state_dir"])


def test_a_file_that_does_not_compile_is_refused_before_anything_is_written(host, run):
    result = release(run, host, "sub510", {CHAT: (b"# fine\n", True), NEW_PARSER: (b"def broken(:\n", True)})
    assert result["failed"]
    assert f"{NEW_PARSER} line 1" in result["msg"] and sys.executable in result["msg"]
    assert installed(host, CHAT) == VENDOR_CHAT and installed(host, NEW_PARSER) is None
    assert not os.path.exists(host["state_dir"])


def test_a_later_release_restores_what_the_payload_no_longer_touches(host, run):
    release(run, host, "sub510", {CHAT: (b"# ours\n", True), NEW_PARSER: (b"X = 1\n", True)})
    # The controller sends no content: the vendor's file comes from its kept copy, and the
    # file the vendor never had goes away.
    result = release(run, host, "sub511", {CHAT: (VENDOR_CHAT, False), NEW_PARSER: (None, False)})
    assert result["changed_files"] == [CHAT, NEW_PARSER]
    assert installed(host, CHAT) == VENDOR_CHAT and installed(host, NEW_PARSER) is None
    record = json.load(open(state(host, "releases", "sub511", "release.json")))
    assert record["previous"] == "sub510" and record["digests"][NEW_PARSER] is None


def test_the_kept_vendor_copy_is_never_replaced(host, run):
    release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    release(run, host, "sub511", {CHAT: (b"# ours, again\n", True)})
    assert open(state(host, "base", CHAT), "rb").read() == VENDOR_CHAT


def test_content_damaged_in_transit_is_refused(host, run):
    item = {"path": CHAT, "sha256": sha(b"# ours\n"), "content": base64.b64encode(b"# 0urs\n").decode()}
    result = run(dict(host, _state="present", release="sub510", _files=[item], _interpreter=sys.executable))
    assert result["failed"] and "arrived damaged" in result["msg"]
    assert installed(host, CHAT) == VENDOR_CHAT


def test_a_release_id_is_never_reused_for_other_content(host, run):
    release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    result = release(run, host, "sub510", {CHAT: (b"# other\n", True)})
    assert result["failed"] and "release sub510 already exists on this host with other content" in result["msg"]
    assert installed(host, CHAT) == b"# ours\n"


def test_content_the_host_lacks_and_nobody_sent_is_an_error(host, run):
    result = release(run, host, "sub510", {CHAT: (b"# ours\n", False)})
    assert result["failed"] and f"{CHAT}: the host has no content with sha256" in result["msg"]


def test_inventory_reports_digests_and_pristine_content(host, run):
    release(run, host, "sub510", {CHAT: (b"# ours\n", True), NEW_PARSER: (b"X = 1\n", True)})
    result = run(dict(host, _state="inventory", _paths=[CHAT], _pristine_content=[CHAT]))
    assert result["changed"] is False
    assert result["overlaid"] == [CHAT, NEW_PARSER]
    chat = result["files"][CHAT]
    assert chat["current"] == sha(b"# ours\n") and chat["pristine"] == sha(VENDOR_CHAT)
    assert base64.b64decode(chat["pristine_content"]) == VENDOR_CHAT
    assert result["files"][NEW_PARSER] == {"current": sha(b"X = 1\n"), "pristine": None}
    assert result["current_release"]["id"] == "sub510"
    assert result["current_release"]["record"]["payload_digest"] == "d-sub510"


MODEL_FILE = "model_executor/models/llama.py"
THROUGH_LINK = "entrypoints/openai/linked/llama.py"


@pytest.fixture
def linked_host(host):
    """A host whose own tree links a serving-layer folder into the model layer."""
    models = os.path.join(host["_package_root"], "model_executor", "models")
    os.makedirs(models)
    with open(os.path.join(models, "llama.py"), "wb") as stream:
        stream.write(b"# the vendor's model\n")
    os.symlink("../../model_executor/models", os.path.join(host["_package_root"], "entrypoints", "openai", "linked"))
    return host


def test_inventory_reports_a_destination_through_a_link_instead_of_reading_it(linked_host, run):
    result = run(dict(linked_host, _state="inventory", _paths=[CHAT, THROUGH_LINK], _pristine_content=[]))
    assert set(result["files"]) == {CHAT}
    assert result["unsafe"] == {
        THROUGH_LINK: f"{THROUGH_LINK}: entrypoints/openai/linked is a symlink to ../../model_executor/models"
    }


@pytest.mark.parametrize("path", [THROUGH_LINK, "entrypoints/openai/linked/new_module.py"])
def test_a_release_through_a_link_is_refused_whole_and_nothing_is_recorded(linked_host, run, path):
    result = release(run, linked_host, "sub510", {CHAT: (b"# ours\n", True), path: (b"X = 1\n", True)})
    assert result["failed"] and "entrypoints/openai/linked is a symlink" in result["msg"]
    assert sorted(os.listdir(os.path.join(linked_host["_package_root"], "model_executor", "models"))) == ["llama.py"]
    assert installed(linked_host, MODEL_FILE) == b"# the vendor's model\n"
    assert installed(linked_host, CHAT) == VENDOR_CHAT
    # The pristine-copy index never learns the model file under a serving-layer name.
    assert not os.path.exists(state(linked_host, "base"))


def test_a_file_an_earlier_release_overlaid_is_not_removed_through_a_link_that_appeared_since(host, run):
    release(run, host, "sub510", {NEW_PARSER: (b"X = 1\n", True)})
    reasoning = os.path.join(host["_package_root"], "reasoning")
    os.rename(reasoning, reasoning + ".moved")
    os.symlink("reasoning.moved", reasoning)
    result = release(run, host, "sub511", {NEW_PARSER: (None, False)})
    assert result["failed"] and "reasoning is a symlink to reasoning.moved" in result["msg"]
    assert os.path.exists(os.path.join(reasoning + ".moved", "mine_parser.py"))


def planned_on(host, *paths):
    """What a plan records of the host for `paths`: installed and pristine digests."""
    return {path: {"current": sha(installed(host, path)), "pristine": sha(VENDOR_CHAT) if path == CHAT else None}
            for path in paths}


def test_a_plan_is_installed_when_nothing_it_was_based_on_moved(host, run):
    result = release(run, host, "sub510", {CHAT: (b"# ours\n", True)},
                     _expect=planned_on(host, CHAT), _expect_current=None)
    assert result["changed"] and installed(host, CHAT) == b"# ours\n"


def test_a_plan_made_on_another_host_state_writes_nothing_and_says_what_moved(host, run):
    expect = planned_on(host, CHAT)
    with open(os.path.join(host["_package_root"], CHAT), "wb") as stream:
        stream.write(b"# edited after the plan\n")
    result = release(run, host, "sub510", {CHAT: (b"# ours\n", True)}, _expect=expect, _expect_current=None)
    assert result["failed"] and "the host changed since this run planned its release" in result["msg"]
    assert f"{CHAT} current sha256 {sha(b'# edited after the plan' + bytes([10]))[:12]}" in result["msg"]
    assert installed(host, CHAT) == b"# edited after the plan\n" and not os.path.exists(host["state_dir"])


def test_verify_checks_the_plan_of_a_run_that_changes_nothing(host, run):
    release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    args = dict(host, _state="verify", _expect=planned_on(host, CHAT))
    assert run(dict(args, _expect_current="sub510"))["changed"] is False
    moved = run(dict(args, _expect_current="sub509"))
    assert moved["failed"] and "current release sub510, planned on sub509" in moved["msg"]


def test_files_the_plan_compiled_are_not_compiled_again(host, run):
    broken = b"def broken(:\n"  # would not compile: proves the module took the plan's word
    result = release(run, host, "sub510", {NEW_PARSER: (broken, True)}, _compiled=[sha(broken)], check_mode=True)
    assert not result.get("failed") and result["changed_files"] == [NEW_PARSER]


def test_the_host_half_without_its_action_says_so(host, run):
    # What a task gives is for the action; only the action's _-prefixed options drive the module.
    result = run({"state_dir": host["state_dir"], "release": "sub510", "payload_dir": "files/serving"})
    assert result["failed"] and "runs through its action plugin" in result["msg"]
    assert not os.path.exists(host["state_dir"])


def hold(host, run_id, **holder):
    os.makedirs(host["state_dir"], exist_ok=True)
    with open(state(host, "lock"), "w") as lock:
        json.dump(dict(run_id=run_id, **holder), lock)


def test_staging_for_a_run_that_lost_the_hosts_lock_changes_nothing_and_names_the_holder(host, run, monkeypatch):
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-A")
    hold(host, "run-A")
    release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    # Run B took the host over between run A's check and its next stage.
    hold(host, "run-B", user="alice", controller="ctl2", playbook="deploy.yml")

    refused = release(run, host, "sub511", {CHAT: (b"# newer\n", True), NEW_PARSER: (b"X = 1\n", True)})

    assert refused["failed"] and refused["changed_files"] == []
    assert refused["msg"] == (
        "staging sub511 refused, nothing changed on this host: run run-A no longer holds its lock, "
        f"{state(host, 'lock')} is held by run run-B (alice@ctl2, playbook deploy.yml)")
    assert installed(host, CHAT) == b"# ours\n" and installed(host, NEW_PARSER) is None
    assert os.readlink(state(host, "current")) == "releases/sub510"
    assert not os.path.exists(state(host, "releases", "sub511"))


def test_staging_for_a_run_on_a_host_whose_lock_is_free_is_refused(host, run, monkeypatch):
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-A")
    refused = release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    assert refused["failed"] and "run run-A holds no lock here" in refused["msg"]
    hold(host, "run-B")
    os.unlink(state(host, "lock"))
    refused = release(run, host, "sub510", {CHAT: (b"# ours\n", True)})
    assert refused["msg"].endswith(f"{state(host, 'lock')} is free") and installed(host, CHAT) == VENDOR_CHAT
