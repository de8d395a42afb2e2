# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host's run lock (<state_dir>/lock) as the modules that write see it: who holds it, and a
write fenced by it.

serving_lock takes and gives the lock back. Every other module that changes the host (staging,
an engine start or restart, a release's verdict, a rollback) writes inside fenced(): under the
same flock that serving_lock takes to change the lock, it first reads the lock and refuses
unless it names the run the module works for, so no run that lost the host (its lock taken over
or broken since it checked) changes anything there, and no take-over can happen in the middle of
a write. The run is the one the module's environment names (RUN_MARKER, which the playbooks'
lock-taking plays set for every module); a module run outside such a play is not fenced.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

from ansible_collections.biv100.serving.plugins.module_utils._run_processes import RUN_MARKER
from ansible_collections.biv100.serving.plugins.module_utils._state_store import StateDir, read_json


class NotHeld(Exception):
    """The run this module works for does not hold the host's lock: nothing was written."""


@contextlib.contextmanager
def serialised(state_dir):
    """Let one task at a time look at the lock and act on what it found.

    Deciding (free, ours, stale) and writing are two steps; two deployments between them
    would both believe they hold the lock. An flock(2) on the state directory, held for those
    steps, makes the pair atomic for every process on the host.
    """
    os.makedirs(state_dir, exist_ok=True)
    fd = os.open(state_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def lock_text(holder):
    return json.dumps(holder, indent=1, sort_keys=True) + "\n" if holder else ""


def read_holder(path):
    """The holder the lock names, None when there is no lock."""
    try:
        holder = read_json(path)
    except ValueError as error:
        holder = "not JSON (%s)" % error
    if holder is None or isinstance(holder, dict):
        return holder
    # Only a hand edit or a damaged disk gets here; it still holds the host.
    return {"run_id": None, "unreadable": "%s: %s" % (path, holder)}


def describe(holder):
    """`run R (user@controller, pid P, playbook X, release Y) since T`, from what is known."""
    if "unreadable" in holder:
        return "an unreadable lock, %s" % holder["unreadable"]
    details = ["%s@%s" % (holder.get("user") or "?", holder.get("controller") or "?")]
    details.extend(
        "%s %s" % (field, holder[field])
        for field in ("pid", "playbook", "release")
        if holder.get(field)
    )
    since = " since %s" % holder["acquired_at"] if holder.get("acquired_at") else ""
    taking = ", still taking its other hosts" if holder.get("taking") else ""
    return "run %s (%s)%s%s" % (holder.get("run_id"), ", ".join(details), since, taking)


def run_of_this_module(environ=None):
    """The run the module works for, as its play's environment names it; None outside one."""
    return (os.environ if environ is None else environ).get(RUN_MARKER) or None


@contextlib.contextmanager
def fenced(state_dir, run_id=None, writing="this write"):
    """Hold the lock's flock for a write of run_id (default: this module's run), after refusing
    it with NotHeld unless the lock names that run. A run id of None fences nothing."""
    run_id = run_of_this_module() if run_id is None else run_id
    if not run_id:
        yield None
        return
    path = StateDir(state_dir).lock
    if not os.path.isdir(state_dir):
        raise NotHeld("%s refused, nothing changed on this host: run %s holds no lock here, %s does not exist"
                      % (writing, run_id, state_dir))
    with serialised(state_dir):
        holder = read_holder(path)
        if holder is None or holder.get("run_id") != run_id:
            raise NotHeld(
                "%s refused, nothing changed on this host: run %s no longer holds its lock, %s %s"
                % (writing, run_id, path, "is free" if holder is None else "is held by " + describe(holder))
            )
        yield holder
