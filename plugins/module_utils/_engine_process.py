# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the host's /proc says about an engine process, and the tail of its log.

Runs on the host: standard library only, Python 3.8, Linux /proc.
"""

from __future__ import annotations

import errno
import os
import re
import time

from ansible_collections.biv100.serving.plugins.module_utils._state_store import TIMESTAMP_FORMAT

# Where the collection keeps the pid file of each engine it starts (<name>.pid): every engine in
# it is one of the collection's, whatever the inventory names now.
PID_DIR = "/run/biv100-serving"

# How many log lines a failure message carries.
LOG_TAIL_LINES = 40

# Enough of the log's end to hold LOG_TAIL_LINES lines of a chatty engine.
LOG_TAIL_BYTES = 64 * 1024

# /proc/<pid>/stat states of a process that has ended: zombie, dead.
ENDED_STATES = ("Z", "X")


def _read_proc(pid, name, proc="/proc"):
    """The bytes of <proc>/<pid>/<name>, or None when there is no such process (any more)."""
    try:
        with open(os.path.join(proc, str(pid), name), "rb") as stream:
            return stream.read()
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise


def process_stat(pid, proc="/proc"):
    """State, parent, process group, kernel flags and start time (clock ticks after boot) of
    pid, or None (proc: where /proc is, for tests).

    The command name in parentheses may hold spaces and parentheses itself, so the fields
    are counted from the last closing parenthesis.
    """
    raw = _read_proc(pid, "stat", proc)
    if not raw:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return {
        "state": fields[0].decode("ascii"),
        "ppid": int(fields[1]),
        "pgrp": int(fields[2]),
        "flags": int(fields[6]),
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
    return time.strftime(TIMESTAMP_FORMAT, time.gmtime(seconds))


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

# The longest a tail line may be; longer ones are cut, saying how much was left out.
LOG_LINE_CHARS = 300

# Lines that say nothing about why a start failed: the access log of the health polls that
# wait for it (uvicorn's and http.server's formats), progress bars, throughput reports.
NOISE = (
    re.compile(r'"(?:GET|HEAD) /(?:health|ping|v1/models|version|metrics)[?/ ][^"]*HTTP/[0-9.]+" \d{3}\b'),
    re.compile(r"\b\d{1,3}%(?:\s+Completed)?\s*\|.*\b\d+/\d+\b"),
    re.compile(r"\bAvg prompt throughput: "),
)

TRACEBACK = re.compile(r"Traceback \(most recent call last\):\s*$")
# What Python prints between the tracebacks of one chain of exceptions.
CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
# An error line: logged at ERROR or above (vLLM's `ERROR 11-29 18:00:04 [file.py:1] ...`, a
# worker's `(VllmWorkerProcess pid=7) ERROR ...`, the logging module's `<date> <time> ERROR`),
# a Python exception's last line, or argparse's refusal of an argument.
ERROR_LINE = re.compile(
    r"^(?:\([^)]*\)\s*)?(?:\S+ \S+ )?\[?(?:ERROR|CRITICAL|FATAL)\b"
    r"|^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)(?::|$)"
    r"|^[\w./ -]+: error: "
)


def read_log_end(path):
    """The lines of the last LOG_TAIL_BYTES of a log, None when it does not exist."""
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            offset = max(0, stream.tell() - LOG_TAIL_BYTES)
            stream.seek(offset)
            data = stream.read()
    except OSError as error:
        if error.errno == errno.ENOENT:
            return None
        raise
    lines = data.decode("utf-8", "replace").splitlines()
    # Reading from the middle of the file, the first line is a fragment.
    return lines[1:] if offset else lines


def shown_line(line):
    """What a terminal shows of a line (the last of its carriage-return rewrites), without
    trailing blanks."""
    return line.rsplit("\r", 1)[-1].rstrip()


def is_noise(line):
    return not line.strip() or any(pattern.search(line) for pattern in NOISE)


def cut_line(line, limit=LOG_LINE_CHARS):
    """line, or its start with a marker saying how many characters were cut: at most limit."""
    if len(line) <= limit:
        return line
    cut = len(line) - limit
    # The marker's length depends on the count it shows: settle both (two rounds at most).
    while True:
        marker = " [... %d more characters]" % cut
        keep = limit - len(marker)
        if len(line) - keep == cut:
            return line[:keep] + marker
        cut = len(line) - keep


def block_start(lines):
    """Where the last traceback (with the tracebacks chained before it) or the last run of
    error lines begins; None when there is neither."""
    tracebacks = [index for index, line in enumerate(lines) if TRACEBACK.search(line)]
    if tracebacks:
        start = tracebacks[-1]
        earlier = [index for index in tracebacks if index < start]
        while earlier and start > 0 and lines[start - 1].strip() in CHAINED:
            start = earlier.pop()
        # A logged exception: the error line that says what failed, then its traceback.
        if start > 0 and ERROR_LINE.search(lines[start - 1]):
            start -= 1
        return start
    errors = [index for index, line in enumerate(lines) if ERROR_LINE.search(line)]
    if not errors:
        return None
    start = errors[-1]
    while start > 0 and ERROR_LINE.search(lines[start - 1]):
        start -= 1
    return start


def log_tail(path, lines=LOG_TAIL_LINES):
    """The lines of a log that say why the engine's last start failed; [] when there is no log.

    An earlier run's output says nothing about this start, so the tail begins at the last start
    header among the lines read. Blank lines and noise (health-poll access lines, progress
    bars) are left out. It begins at the last traceback, or else at the last block of error
    lines, when there is one; each line is cut to LOG_LINE_CHARS. At most `lines` lines: a
    longer block keeps its first line and its end, where Python names the exception.
    """
    text = read_log_end(path)
    if text is None:
        return []
    starts = [index for index, line in enumerate(text) if START_HEADER.match(line)]
    kept = [shown_line(line) for line in text[starts[-1] if starts else 0:]]
    kept = [line for line in kept if not is_noise(line)]
    start = block_start(kept)
    if start is not None:
        kept = kept[start:]
    if len(kept) > lines:
        if start is None:
            kept = kept[-lines:]
        else:
            left_out = len(kept) - (lines - 1)
            kept = [kept[0], "[... %d lines left out ...]" % left_out] + kept[-(lines - 2):]
    return [cut_line(line) for line in kept]


def with_log_tail(message, path):
    """(message, tail): a failure message that points at the log's tail, and the tail.

    The tail goes back as its own list, never in the message: ansible-core shows a failed
    task's message twice (its error summary and the result), a list once, one line per item
    whatever the result format.
    """
    tail = log_tail(path)
    if not tail:
        return "%s; log tail (%s): nothing since this start" % (message, path), tail
    return "%s; log tail (%d lines of %s) in log_tail" % (message, len(tail), path), tail
