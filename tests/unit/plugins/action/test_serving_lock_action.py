"""The controller half of biv100.serving.serving_lock: who holds the lock, and when it is stale.

(Named apart from tests/unit/plugins/modules/test_serving_lock.py: the test folders are not
packages, so two test files may not share a name.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from ansible_collections.biv100.serving.plugins.action.serving_lock import (
    process_argv,
    runs_ansible_playbook,
    stale_reason,
)

REPO_ROOT = Path(__file__).resolve().parents[4]
PLAYBOOK_ARGV = ("/opt/venv/bin/python3.11", "/opt/venv/bin/ansible-playbook", "deploy.yml")


def holder(**fields):
    return dict({"run_id": "crashed-run", "controller": "ctl1", "pid": 4242}, **fields)


def argv_table(table):
    """A process lookup answering from a table: pid -> argv, absent pid -> no such process."""
    return table.get


def test_a_holder_whose_process_ended_is_stale():
    reason = stale_reason(holder(), "ctl1", argv_table({}))
    assert reason == "its ansible-playbook process 4242 on ctl1 has ended"


def test_a_holder_whose_pid_now_runs_something_else_is_stale():
    reason = stale_reason(holder(), "ctl1", argv_table({4242: ("sleep", "600")}))
    assert reason == "process 4242 on ctl1 is now 'sleep 600', not its ansible-playbook"


def test_a_holder_still_running_ansible_playbook_is_not_stale():
    assert stale_reason(holder(), "ctl1", argv_table({4242: PLAYBOOK_ARGV})) is None


def test_a_holder_on_another_controller_is_never_judged():
    def no_lookup(pid):
        raise AssertionError("a pid of another controller was looked up here")

    assert stale_reason(holder(controller="ctl2"), "ctl1", no_lookup) is None


def test_a_process_whose_command_line_cannot_be_read_is_not_stale():
    assert stale_reason(holder(), "ctl1", argv_table({4242: ()})) is None


def test_a_holder_without_a_usable_pid_is_not_stale():
    for pid in (None, 0, -1, "4242"):
        assert stale_reason(holder(pid=pid), "ctl1", argv_table({})) is None


def test_ansible_playbook_is_recognised_however_it_was_started():
    assert runs_ansible_playbook(PLAYBOOK_ARGV)
    assert runs_ansible_playbook(("/usr/bin/ansible-playbook", "-i", "inventory/lab", "deploy.yml"))
    assert not runs_ansible_playbook(("/usr/bin/python3", "-m", "pytest", "ansible-playbook"))
    assert not runs_ansible_playbook(("vim", "deploy.yml"))


def test_process_argv_reads_a_live_process_and_misses_an_ended_one():
    code = "print('ready', flush=True); import time; time.sleep(30)"
    sleeper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        # Once it prints, it runs its own command line, not the test's from before exec.
        assert sleeper.stdout.readline() == "ready\n"
        assert process_argv(sleeper.pid) == (sys.executable, "-c", code)
    finally:
        sleeper.kill()
        sleeper.wait()
        sleeper.stdout.close()
    assert process_argv(sleeper.pid) is None


PLAY = textwrap.dedent("""\
    - name: Take the lock a crashed run left, then meet one held elsewhere
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Take the lock over from the crashed run
          biv100.serving.serving_lock:
            run_id: run-2
            playbook: lock.yml
            state_dir: "{{ out }}/state"
          register: taken

        - name: Another controller takes the lock
          ansible.builtin.copy:
            content: "{{ elsewhere | to_json }}"
            dest: "{{ out }}/state/lock"
            mode: "0644"

        - name: Meet the lock held elsewhere
          biv100.serving.serving_lock:
            run_id: run-2
            state_dir: "{{ out }}/state"
          register: refused
          ignore_errors: true

        - name: Keep both results for the test
          ansible.builtin.copy:
            content: "{{ {'taken': taken, 'refused': refused} | to_json }}"
            dest: "{{ out }}/results.json"
            mode: "0644"
    """)


def test_a_real_run_names_its_ansible_playbook_and_takes_over_a_dead_runs_lock(tmp_path):
    crashed = subprocess.Popen(["true"])
    crashed.wait()
    state = tmp_path / "state"
    state.mkdir()
    dead_holder = {"run_id": "crashed-run", "controller": socket.gethostname(), "pid": crashed.pid}
    (state / "lock").write_text(json.dumps(dead_holder))
    elsewhere = {"run_id": "far-run", "controller": "ctl-elsewhere", "user": "bob", "pid": 1}
    (tmp_path / "lock.yml").write_text(PLAY)

    playbook = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            str(tmp_path / "lock.yml"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=%s" % sys.executable,
            "-e",
            json.dumps({"out": str(tmp_path), "elsewhere": elsewhere}),
        ],
        cwd=REPO_ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg")),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _stderr = playbook.communicate(timeout=120)
    assert playbook.returncode == 0, output
    results = json.loads((tmp_path / "results.json").read_text())

    taken = results["taken"]
    # The holder's pid is the ansible-playbook process itself, the parent of the task's worker.
    assert taken["holder"]["pid"] == playbook.pid
    assert taken["holder"]["controller"] == socket.gethostname()
    assert taken["previous_holder"] == dead_holder
    assert "run crashed-run left the lock behind" in output
    assert "process %d on %s has ended" % (crashed.pid, socket.gethostname()) in output

    refused = results["refused"]
    assert refused["failed"] is True
    assert refused["msg"].endswith(
        "is held by run far-run (bob@ctl-elsewhere, pid 1); "
        "if that run is gone, re-run with -e serving_lock_break=true"
    )
    assert json.loads((state / "lock").read_text()) == elsewhere
