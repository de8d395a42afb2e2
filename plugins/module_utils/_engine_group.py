# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ending the engine's processes: its whole process group when it leads one, SIGTERM, the
grace period, then SIGKILL; and waiting until they are gone.

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import EngineError
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    group_members,
    is_alive,
)

# How often waits look at /proc again.
POLL_SECONDS = 0.1

# How long processes get to vanish after SIGKILL (longer means they are stuck in the kernel).
KILL_WAIT_SECONDS = 10


def leads_group(engine):
    return engine.stat["pgrp"] == engine.pid


def remaining(engine):
    """The engine's processes still alive: its whole group when it leads one, as vLLM's
    tensor-parallel workers are in the group of the server that started them."""
    if leads_group(engine):
        return group_members(engine.pid)
    return [engine.pid] if is_alive(engine.pid) else []


def wait_until_gone(engine, seconds):
    deadline = time.monotonic() + seconds
    while remaining(engine):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def signal_engine(engine, signum):
    try:
        if leads_group(engine):
            os.killpg(engine.pid, signum)
        else:
            os.kill(engine.pid, signum)
    except ProcessLookupError:
        pass


def terminate(engine, grace_seconds, name):
    """SIGTERM, the grace period, then SIGKILL, to the engine's process group."""
    signal_engine(engine, signal.SIGTERM)
    if wait_until_gone(engine, grace_seconds):
        return
    signal_engine(engine, signal.SIGKILL)
    if not wait_until_gone(engine, KILL_WAIT_SECONDS):
        raise EngineError(
            "%s: processes %s of engine %d survived SIGKILL"
            % (name, ", ".join(map(str, remaining(engine))), engine.pid)
        )
