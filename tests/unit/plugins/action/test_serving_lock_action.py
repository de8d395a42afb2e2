"""The controller half of biv100.serving.serving_lock: who holds the lock, and when it is stale.

(Named apart from tests/unit/plugins/modules/test_serving_lock.py: the test folders are not
packages, so two test files may not share a name.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.action.serving_lock import live_holder_pid, stale_reason, wants_break
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_processes import (
    PF_FORKNOEXEC,
    leftover_workers,
    process_argv,
    runs_ansible_playbook,
)

REPO_ROOT = Path(__file__).resolve().parents[4]
PLAYBOOK_ARGV = ("/opt/venv/bin/python3.11", "/opt/venv/bin/ansible-playbook", "deploy.yml")
# The longest a test's real ansible-playbook may run: seconds alone, half a minute on a loaded machine.
PLAYBOOK_TIMEOUT = 300


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
    output, _stderr = playbook.communicate(timeout=PLAYBOOK_TIMEOUT)
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


def test_a_holder_is_live_exactly_while_it_is_not_stale():
    live = holder()
    assert live_holder_pid(live, "ctl1", argv_table({4242: PLAYBOOK_ARGV})) == 4242
    assert live_holder_pid(live, "ctl1", argv_table({4242: ()})) == 4242  # unreadable: maybe it
    assert live_holder_pid(live, "ctl1", argv_table({})) is None
    assert live_holder_pid(live, "ctl1", argv_table({4242: ("sleep", "600")})) is None
    assert live_holder_pid(holder(controller="ctl2"), "ctl1", argv_table({4242: PLAYBOOK_ARGV})) is None
    assert live_holder_pid(holder(pid=None), "ctl1", argv_table({})) is None


def test_break_lock_is_read_as_ansible_reads_a_boolean():
    assert wants_break({"break_lock": "true"}) is True
    assert wants_break({"break_lock": "no"}) is False and wants_break({}) is False
    assert wants_break({"break_lock": "maybe"}) is None


# Pids of the fake process table below.
WORKER = 101
RUN = 102
LIVE = 103
TOP = 104


def test_leftover_workers_are_forked_ansible_playbooks_whose_parent_is_not_one(monkeypatch):
    argv = {WORKER: PLAYBOOK_ARGV, RUN: PLAYBOOK_ARGV, LIVE: PLAYBOOK_ARGV, TOP: PLAYBOOK_ARGV,
            1: ("/sbin/init",), 7: ("bash",)}
    status = {
        WORKER: (1, PF_FORKNOEXEC),  # forked from an ansible-playbook that is gone
        LIVE: (RUN, PF_FORKNOEXEC),  # a worker of a run that goes on
        RUN: (7, 0),  # a run started from a shell: exec'ed
        TOP: (1, 0),  # a run started in the background, its shell gone
    }
    monkeypatch.setattr(os, "listdir", lambda path: [str(pid) for pid in argv] + ["self"])
    assert leftover_workers(argv_table(argv), status.get) == [WORKER]


# Started as `python <tmp>/ansible-playbook [fork]`: an ansible-playbook as far as its command
# line tells; with `fork`, it forks a child and exits, as a killed run leaves its worker. Either
# sleeps longer than a playbook of the tests may run (PLAYBOOK_TIMEOUT), and is killed at teardown.
FAKE_PLAYBOOK = textwrap.dedent("""\
    import os, sys, time
    if sys.argv[1:] == ["fork"]:
        child = os.fork()
        if child == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            time.sleep(600)
            os._exit(0)
        print(child, flush=True)
    else:
        time.sleep(600)
    """)


@pytest.fixture
def fake_playbook(tmp_path):
    script = tmp_path / "bin" / "ansible-playbook"
    script.parent.mkdir()
    script.write_text(FAKE_PLAYBOOK)
    return script


@pytest.fixture
def leftover_worker(fake_playbook):
    """The pid of a process left as a killed run leaves its workers; killed at teardown."""
    forked = subprocess.run([sys.executable, str(fake_playbook), "fork"], capture_output=True,
                            text=True, check=True, timeout=30)
    pid = int(forked.stdout)
    yield pid
    os.kill(pid, signal.SIGKILL)


def test_a_worker_left_by_its_killed_ansible_playbook_is_found(leftover_worker, started_process, fake_playbook):
    running = started_process([sys.executable, str(fake_playbook)])
    found = leftover_workers()
    assert leftover_worker in found and running.pid not in found


TAKE_OVER = textwrap.dedent("""\
    - name: Take over locks whose holders still run
      hosts: localhost
      gather_facts: false
      tasks:
        - name: Meet the lock of a run whose ansible-playbook still runs here
          biv100.serving.serving_lock:
            run_id: run-2
            state_dir: "{{ out }}/live"
          register: met
          ignore_errors: true

        - name: Break the lock of a run whose ansible-playbook still runs here
          biv100.serving.serving_lock:
            run_id: run-2
            break_lock: true
            state_dir: "{{ out }}/live"
          register: live
          ignore_errors: true

        - name: Take over the lock of a killed run whose module still runs on the host
          biv100.serving.serving_lock:
            run_id: run-2
            state_dir: "{{ out }}/killed"
          register: killed
          ignore_errors: true

        - name: Break the lock of a run on another controller
          biv100.serving.serving_lock:
            run_id: run-2
            break_lock: "{{ 'yes' }}"
            state_dir: "{{ out }}/elsewhere"
          register: elsewhere

        - name: Keep the results for the test
          ansible.builtin.copy:
            content: "{{ {'met': met, 'live': live, 'killed': killed, 'elsewhere': elsewhere} | to_json }}"
            dest: "{{ out }}/results.json"
            mode: "0644"
    """)


def run_play(tmp_path, play):
    (tmp_path / "play.yml").write_text(play)
    playbook = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), str(tmp_path / "play.yml"), "-i", "localhost,",
         "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable, "-e", json.dumps({"out": str(tmp_path)})],
        cwd=REPO_ROOT, env=dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg")),
        capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT, check=False)
    assert playbook.returncode == 0, playbook.stdout + playbook.stderr
    return json.loads((tmp_path / "results.json").read_text())


def lock_held(tmp_path, name, holder_fields):
    state = tmp_path / name
    state.mkdir()
    (state / "lock").write_text(json.dumps(holder_fields))
    return state / "lock"


def test_no_lock_is_taken_from_a_live_run_or_from_a_killed_run_still_on_the_host(
        tmp_path, started_process, fake_playbook, leftover_worker):
    here = socket.gethostname()
    live_run = started_process([sys.executable, str(fake_playbook)])
    live = {"run_id": "live-run", "controller": here, "pid": live_run.pid}
    live_lock = lock_held(tmp_path, "live", live)
    killed_run = subprocess.Popen(["true"])
    killed_run.wait()
    killed = {"run_id": "killed-run", "controller": here, "pid": killed_run.pid}
    killed_lock = lock_held(tmp_path, "killed", killed)
    module = started_process(["sleep", "60"], env=dict(os.environ, BIV100_SERVING_RUN="killed-run"))
    elsewhere = {"run_id": "far-run", "controller": "ctl-elsewhere", "user": "bob", "pid": 1}
    elsewhere_lock = lock_held(tmp_path, "elsewhere", elsewhere)

    results = run_play(tmp_path, TAKE_OVER)

    assert results["live"]["failed"] and json.loads(live_lock.read_text()) == live
    assert results["live"]["msg"] == (
        "%s is held by run live-run (?@%s, pid %d); its ansible-playbook process %d still runs on %s "
        "(this controller), and serving_lock_break takes no lock from a live run: wait for that run "
        "to end, or end it with kill %d (a SIGTERM, which it passes on to its workers; a SIGKILL "
        "would leave them running)" % (live_lock, here, live_run.pid, live_run.pid, here, live_run.pid))
    # Without break_lock, the same advice, and no suggestion to break it.
    assert results["met"]["failed"] and "serving_lock_break" not in results["met"]["msg"]
    assert "still runs on %s (this controller): wait for that run to end" % here in results["met"]["msg"]

    refusal = results["killed"]
    assert refusal["failed"] and json.loads(killed_lock.read_text()) == killed
    assert [process["pid"] for process in refusal["holder_processes"]] == [module.pid]
    assert "which still runs on this host: pid %d (sleep 60, since " % module.pid in refusal["msg"]
    assert "or end them (kill %d), and run again; " % module.pid in refusal["msg"]
    workers = refusal["msg"].split("; leftover ansible-playbook workers of a killed run on %s (this controller): " % here)[1]
    assert str(leftover_worker) in workers.split(" (kill ")[0].split(", ")

    assert results["elsewhere"]["previous_holder"] == elsewhere
    assert json.loads(elsewhere_lock.read_text())["run_id"] == "run-2"
