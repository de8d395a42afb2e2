"""biv100.serving.serving_rollback on a store laid out as serving_overlay lays it out."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.biv100.serving.plugins.modules import serving_rollback

CHAT = "entrypoints/openai/serving_chat.py"
PROTOCOL = "entrypoints/openai/protocol.py"
PARSER = "reasoning/team_parser.py"  # a file the vendor does not have
VENDOR = {CHAT: b"vendor chat\n", PROTOCOL: b"vendor protocol\n"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Store:
    """A package and its state store; releases are added oldest first, each made current."""

    def __init__(self, root):
        self.package = root / "vllm"
        self.state = root / "state"
        for path, data in VENDOR.items():
            (self.package / path).parent.mkdir(parents=True, exist_ok=True)
            (self.package / path).write_bytes(data)
            (self.state / "base" / path).parent.mkdir(parents=True, exist_ok=True)
            (self.state / "base" / path).write_bytes(data)
        index = {path: sha(data) for path, data in VENDOR.items()}
        index[PARSER] = None
        (self.state / "base" / "index.json").write_text(json.dumps(index))
        self.current = None

    def release(self, name, files, status):
        """Install `files` ({path: bytes}) as release `name`, current from now on; the files an
        earlier release overlaid and this one does not are the vendor's again."""
        for path in (CHAT, PROTOCOL, PARSER):
            if path in VENDOR:
                (self.package / path).write_bytes(VENDOR[path])
            elif (self.package / path).exists():
                (self.package / path).unlink()
        folder = self.state / "releases" / name
        for path, data in files.items():
            (folder / "files" / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / "files" / path).write_bytes(data)
            (self.package / path).parent.mkdir(parents=True, exist_ok=True)
            (self.package / path).write_bytes(data)
        record = {"id": name, "status": status, "previous": self.current,
                  "digests": {path: sha(data) for path, data in files.items()},
                  "engine": {"args": {"max_num_seqs": 2}, "release": name}}
        (folder / "release.json").write_text(json.dumps(record))
        link = self.state / "current"
        if link.is_symlink():
            link.unlink()
        os.symlink(f"releases/{name}", link)
        self.current = name

    def installed(self):
        return {path: (self.package / path).read_bytes() if (self.package / path).exists() else None
                for path in (CHAT, PROTOCOL, PARSER)}

    def status(self, name):
        return json.loads((self.state / "releases" / name / "release.json").read_text())["status"]

    def current_link(self):
        link = self.state / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path)
    store.release("sub100", {CHAT: b"z chat\n"}, "good")
    store.release("sub168", {CHAT: b"a chat\n"}, "good")
    store.release("sub510", {CHAT: b"b chat\n", PROTOCOL: b"b protocol\n", PARSER: b"b parser\n"},
                  "pending")
    return store


@pytest.fixture
def rollback(run_module, store):
    def run(**args):
        return run_module(serving_rollback, dict(
            package_root=str(store.package), state_dir=str(store.state), **args))
    return run


def test_previous_restores_the_last_good_release_byte_for_byte(rollback, store):
    failed, result = rollback(reason="probe n-two failed")

    assert not failed, result
    assert (result["from_release"], result["release"]) == ("sub510", "sub168")
    assert result["changed_files"] == sorted([CHAT, PROTOCOL, PARSER])
    # sub168's own content where it touches a file, the vendor's elsewhere, nothing it lacks.
    assert store.installed() == {CHAT: b"a chat\n", PROTOCOL: b"vendor protocol\n", PARSER: None}
    assert store.current_link() == "sub168" and store.status("sub510") == "rolled_back"
    assert result["engine"] == {"args": {"max_num_seqs": 2}, "release": "sub168"}


def test_rolling_back_twice_goes_one_good_release_further_each_time(rollback, store):
    assert rollback().result["release"] == "sub168"
    second = rollback().result

    assert (second["from_release"], second["release"]) == ("sub168", "sub100")
    assert store.installed()[CHAT] == b"z chat\n" and store.status("sub168") == "rolled_back"
    third = rollback().result  # nothing good before sub100: the vendor's files
    assert third["release"] is None and store.installed() == {**VENDOR, PARSER: None}
    assert store.current_link() is None


def test_base_and_a_named_release(rollback, store):
    assert rollback(to="sub100").result["release"] == "sub100"
    assert store.installed() == {CHAT: b"z chat\n", PROTOCOL: b"vendor protocol\n", PARSER: None}
    base = rollback(to="base").result
    assert base["release"] is None and base["changed_files"] == [CHAT]
    assert store.installed() == {**VENDOR, PARSER: None}


def test_the_release_already_current_changes_nothing(rollback, store):
    store.release("sub520", {CHAT: b"c chat\n"}, "good")
    again = rollback(to="last_good").result
    assert (again["changed"], again["release"], again["changed_files"]) == (False, "sub520", [])


def test_last_good_puts_back_a_hand_edited_file_of_the_current_release(rollback, store):
    store.release("sub520", {CHAT: b"c chat\n"}, "good")
    (store.package / CHAT).write_bytes(b"edited by hand\n")
    repaired = rollback(to="last_good").result
    assert (repaired["changed"], repaired["changed_files"]) == (True, [CHAT])
    assert store.installed()[CHAT] == b"c chat\n" and store.status("sub520") == "good"


def test_check_mode_reports_and_writes_nothing(rollback, store):
    before = store.installed()
    checked = rollback(_ansible_check_mode=True).result
    assert checked["changed"] and checked["release"] == "sub168"
    assert store.installed() == before and store.current_link() == "sub510"


@pytest.mark.parametrize("to, message", [
    ("sub999", "release sub999 has no record"),
    ("sub510", "release sub510 is pending"),
    ("../x", "to must be previous, last_good, base or a release id"),
])
def test_targets_that_cannot_be_rolled_back_to_are_refused(rollback, store, to, message):
    before = store.installed()
    failed, result = rollback(to=to)
    assert failed and message in result["msg"]
    assert store.installed() == before


def test_a_damaged_copy_in_the_store_stops_before_any_file_changes(rollback, store):
    (store.state / "releases" / "sub168" / "files" / CHAT).write_bytes(b"bit rot\n")
    before = store.installed()
    failed, result = rollback()
    assert failed and "missing or damaged" in result["msg"] and CHAT in result["msg"]
    assert store.installed() == before and store.current_link() == "sub510"


ARCH = "Qwen3_5ForConditionalGeneration"


@pytest.mark.parametrize("to, why", [
    ("base", "(asked for)"),
    # Nothing good before the only release: last_good lands on the vendor's files.
    ("last_good", "(no release before sub510 was good)"),
])
def test_base_that_cannot_serve_the_model_is_refused_before_anything_changes(rollback, store, to, why):
    for name in ("sub100", "sub168"):
        record = store.state / "releases" / name / "release.json"
        record.write_text(json.dumps(dict(json.loads(record.read_text()), status="failed")))
    before = store.installed()
    failed, result = rollback(to=to, base_lacks=[ARCH])
    assert failed
    assert f"refusing to roll back to base, the vendor's files {why}" in result["msg"]
    assert ARCH in result["msg"] and "serving_rollback_force=true" in result["msg"]
    assert store.installed() == before and store.current_link() == "sub510"
    assert store.status("sub510") == "pending"


def test_force_rolls_back_to_base_all_the_same(rollback, store):
    assert not rollback(to="base", base_lacks=[ARCH], force=True).failed
    assert store.installed() == {**VENDOR, PARSER: None} and store.current_link() is None


def test_a_good_release_is_rolled_back_to_whatever_the_base_lacks(rollback, store):
    assert rollback(base_lacks=[ARCH]).result["release"] == "sub168"


def test_a_folder_linked_elsewhere_stops_the_rollback_before_any_file_changes(rollback, store):
    reasoning = store.package / "reasoning"
    reasoning.rename(store.package / "elsewhere")
    os.symlink("elsewhere", reasoning)
    before = (store.package / CHAT).read_bytes()
    failed, result = rollback()
    assert failed and "reasoning is a symlink to elsewhere" in result["msg"]
    assert (store.package / CHAT).read_bytes() == before and store.current_link() == "sub510"
    assert (store.package / "elsewhere" / "team_parser.py").read_bytes() == b"b parser\n"


def test_a_restore_that_fails_midway_reports_what_happened(rollback, store, monkeypatch):
    """A full disk while restoring: the failure names the file and the error (fail_json once
    carried msg twice and died with a TypeError instead)."""
    from ansible_collections.biv100.serving.plugins.module_utils import _no_follow

    def disk_full(self, relative, data, mode=None):
        raise OSError(28, "No space left on device", os.path.join(self.root, relative))

    monkeypatch.setattr(_no_follow.Tree, "write", disk_full)
    failed, result = rollback()
    assert failed and "rolling back to sub168" in result["msg"]
    assert "No space left on device" in result["msg"] and str(store.package) in result["msg"]
    assert result["from_release"] == "sub510" and result["changed_files"]


def test_a_host_never_deployed_is_on_base_already_and_is_not_refused(run_module, tmp_path):
    fresh = Store(tmp_path / "fresh")
    (fresh.package / PARSER).parent.mkdir(parents=True, exist_ok=True)
    (fresh.package / PARSER).write_bytes(b"half of a first release\n")  # a first staging that failed
    failed, result = run_module(serving_rollback, dict(
        package_root=str(fresh.package), state_dir=str(fresh.state), to="base", base_lacks=[ARCH]))
    assert not failed, result
    assert fresh.installed() == {**VENDOR, PARSER: None}


def test_a_rollback_for_a_run_that_lost_the_hosts_lock_changes_nothing_and_names_the_holder(rollback, store,
                                                                                            monkeypatch):
    (store.state / "lock").write_text(json.dumps({"run_id": "run-B", "user": "alice", "controller": "ctl2"}))
    monkeypatch.setenv("BIV100_SERVING_RUN", "run-A")
    installed = store.installed()

    failed, result = rollback(reason="probe n-two failed")

    assert failed and result["changed"] is False and result["changed_files"] == []
    assert result["msg"] == (
        "rolling back to sub168 refused, nothing changed on this host: run run-A no longer holds its lock, "
        f"{store.state}/lock is held by run run-B (alice@ctl2)")
    assert store.installed() == installed and store.current_link() == "sub510"
    assert store.status("sub510") == "pending"
