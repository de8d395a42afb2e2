"""Files under a root are read and written without following a link below it."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath

SERVING = "entrypoints/openai/serving_chat.py"


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "vllm"
    (root / "entrypoints" / "openai").mkdir(parents=True)
    (root / "model_executor" / "models").mkdir(parents=True)
    (root / SERVING).write_bytes(b"vendor\n")
    (root / "model_executor" / "models" / "llama.py").write_bytes(b"model\n")
    return root


def test_a_write_replaces_the_file_whole_keeping_its_mode(package):
    os.chmod(package / SERVING, 0o640)
    Tree(str(package)).write(SERVING, b"ours\n")
    assert (package / SERVING).read_bytes() == b"ours\n"
    assert stat.S_IMODE(os.stat(package / SERVING).st_mode) == 0o640
    assert sorted(os.listdir(package / "entrypoints" / "openai")) == ["serving_chat.py"]  # no temp left


def test_a_folder_linked_elsewhere_is_refused_naming_the_link_and_nothing_is_written(package):
    # The vendor image links a serving folder into the model layer.
    os.symlink("../model_executor/models", package / "entrypoints" / "linked")
    tree = Tree(str(package))
    for operation in (lambda: tree.write("entrypoints/linked/new.py", b"x"),
                      lambda: tree.write("entrypoints/linked/llama.py", b"x"),
                      lambda: tree.remove("entrypoints/linked/llama.py"),
                      lambda: tree.read("entrypoints/linked/llama.py"),
                      lambda: tree.inspect("entrypoints/linked/llama.py")):
        with pytest.raises(UnsafePath) as refused:
            operation()
        assert refused.value.culprit == "entrypoints/linked"
        assert "symlink to ../model_executor/models" in str(refused.value)
    assert sorted(os.listdir(package / "model_executor" / "models")) == ["llama.py"]
    assert (package / "model_executor" / "models" / "llama.py").read_bytes() == b"model\n"


def test_a_final_name_that_is_a_link_is_neither_read_nor_written_through(package):
    os.unlink(package / SERVING)
    os.symlink("../../model_executor/models/llama.py", package / SERVING)
    tree = Tree(str(package))
    with pytest.raises(UnsafePath, match="is a symlink to"):
        tree.write(SERVING, b"ours\n")
    with pytest.raises(UnsafePath):
        tree.digest(SERVING)
    assert (package / "model_executor" / "models" / "llama.py").read_bytes() == b"model\n"


def test_a_fifo_or_a_folder_where_a_file_belongs_is_refused(package):
    os.unlink(package / SERVING)
    os.mkfifo(package / SERVING)
    with pytest.raises(UnsafePath, match="is a FIFO, not a regular file"):
        Tree(str(package)).read(SERVING)  # never blocks on the FIFO
    with pytest.raises(UnsafePath, match="is a regular file, not a folder"):
        Tree(str(package)).inspect("model_executor/models/llama.py/inner.py")


def test_missing_folders_are_reported_then_created(package):
    tree = Tree(str(package))
    assert tree.inspect("reasoning/mine/parser.py") == {"kind": "absent", "missing": ["reasoning/", "reasoning/mine/"]}
    tree.write("reasoning/mine/parser.py", b"X = 1\n")
    assert tree.inspect("reasoning/mine/parser.py") == {"kind": "file", "missing": []}
    assert tree.digest("reasoning/mine/parser.py") == hashlib.sha256(b"X = 1\n").hexdigest()
    assert tree.read("reasoning/mine/parser.py") == b"X = 1\n"


def test_a_root_that_is_itself_a_link_is_the_anchor_and_is_followed(package, tmp_path):
    os.symlink(package, tmp_path / "corex-link")
    Tree(str(tmp_path / "corex-link")).write(SERVING, b"ours\n")
    assert (package / SERVING).read_bytes() == b"ours\n"


def test_paths_that_leave_the_root_are_refused(package):
    for path in ("../x.py", "/etc/passwd", "entrypoints/../../x.py", ""):
        with pytest.raises(UnsafePath):
            Tree(str(package)).inspect(path)


def test_a_remove_takes_only_the_regular_file(package):
    tree = Tree(str(package))
    assert tree.remove(SERVING) is True
    assert tree.remove(SERVING) is False
    assert not (package / SERVING).exists()


def test_a_write_sweeps_the_temporary_files_a_killed_run_left_of_the_same_name(package):
    folder = package / "entrypoints" / "openai"
    dead = _a_dead_pid()
    (folder / f".serving_chat.py.{dead}.0badc0de").write_bytes(b"half")
    (folder / f".serving_chat.py.{os.getpid()}.0badc0de").write_bytes(b"ours, in progress")
    Tree(str(package)).write(SERVING, b"ours\n")
    assert sorted(os.listdir(folder)) == [f".serving_chat.py.{os.getpid()}.0badc0de", "serving_chat.py"]


def _a_dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
