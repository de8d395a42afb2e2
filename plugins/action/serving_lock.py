# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller half of biv100.serving.serving_lock: name the run, and clear the lock of a dead one.

The host half knows only what it is told, so this side says who the run is (controller, user,
ansible-playbook process). When the host refuses because another run holds the lock, that run
can be proven gone only if it ran on this controller: then its ansible-playbook process is
looked for, and a lock it left behind is taken over with a warning. Any other holder is
reported with how to break its lock by hand.
"""

from __future__ import annotations

import getpass
import os
import socket

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

MODULE = "biv100.serving.serving_lock"
BREAK_HINT = "if that run is gone, re-run with -e serving_lock_break=true"


def this_run():
    """The module arguments that name this run's process.

    ansible-core (2.19 and 2.21) runs every task in a WorkerProcess, which the ansible-playbook
    process forks directly (multiprocessing's "fork" context, ansible.utils.multiprocessing), and
    the action runs inside that worker: its parent is the ansible-playbook process of the run
    (test_serving_lock_action.py checks this against a real ansible-playbook).
    """
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


def stale_reason(holder, controller, argv_of):
    """Why the run holding the lock is certainly gone, or None while it may still be running.

    Only a holder on this controller can be judged: a pid means nothing on another machine.
    A process whose command line cannot be read is given the benefit of the doubt.
    """
    pid = holder.get("pid")
    if holder.get("controller") != controller or not isinstance(pid, int) or pid <= 0:
        return None
    argv = argv_of(pid)
    if argv is None:
        return "its ansible-playbook process %d on %s has ended" % (pid, controller)
    if argv and not runs_ansible_playbook(argv):
        return "process %d on %s is now %r, not its ansible-playbook" % (
            pid,
            controller,
            " ".join(argv),
        )
    return None


def refused(result):
    # The module returns the holder with a failure only when another run holds the lock.
    return bool(result.get("failed")) and isinstance(result.get("holder"), dict)


def with_hint(refusal):
    return dict(refusal, msg="%s; %s" % (refusal["msg"], BREAK_HINT))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # The module validates the task's arguments; this side only adds who the run is.
        module_args = dict(self._task.args, **this_run())
        outcome = self._lock(module_args, task_vars)
        if refused(outcome):
            outcome = self._take_over_if_stale(outcome, module_args, task_vars)
        result.update(outcome)
        return result

    def _take_over_if_stale(self, refusal, module_args, task_vars):
        holder = refusal["holder"]
        reason = stale_reason(holder, module_args["_controller"], process_argv)
        if not reason:
            return with_hint(refusal)
        # Names the stale run rather than breaking any lock: a live run that took the lock
        # since the refusal is refused again, not overrun.
        retried = self._lock(dict(module_args, _break_stale=holder["run_id"]), task_vars)
        if retried.get("failed"):
            return with_hint(retried) if refused(retried) else retried
        # Through Display, as ansible-core's own actions warn: ansible-core 2.21's output fails on
        # a text added to the warnings of a module's result.
        display.warning("run %s left the lock behind (%s): this run took it over" % (holder["run_id"], reason))
        return retried

    def _lock(self, module_args, task_vars):
        return self._execute_module(
            module_name=MODULE, module_args=module_args, task_vars=task_vars
        )
