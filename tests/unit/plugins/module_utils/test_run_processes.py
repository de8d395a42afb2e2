"""module_utils/_run_processes.py: a run's processes on a host, known by the marker in their
environment; real processes for what the kernel shows, a fake /proc for other mount namespaces
and ended processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._engine_process import started_at
from ansible_collections.biv100.serving.plugins.module_utils._run_processes import (
    RUN_MARKER,
    run_processes,
    short_command,
)

REPO = Path(__file__).resolve().parents[4]
HOLDER = "20260508T221003Z-118"


@pytest.fixture
def marked(started_process):
    """start(run_id, argv): a process carrying `run_id` as its marker (none for None), running
    argv; killed at teardown."""

    def start(run_id, argv):
        env = {key: value for key, value in os.environ.items() if key != RUN_MARKER}
        if run_id is not None:
            env[RUN_MARKER] = run_id
        return started_process(argv, env=env)

    return start


@pytest.fixture
def state_dir(tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    return str(folder)


def start_ticks(pid):
    raw = Path("/proc/%d/stat" % pid).read_bytes()
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def test_a_process_carrying_the_runs_marker_is_named_by_pid_command_and_start(marked, state_dir):
    sleeper = marked(HOLDER, ["/bin/sleep", "60"])
    marked("another-run", ["/bin/sleep", "61"])
    marked(None, ["/bin/sleep", "62"])

    assert run_processes(HOLDER, state_dir) == [
        {"pid": sleeper.pid, "command": "sleep 60", "started_at": started_at(start_ticks(sleeper.pid))}
    ]


def test_a_process_that_ended_is_not_counted(marked, state_dir):
    sleeper = marked(HOLDER, ["/bin/sleep", "60"])
    sleeper.kill()
    sleeper.wait()
    assert run_processes(HOLDER, state_dir) == []


def test_no_run_and_no_state_dir_find_nothing(marked, state_dir, tmp_path):
    marked(HOLDER, ["/bin/sleep", "60"])
    assert run_processes(None, state_dir) == []
    assert run_processes(HOLDER, str(tmp_path / "no-such-state")) == []


# The run asking, under a shell that carries the same marker, looks for it beside a sibling.
ASKING = textwrap.dedent("""\
    import json, sys
    from ansible_collections.biv100.serving.plugins.module_utils._run_processes import run_processes
    print(json.dumps([process["pid"] for process in run_processes(sys.argv[1], sys.argv[2])]))
    """)


def test_the_asking_process_and_its_ancestors_are_never_counted(marked, state_dir, tmp_path):
    sibling = marked(HOLDER, ["/bin/sleep", "60"])
    script = tmp_path / "asking.py"
    script.write_text(ASKING)
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"), **{RUN_MARKER: HOLDER})
    # `; true` keeps the shell from exec'ing python in its place: it stays its parent.
    asked = subprocess.run(["/bin/sh", "-c", '"$0" "$1" "$2" "$3"; true', sys.executable, str(script), HOLDER,
                            state_dir], env=env, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(asked.stdout) == [sibling.pid]


def fake_process(proc: Path, pid: int, *, environ: dict, argv: list[str], root: Path, state: str = "S") -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "environ").write_bytes(b"".join(b"%s=%s\0" % (k.encode(), v.encode()) for k, v in environ.items()))
    (folder / "cmdline").write_bytes(b"".join(word.encode() + b"\0" for word in argv))
    # pid (comm) state ppid pgrp session tty tpgid flags ... starttime is the 22nd field.
    fields = [state, "1"] + ["0"] * 17 + ["4242"]
    (folder / "stat").write_text("%d (py (thon) %s\n" % (pid, " ".join(fields)))
    (folder / "root").symlink_to(root)


def test_only_processes_that_see_this_hosts_state_dir_count(tmp_path, state_dir):
    proc = tmp_path / "proc"
    elsewhere = tmp_path / "other-namespace-root"
    elsewhere.mkdir()
    module = ["/usr/local/corex/python3/bin/python3",
              "/root/.ansible/tmp/ansible-tmp-1-2-3/AnsiballZ_engine_health.py"]
    ours = {RUN_MARKER: HOLDER, "PATH": "/bin"}
    fake_process(proc, 101, environ=ours, argv=module, root=Path("/"))
    # Another mount namespace (a container, another lab host) sees no such folder there.
    fake_process(proc, 102, environ=ours, argv=module, root=elsewhere)
    fake_process(proc, 103, environ=ours, argv=module, root=Path("/"), state="Z")
    fake_process(proc, 104, environ={RUN_MARKER: HOLDER + "0"}, argv=module, root=Path("/"))

    assert run_processes(HOLDER, state_dir, proc=str(proc)) == [
        {"pid": 101, "command": "python3 AnsiballZ_engine_health.py", "started_at": started_at(4242)}
    ]


def test_a_long_command_is_cut_to_a_line():
    shown = short_command(["/bin/sh", "-c", "x" * 200])
    assert len(shown) == 80 and shown.startswith("sh -c xxx") and shown.endswith("...")
    assert short_command([]) == "?"
