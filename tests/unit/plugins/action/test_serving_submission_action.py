"""biv100.serving.serving_submission through ActionModule.run(): the bundle written to
<dest>/<release>/ and <dest>/<release>.tar.gz, only what differs, never through a link; a second
run touches nothing; an earlier build's leftovers go; check mode writes nothing."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from ansible_collections.biv100.serving.plugins.action import serving_submission as submission_action

CHAT = "entrypoints/openai/serving_chat.py"
PARSER = "reasoning/qwen3_5_reasoning_parser.py"
RUN = "env:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\nparameters:\n  model: /opt/models/qwen3_5\n"
VENDOR_CHAT = {"h1": b"# vendor chat, 0.10\n", "h2": b"# vendor chat, 0.10\n", "h3": b"# vendor chat, 0.11\n"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def host(name, installed=None, status="good", run=RUN):
    """A host's entry: its name, interpreter and export of sub510."""
    installed = installed or {CHAT: b"# chat with n=2\n", PARSER: b"# parser\n"}
    vendor = {CHAT: sha(VENDOR_CHAT.get(name, VENDOR_CHAT["h1"])), PARSER: None}
    record = {"id": "sub510", "status": status, "created_at": "2026-12-01T10:00:00Z",
              "digests": {path: sha(data) for path, data in installed.items()},
              "engine": {"instances": {"vllm": {"platform_run": run}}}, "vllm_version": "0.10.1.1",
              "mappings": [{"source": "n>1 choices", "place": CHAT, "change": "file", "entry": "serving-chat"}],
              "gates": {"instances": {"vllm": {
                  "bench": {"score": 8437.1, "output_tps": 9755.5, "gate": {"score": 8000, "passed": True},
                            "simulated": True},
                  "quality": None}}},
              "history": [{"status": status, "at": "2026-12-01T10:20:00Z", "reason": "75/75 probes passed"}]}
    return {"name": name, "interpreter": "/usr/local/corex/bin/python3",
            "export": {"release": "sub510", "status": status, "record": record,
                       "contents": {path: base64.b64encode(data).decode() for path, data in installed.items()},
                       "vendor": vendor}}


def fleet():
    return [host("h1"), host("h2"), host("h3"), host("h4", run=RUN.replace("qwen3_5", "qwen3_moe"))]


def run_action(args: dict, check_mode=False, diff=False):
    task = SimpleNamespace(args=dict(args), check_mode=check_mode, diff=diff, async_val=0,
                           action="biv100.serving.serving_submission")
    action = submission_action.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None,
                                            DataLoader(), Templar(loader=DataLoader(), variables={}), None)
    return action.run(task_vars={})


def snapshot(dest: Path) -> dict[str, tuple]:
    """Every entry under dest: kind, mode, mtime (ns), and the bytes of files."""
    found = {}
    for path in sorted(dest.rglob("*")):
        info = path.lstat()
        found[str(path.relative_to(dest))] = (
            "folder" if path.is_dir() else "file", oct(info.st_mode & 0o7777), info.st_mtime_ns,
            path.read_bytes() if path.is_file() else None)
    return found


def test_the_bundle_and_its_archive_are_written_and_a_second_run_touches_nothing(tmp_path):
    dest = tmp_path / "submissions"
    first = run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    written = snapshot(dest)
    second = run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})

    folder = dest / "sub510"
    assert first["changed"] and first["bundle"] == str(folder) and first["archive"] == str(dest / "sub510.tar.gz")
    assert first["archive_sha256"] == sha((dest / "sub510.tar.gz").read_bytes())
    assert first["reference"] == "h1"
    files = sorted(str(path.relative_to(dest)) for path in dest.rglob("*") if path.is_file())
    assert first["written"] == sorted(files, key=str.encode)
    assert [variant["id"] for variant in first["variants"]] == sorted(variant["id"] for variant in first["variants"])
    assert {tuple(variant["hosts"]): (variant["installed"], variant["kept"]) for variant in first["variants"]} == {
        ("h1", "h2"): ([CHAT, PARSER], []), ("h3",): ([CHAT, PARSER], [])}
    assert {variant["vllm_version"] for variant in first["variants"]} == {"0.10.1.1"}
    assert first["left_out"] == [{"host": "h4", "reason": "runs another engine: model: /opt/models/qwen3_moe "
                                                          "(line 4 of its computility-run.yaml, where h1's has "
                                                          "model: /opt/models/qwen3_5)"}]
    assert first["warnings"] == [f"h4 is left out of submission sub510: {first['left_out'][0]['reason']}"]
    assert oct((folder / "patch_ops.sh").stat().st_mode & 0o777) == "0o755"
    assert oct((folder / "README.md").stat().st_mode & 0o777) == "0o644"
    # The folder checks itself, as the platform will.
    assert subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=folder, check=False).returncode == 0

    assert not second["changed"] and second["written"] == []
    assert second["archive_sha256"] == first["archive_sha256"]
    assert snapshot(dest) == written  # no byte, mode or mtime moved, no temporary file left


def test_the_archive_unpacks_to_the_folder(tmp_path):
    dest = tmp_path / "submissions"
    run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    unpacked = tmp_path / "unpacked"
    with tarfile.open(dest / "sub510.tar.gz") as tar:
        tar.extractall(unpacked, filter="data")

    def contents(root):
        return {str(path.relative_to(root)): (path.read_bytes(), path.stat().st_mode & 0o777)
                for path in root.rglob("*") if path.is_file()}

    assert contents(unpacked / "sub510") == contents(dest / "sub510")


def test_the_files_of_an_earlier_build_that_the_bundle_no_longer_holds_are_removed(tmp_path):
    dest = tmp_path / "submissions"
    run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    folder = dest / "sub510"
    old_variant = sorted(path.name for path in (folder / "files").iterdir())
    (folder / "notes.txt").write_text("left by hand\n")
    (folder / "files" / "0123456789ab" / "entrypoints").mkdir(parents=True)
    (folder / "files" / "0123456789ab" / "entrypoints" / "old.py").write_text("# old\n")
    (folder / "README.md").chmod(0o600)

    # h3 no longer named: its variant goes with it.
    result = run_action({"release": "sub510", "hosts": fleet()[:2], "dest": str(dest)})

    kept_variant = [variant["id"] for variant in result["variants"]]
    gone = [name for name in old_variant if name not in kept_variant]
    assert len(gone) == 1 and len(kept_variant) == 1
    assert not (folder / "notes.txt").exists() and not (folder / "files" / "0123456789ab").exists()
    assert not (folder / "files" / gone[0]).exists()
    assert oct((folder / "README.md").stat().st_mode & 0o777) == "0o644"
    assert set(result["written"]) >= {
        "sub510/notes.txt", "sub510/files/0123456789ab/entrypoints/old.py", "sub510/files/0123456789ab",
        "sub510/files/0123456789ab/entrypoints", f"sub510/files/{gone[0]}", f"sub510/files/{gone[0]}/{CHAT}",
        "sub510/README.md", "sub510/MANIFEST", "sub510/SHA256SUMS", "sub510.tar.gz"}
    assert f"sub510/files/{kept_variant[0]}/{CHAT}" not in result["written"]
    assert subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=folder, check=False).returncode == 0
    listed = {line.split("  ", 1)[1] for line in (folder / "SHA256SUMS").read_text().splitlines()}
    assert listed | {"SHA256SUMS"} == {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def test_check_mode_writes_nothing_and_says_what_would_change(tmp_path):
    dest = tmp_path / "submissions"
    fresh = run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)}, check_mode=True)
    assert fresh["changed"] and "sub510.tar.gz" in fresh["written"] and not dest.exists()

    run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    (dest / "sub510" / "stale.txt").write_text("stale\n")
    before = snapshot(dest)
    checked = run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)}, check_mode=True, diff=True)

    assert checked["changed"] and checked["written"] == ["sub510/stale.txt"]
    assert checked["diff"] == [{"before_header": "sub510/stale.txt", "after_header": "(absent)",
                                "before": "stale\n", "after": ""}]
    assert snapshot(dest) == before


def test_diff_mode_shows_text_and_the_sha256_of_the_archive(tmp_path):
    dest = tmp_path / "submissions"
    result = run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)}, diff=True)
    by_name = {entry["after_header"]: entry for entry in result["diff"]}
    assert by_name["sub510/computility-run.yaml"]["after"] == RUN
    assert by_name["sub510/computility-run.yaml"]["before_header"] == "(absent)"
    assert by_name["sub510.tar.gz"]["after"] == f"sha256 {result['archive_sha256']}\n"


def test_a_forced_bundle_warns_and_a_refused_one_fails_with_one_message_writing_nothing(tmp_path):
    dest = tmp_path / "submissions"
    hosts = [host("h1"), host("h2", status="failed")]
    with pytest.raises(AnsibleActionFail, match=r"^submission sub510: release sub510 is not good on h2 \(failed\): "):
        run_action({"release": "sub510", "hosts": hosts, "dest": str(dest)})
    assert not dest.exists()

    result = run_action({"release": "sub510", "hosts": hosts, "dest": str(dest), "force": True})
    assert result["warnings"] == ["submission sub510 is built with force: the release is not good on h2 (failed)"]
    assert "Built with force" in (dest / "sub510" / "README.md").read_text()


def test_a_release_a_host_lacks_fails_naming_it():
    hosts = fleet()
    hosts[1]["export"]["status"] = None
    with pytest.raises(AnsibleActionFail, match="^submission sub510: host h2 does not hold release sub510$"):
        run_action({"release": "sub510", "hosts": hosts, "dest": "/nonexistent/submissions"})


def test_a_bundle_folder_that_is_a_symlink_or_a_file_is_refused(tmp_path):
    dest = tmp_path / "submissions"
    dest.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / "sub510").symlink_to(elsewhere)
    with pytest.raises(AnsibleActionFail, match=f"^{dest / 'sub510'} is a symlink to {elsewhere}: refusing"):
        run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    assert list(elsewhere.iterdir()) == [] and sorted(path.name for path in dest.iterdir()) == ["sub510"]

    (dest / "sub510").unlink()
    (dest / "sub510").write_text("not a folder\n")
    with pytest.raises(AnsibleActionFail, match=f"^{dest / 'sub510'} is not a folder: refusing"):
        run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})


def test_a_link_inside_the_folder_or_as_the_archive_is_refused_and_not_followed(tmp_path):
    dest = tmp_path / "submissions"
    run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    target = tmp_path / "target.txt"
    target.write_text("someone else's\n")
    readme = dest / "sub510" / "README.md"
    readme.unlink()
    readme.symlink_to(target)
    with pytest.raises(AnsibleActionFail, match=f"^{readme} is a symlink to {target}: the submission folder holds only"):
        run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    assert target.read_text() == "someone else's\n" and readme.is_symlink()

    readme.unlink()
    archive = dest / "sub510.tar.gz"
    archive.unlink()
    archive.symlink_to(target)
    with pytest.raises(AnsibleActionFail, match=f"^{archive} is a symlink to {target}: refusing"):
        run_action({"release": "sub510", "hosts": fleet(), "dest": str(dest)})
    assert target.read_text() == "someone else's\n" and not readme.exists()


def test_without_dest_the_bundle_goes_to_build_submissions_at_the_project_root(tmp_path, monkeypatch):
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    monkeypatch.setattr(submission_action.C, "CONFIG_FILE", str(tmp_path / "ansible.cfg"))
    result = run_action({"release": "sub510", "hosts": fleet()[:1]})
    assert result["bundle"] == str(tmp_path / "build" / "submissions" / "sub510")
    assert os.path.isfile(tmp_path / "build" / "submissions" / "sub510.tar.gz")
