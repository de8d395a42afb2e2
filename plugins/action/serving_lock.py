# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller half of biv100.serving.serving_lock: name the run, and clear the lock of a dead one.

The host half knows only what it is told, so this side says who the run is (controller, user,
ansible-playbook process). When the host refuses because another run holds the lock, that run
can be proven gone only if it ran on this controller: then its ansible-playbook process is
looked for, and a lock it left behind is taken over with a warning. Any other holder is
reported with how to break its lock by hand; break_lock is decided here too, since only this
side can see that the holder's ansible-playbook still runs on this controller. Either takeover
is refused by the host while the holder's processes still run there; then this side names the
workers a killed ansible-playbook left on this controller, which are what keeps them running.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_processes import (
    leftover_workers,
    process_argv,
    runs_ansible_playbook,
    this_run,
)

display = Display()

MODULE = "biv100.serving.serving_lock"
BREAK_HINT = "if that run is gone, re-run with -e serving_lock_break=true"


def pid_here(holder, controller):
    """The holder's ansible-playbook pid when it ran on this controller, else None: a pid means
    nothing on another machine."""
    pid = holder.get("pid")
    if holder.get("controller") != controller or not isinstance(pid, int) or pid <= 0:
        return None
    return pid


def stale_reason(holder, controller, argv_of):
    """Why the run holding the lock is certainly gone, or None while it may still be running.

    Only a holder on this controller can be judged. A process whose command line cannot be
    read is given the benefit of the doubt.
    """
    pid = pid_here(holder, controller)
    if pid is None:
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


def live_holder_pid(holder, controller, argv_of):
    """The holder's ansible-playbook pid while it may still run on this controller, else None.

    Exactly the holders of this controller that stale_reason does not find gone: a process of
    that pid running ansible-playbook, or one whose command line cannot be read.
    """
    pid = pid_here(holder, controller)
    if pid is None or stale_reason(holder, controller, argv_of) is not None:
        return None
    return pid


def wants_break(args):
    """break_lock as a boolean; None when it is not one (the host half then refuses it, naming
    the option, before it looks at the lock)."""
    try:
        return boolean(args.get("break_lock", False), strict=True)
    except TypeError:
        return None


def still_running_here(refusal, pid, controller, breaking):
    """The refusal of a lock whose holder runs on this controller: how to end it, never a
    suggestion to break it."""
    unbroken = ", and serving_lock_break takes no lock from a live run" if breaking else ""
    return dict(
        refusal,
        msg="%s; its ansible-playbook process %d still runs on %s (this controller)%s: wait for "
        "that run to end, or end it with kill %d (a SIGTERM, which it passes on to its workers; "
        "a SIGKILL would leave them running)" % (refusal["msg"], pid, controller, unbroken, pid),
    )


def with_leftover_workers(refusal, controller, workers):
    """The host's refusal (the holder's processes still run there), with what keeps them
    running on this controller when it can tell."""
    if workers is None:
        return refusal
    if workers:
        pids = [str(pid) for pid in workers]
        here = "leftover ansible-playbook workers of a killed run on %s (this controller): %s" % (
            controller,
            ", ".join(pids),
        )
        here += " (kill %s)" % " ".join(pids)
    else:
        here = "no leftover ansible-playbook worker runs on %s (this controller)" % controller
    return dict(refusal, msg="%s; %s" % (refusal["msg"], here))


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
        breaking = wants_break(module_args)
        if breaking is None:
            result.update(self._lock(module_args, task_vars))
            return result
        # A lock is broken only once this side has seen its holder: first ask without breaking.
        outcome = self._lock(dict(module_args, break_lock=False), task_vars)
        if refused(outcome):
            outcome = self._take_over(outcome, module_args, breaking, task_vars)
        result.update(outcome)
        return result

    def _take_over(self, refusal, module_args, breaking, task_vars):
        holder = refusal["holder"]
        controller = module_args["_controller"]
        live_pid = live_holder_pid(holder, controller, process_argv)
        if live_pid is not None:
            return still_running_here(refusal, live_pid, controller, breaking)
        reason = stale_reason(holder, controller, process_argv)
        if not reason and not breaking:
            return with_hint(refusal)
        # Names the run to take the lock from rather than breaking any lock: a live run that
        # took the lock since the refusal is refused again, not overrun. An unreadable lock
        # names no run; only break_lock takes it.
        if holder.get("run_id") is not None:
            take_over = {"break_lock": False, "_break_stale": holder["run_id"]}
        else:
            take_over = {"break_lock": True}
        retried = self._lock(dict(module_args, **take_over), task_vars)
        if retried.get("holder_processes"):
            if holder.get("controller") != controller:
                return retried
            return with_leftover_workers(retried, controller, leftover_workers())
        if retried.get("failed"):
            return with_hint(retried) if refused(retried) else retried
        if reason:
            # Through Display, as ansible-core's own actions warn: ansible-core 2.21's output
            # fails on a text added to the warnings of a module's result.
            display.warning("run %s left the lock behind (%s): this run took it over" % (holder["run_id"], reason))
        return retried

    def _lock(self, module_args, task_vars):
        return self._execute_module(
            module_name=MODULE, module_args=module_args, task_vars=task_vars
        )
