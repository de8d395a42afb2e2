# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A run of ansible-playbook on this controller, as ansible-core's process model makes it: all the
collection knows of that model is here, for the fleet lock (action/serving_lock), which names a
run by its ansible-playbook process and tells a dead run's lock and its leftover workers apart.

What it relies on, in ansible-core 2.19 and 2.21 (tests/unit/plugins/action/test_serving_lock_action.py
checks each against a real ansible-playbook):

- every task runs in a WorkerProcess that the ansible-playbook process forks directly
  (multiprocessing's "fork" context, ansible.utils.multiprocessing), and an action runs inside
  that worker: the action's parent process is the run's ansible-playbook;
- the workers are forked without an exec, so they keep ansible-playbook's command line and the
  kernel's PF_FORKNOEXEC flag, and each is put in a session of its own, so a SIGKILL of
  ansible-playbook reaches none of them: re-parented, they go on.
"""

from __future__ import annotations

import getpass
import os
import socket

from ansible_collections.biv100.serving.plugins.module_utils._engine_process import process_stat

# include/linux/sched.h: the process was forked and has not called exec since.
PF_FORKNOEXEC = 0x40


def this_run():
    """The module arguments that name this run: this controller, the user, and the run's
    ansible-playbook process, the parent of the worker an action runs in."""
    return {"_controller": socket.gethostname(), "_user": getpass.getuser(), "_pid": os.getppid()}


def process_argv(pid):
    """The command line of process pid on this controller.

    None when no such process exists; an empty tuple when it exists but its command line
    cannot be read (no /proc, /proc mounted with hidepid, a zombie or a kernel thread).
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, under another user
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as stream:
            raw = stream.read()
    except OSError:
        return ()
    return tuple(arg.decode("utf-8", "replace") for arg in raw.split(b"\0") if arg)


def runs_ansible_playbook(argv):
    # The console script runs as `python .../ansible-playbook args`, or as itself when its
    # interpreter is not named (a frozen or wrapped install): look at the first two words.
    return any(os.path.basename(word).startswith("ansible-playbook") for word in argv[:2])


def process_status(pid):
    """(parent pid, kernel flags) of pid, or None when it cannot be read."""
    stat = process_stat(pid)
    return (stat["ppid"], stat["flags"]) if stat else None


def leftover_workers(argv_of=process_argv, status_of=process_status):
    """The pids of ansible-playbook workers on this controller whose ansible-playbook is gone.

    ansible-core forks its workers from the ansible-playbook process without an exec (they keep
    its command line, and the kernel's PF_FORKNOEXEC flag) and puts each in a session of its
    own, so a SIGKILL of ansible-playbook reaches none of them: they are re-parented and go on.
    An ansible-playbook started from a shell or a scheduler was exec'ed, and a live run's
    workers have it as their parent: neither is listed. None on a controller without /proc.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = []
    for pid in sorted(int(entry) for entry in entries if entry.isdigit()):
        argv = argv_of(pid)
        status = status_of(pid)
        if not argv or not runs_ansible_playbook(argv) or status is None:
            continue
        parent, flags = status
        parent_argv = argv_of(parent)
        if flags & PF_FORKNOEXEC and not (parent_argv and runs_ansible_playbook(parent_argv)):
            found.append(pid)
    return found
