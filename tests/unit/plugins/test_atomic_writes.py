"""The two writers of whole files, the host's (the state store's atomic_write) and the
controller's (plugin_utils' write_atomic), give the same guarantees: a temporary file in the
target's folder, fsynced, renamed over the target, then the folder fsynced; a failure before
the rename leaves the old file and no temporary one."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._state_store import atomic_write
from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic

WRITERS = {"host": atomic_write, "controller": write_atomic}


@pytest.fixture(params=sorted(WRITERS))
def write(request):
    return WRITERS[request.param]


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_write_replaces_the_file_whole_with_the_mode_asked(write, tmp_path):
    target = tmp_path / "release.json"
    target.write_bytes(b"old content, longer than the new one\n")
    os.chmod(target, 0o600)

    write(str(target), b"new\n", mode=0o640)

    assert target.read_bytes() == b"new\n" and mode_of(target) == 0o640
    write(str(target), b"newer\n")
    assert target.read_bytes() == b"newer\n" and mode_of(target) == 0o644
    assert os.listdir(tmp_path) == ["release.json"]  # no temporary file left


def test_missing_folders_are_made(write, tmp_path):
    target = tmp_path / "build" / "probes" / "h1.json"
    write(str(target), b"{}\n", mode=0o600)
    assert target.read_bytes() == b"{}\n" and mode_of(target) == 0o600


def test_the_file_is_fsynced_renamed_in_its_folder_then_the_folder_is_fsynced(write, tmp_path, monkeypatch):
    target = tmp_path / "ledger.md"
    steps = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        steps.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source, destination, **options):
        steps.append(("rename", str(source), str(destination)))
        real_replace(source, destination, **options)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)

    write(str(target), b"table\n")

    (_fsync, staged), rename, folder_fsync = steps
    assert os.path.dirname(staged) == str(tmp_path) and staged != str(target)
    assert rename == ("rename", staged, str(target))
    assert folder_fsync == ("fsync", str(tmp_path))


def full_disk(*_args, **_options):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_failure_before_the_rename_leaves_the_old_file_and_no_temporary(write, tmp_path, monkeypatch, step):
    target = tmp_path / "release.json"
    target.write_bytes(b"old\n")
    monkeypatch.setattr(os, step, full_disk)

    with pytest.raises(OSError) as failed:
        write(str(target), b"new\n" * 1000)

    assert failed.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["release.json"]


def test_the_controller_writes_text_as_utf_8(tmp_path):
    target = tmp_path / "LEDGER.md"
    write_atomic(target, "| h1 | → sub510 |\n")
    assert target.read_bytes() == "| h1 | → sub510 |\n".encode("utf-8")
