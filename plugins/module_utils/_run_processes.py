# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The processes a deployment run still has working on this host, found by its marker.

The playbooks' lock-taking plays give every module they run the run's id in its environment
(RUN_MARKER), so the module's process carries it in /proc/<pid>/environ, and so does whatever
the module starts with its environment (a command's shell, the bench's load job). An engine does
not: the collection starts it with an environment of its own. A run whose ansible-playbook was
killed can leave such processes behind, still changing the host; they are how this host tells
that the run is not over here.

Runs on the host: standard library only, Python 3.8, Linux /proc.
"""

from __future__ import annotations

import errno
import os

from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    ENDED_STATES,
    process_stat,
    started_at,
)

# The variable the playbooks set to the run's id for every module of a lock-taking play.
RUN_MARKER = "BIV100_SERVING_RUN"

# How much of a process's command line a message shows.
COMMAND_CHARS = 80


def _read(proc, pid, name):
    """The bytes of <proc>/<pid>/<name>; None when the process is gone or not ours to read."""
    try:
        with open(os.path.join(proc, str(pid), name), "rb") as stream:
            return stream.read()
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ESRCH, errno.EACCES, errno.EPERM):
            return None
        raise


def marker(proc, pid):
    """The run id pid carries in its environment, or None."""
    raw = _read(proc, pid, "environ")
    prefix = RUN_MARKER.encode("ascii") + b"="
    for entry in (raw or b"").split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "surrogateescape")
    return None


def self_and_ancestors(proc):
    """This process and every process above it: the run asking, never one to wait for."""
    chain = []
    pid = os.getpid()
    while pid > 0 and pid not in chain:
        chain.append(pid)
        stat = process_stat(pid, proc)
        pid = stat["ppid"] if stat else 0
    return set(chain)


def _folder_identity(path):
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def sees_folder(proc, pid, folder, identity):
    """Whether pid sees `identity` (device, inode) at `folder`, through its own root and mounts.

    A process in another mount namespace (a container, or another lab host on the same machine)
    sees another folder there, or none: it does not work on this host's state store.
    """
    seen = _folder_identity(os.path.join(proc, str(pid), "root") + os.path.abspath(folder))
    return seen is not None and seen == identity


def short_command(argv):
    """argv as an operator recognises it: each path by its file name (an Ansible module run from
    a file is AnsiballZ_<module>.py; one piped to the interpreter shows the interpreter alone),
    cut to COMMAND_CHARS."""
    text = " ".join(os.path.basename(word) if word.startswith("/") else word for word in argv)
    text = text or "?"
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."


def run_processes(run_id, state_dir, proc="/proc"):
    """The processes of run `run_id` working on this host: [{pid, command, started_at}] by pid.

    A process counts when it carries the run's marker and sees this host's `state_dir`; this
    process and its ancestors never count. Only processes whose environment this one may read are
    seen (its user's, or all of them as root).
    """
    identity = _folder_identity(state_dir)
    if not run_id or identity is None:
        return []
    asking = self_and_ancestors(proc)
    found = []
    for pid in sorted(int(entry) for entry in os.listdir(proc) if entry.isdigit()):
        if pid in asking:
            continue
        if marker(proc, pid) != run_id or not sees_folder(proc, pid, state_dir, identity):
            continue
        stat, argv = process_stat(pid, proc), _read(proc, pid, "cmdline")
        if stat is None or stat["state"] in ENDED_STATES:
            continue  # it ended while it was looked at
        words = [word.decode("utf-8", "surrogateescape") for word in (argv or b"").split(b"\0")]
        command = short_command(filter(None, words))
        found.append({"pid": pid, "command": command, "started_at": started_at(stat["start_ticks"])})
    return found


def describe_processes(processes):
    """`pid 4321 (python3 AnsiballZ_engine_health.py, since T), ...`"""
    return ", ".join(
        "pid %d (%s, since %s)" % (process["pid"], process["command"], process["started_at"])
        for process in processes
    )
