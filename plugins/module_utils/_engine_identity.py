# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which process is the engine: the live process a manager found, and the pid file (with its
launch record) that every manager keeps, which gpu_facts reads to tell the collection's engine
from foreign GPU holders.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os

from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    ENDED_STATES,
    command_line,
    environment,
    process_stat,
    started_at,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    atomic_write,
    read_json,
    write_json,
)


class EngineError(Exception):
    """A manager could not do what it was asked; the message names what and why."""

    def __init__(self, message, **extra):
        Exception.__init__(self, message)
        self.extra = extra


class Engine(object):
    """A live process verified to be the engine."""

    def __init__(self, pid, stat):
        self.pid = pid
        self.stat = stat

    def observed(self, desired_env):
        actual = environment(self.pid) or {}
        desired = desired_env or {}
        keys = list(desired) + sorted(key for key in actual if key not in desired)
        return {
            "running": True,
            "pid": self.pid,
            "command": command_line(self.pid) or [],
            "env": dict((key, actual.get(key)) for key in keys),
            "started_at": started_at(self.stat["start_ticks"]),
        }


def live_engine(pid):
    stat = process_stat(pid) if pid else None
    if stat is None or stat["state"] in ENDED_STATES:
        return None
    return Engine(pid, stat)


# --- the pid file: every manager keeps it -----------------------------------------------------


def launch_record_path(pid_file):
    return os.path.splitext(pid_file)[0] + ".json"


def read_pid_file(pid_file):
    """The pid file's content, None when there is no pid file."""
    try:
        with open(pid_file) as stream:
            return stream.read().strip()
    except FileNotFoundError:
        return None


def record_pid(pid_file, engine, command, manager):
    """Write the pid file and, beside it, what identifies the process (pid and start time)
    and which manager runs it."""
    os.makedirs(os.path.dirname(pid_file), exist_ok=True)
    write_json(
        launch_record_path(pid_file),
        {
            "pid": engine.pid,
            "start_ticks": engine.stat["start_ticks"],
            "command": command,
            "manager": manager,
        },
    )
    atomic_write(pid_file, ("%d\n" % engine.pid).encode("ascii"))


def launched_command(pid_file):
    """The command the engine of `pid_file` was started with, as its launch record keeps it;
    None without a record."""
    return read_json(launch_record_path(pid_file), default={}).get("command")


def remove_pid_files(pid_file):
    for path in (pid_file, launch_record_path(pid_file)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def engine_of_pid_file(pid_file, desired_command):
    """(Engine or None, why the pid file is stale or None).

    The launch record's start time identifies the process that was started: a reused pid has
    another start time, and the engine may rewrite its own argv (process titles), so the command
    line is the test only for a pid file without its record.
    """
    content = read_pid_file(pid_file)
    if content is None:
        return None, None
    if not content.isdigit():
        return None, "%s holds no pid" % pid_file
    pid = int(content)
    engine = live_engine(pid)
    if engine is None:
        return None, "%s names process %d, which has ended" % (pid_file, pid)
    record = read_json(launch_record_path(pid_file), default={})
    if record.get("pid") == pid:
        ours = record.get("start_ticks") == engine.stat["start_ticks"]
    else:
        ours = desired_command is not None and command_line(pid) == desired_command
    if not ours:
        return None, "%s names process %d (%s), which is not this engine" % (
            pid_file,
            pid,
            " ".join(command_line(pid) or []),
        )
    return engine, None
