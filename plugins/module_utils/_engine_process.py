# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# Apache License 2.0 (see LICENSE)
"""What the host's /proc says about an engine process, and the tail of its log.

Runs on the host: standard library only, Python 3.8, Linux /proc.
"""

from __future__ import annotations

import errno
import os
import re
import time

# How many log lines a failure message carries.
LOG_TAIL_LINES = 40

# Enough of the log's end to hold LOG_TAIL_LINES lines of a chatty engine.
LOG_TAIL_BYTES = 64 * 1024

# /proc/<pid>/stat states of a process that has ended: zombie, dead.
ENDED_STATES = ("Z", "X")


def _read_proc(pid, name):
    """The bytes of /proc/<pid>/<name>, or None when there is no such process (any more)."""
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as stream:
            return stream.read()
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise


def process_stat(pid):
    """State, process group and start time (clock ticks after boot) of pid, or None.

    The command name in parentheses may hold spaces and parentheses itself, so the fields
    are counted from the last closing parenthesis.
    """
    raw = _read_proc(pid, "stat")
    if raw is None:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return {
        "state": fields[0].decode("ascii"),
        "pgrp": int(fields[2]),
        "start_ticks": int(fields[19]),
    }


def is_alive(pid):
    """Whether pid is a process that has not ended (a zombie has)."""
    stat = process_stat(pid)
    return stat is not None and stat["state"] not in ENDED_STATES


def command_line(pid):
    """The argv of pid, or None when it is gone."""
    raw = _read_proc(pid, "cmdline")
    if raw is None:
        return None
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0")[:-1]]


def environment(pid):
    """The environment pid was started with, or None when it is gone."""
    raw = _read_proc(pid, "environ")
    if raw is None:
        return None
    variables = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.decode("utf-8", "surrogateescape").partition("=")
        if sep:
            variables[key] = value
    return variables


def boot_time():
    """Seconds since the epoch at which the host booted (btime of /proc/stat)."""
    with open("/proc/stat", "rb") as stream:
        for line in stream:
            if line.startswith(b"btime "):
                return int(line.split()[1])
    raise RuntimeError("/proc/stat has no btime line")


def started_at(start_ticks):
    """A process's start time (from its stat) as UTC ISO 8601."""
    seconds = boot_time() + start_ticks / os.sysconf("SC_CLK_TCK")
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def group_members(pgid):
    """The pids of the process group pgid that have not ended."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = process_stat(int(entry))
        if stat and stat["pgrp"] == pgid and stat["state"] not in ENDED_STATES:
            members.append(int(entry))
    return members


# The line engine_process writes to the log before each start ("--- <time> <name> starts: ...").
START_HEADER = re.compile(r"^--- \S+ \S+ starts: ")


def log_tail(path, lines=LOG_TAIL_LINES):
    """The last lines of a log file from its last start on, [] when it does not exist.

    An earlier run's output says nothing about why this start failed, so the tail begins at
    the last start header when there is one among the lines read.
    """
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - LOG_TAIL_BYTES))
            data = stream.read()
    except OSError as error:
        if error.errno == errno.ENOENT:
            return []
        raise
    text = data.decode("utf-8", "replace").splitlines()
    starts = [index for index, line in enumerate(text) if START_HEADER.match(line)]
    return text[starts[-1] if starts else 0:][-lines:]
