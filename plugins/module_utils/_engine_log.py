# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The engine's log as the managers start it: rotated at each start, a header where each start's
output begins, and the log's tail in the error of a start that failed.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

import os

from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import EngineError
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import with_log_tail
from ansible_collections.biv100.serving.plugins.module_utils._state_store import utc_timestamp


def rotate_log(path, max_bytes, backups):
    """log.<backups-1> → log.<backups>, …, log → log.1, when the log exceeds max_bytes."""
    try:
        if os.path.getsize(path) <= max_bytes:
            return
    except FileNotFoundError:
        return
    if backups < 1:
        os.unlink(path)
        return
    for number in range(backups - 1, 0, -1):
        older = "%s.%d" % (path, number)
        if os.path.exists(older):
            os.replace(older, "%s.%d" % (path, number + 1))
    os.replace(path, path + ".1")


def write_start_header(log_file, name, command):
    """Mark where this start's output begins among the earlier starts' in the log."""
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    with open(log_file, "ab") as log:
        header = "--- %s %s starts: %s\n" % (
            utc_timestamp(),
            name,
            " ".join(command),
        )
        log.write(header.encode("utf-8"))


def start_failure(params, message, **extra):
    message, tail = with_log_tail(message, params["log_file"])
    return EngineError(message, log_tail=tail, **extra)
