# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's engines on a host. For every engine engine_process starts, whatever manager
runs it, it keeps the pid file <name>.pid and the launch record <name>.json in one folder
(PID_DIR), so that folder lists the engines the collection started, whatever the inventory names
now. For each one that runs: its manager, its processes, the TCP ports they listen on and the
GPUs it sees (its CUDA_VISIBLE_DEVICES).

Runs on the host: standard library only, Python 3.8, Linux /proc.
"""

from __future__ import annotations

import os
import stat

from ansible_collections.biv100.serving.plugins.module_utils._engine_group import remaining
from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import (
    engine_of_pid_file,
    launch_record_path,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import (
    PID_DIR,
    environment,
    started_at,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import read_json

PID_SUFFIX = ".pid"


def pid_files(pid_dir=PID_DIR):
    """Every regular *.pid file of the folder, sorted; none when it does not exist."""
    try:
        names = sorted(os.listdir(pid_dir))
    except OSError:
        return []
    found = []
    for path in (os.path.join(pid_dir, name) for name in names if name.endswith(PID_SUFFIX)):
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            continue  # gone meanwhile: its engine stopped
    return found


def engine_name(pid_file):
    """The engine a pid file is kept for: its file name without .pid."""
    name = os.path.basename(pid_file)
    return name[:-len(PID_SUFFIX)] if name.endswith(PID_SUFFIX) else name


def device_items(value):
    """The GPUs a CUDA_VISIBLE_DEVICES value names, as written (indexes or UUIDs); None when it
    is unset, which shows the process every GPU."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


def shared_devices(wanted, held):
    """The GPUs two CUDA_VISIBLE_DEVICES item lists (None: every GPU) have in common, as words
    ("GPU 0,1"), or None."""
    if wanted is None and held is None:
        return "every GPU"
    if wanted is None or held is None:
        shared = held if wanted is None else wanted
    else:
        shared = [item for item in wanted if item in held]
    return "GPU %s" % ",".join(shared) if shared else None


class OwnEngine(object):
    """A running engine of the collection's: the process its pid file names, verified by the
    start time in its launch record, with its whole process group."""

    def __init__(self, pid_file, engine, manager, pids, ports, visible_devices):
        self.name = engine_name(pid_file)
        self.pid_file = pid_file
        self.engine = engine
        self.pid = engine.pid
        self.manager = manager
        self.pids = pids
        self.ports = ports
        self.visible_devices = visible_devices

    def holds(self, port, wanted_devices):
        """What this engine holds of a TCP port and of the GPUs of a CUDA_VISIBLE_DEVICES item
        list (None: every GPU), as words ("port 8000", "GPU 0,1"); [] when nothing."""
        held = []
        if port is not None and port in self.ports:
            held.append("port %d" % port)
        devices = shared_devices(wanted_devices, device_items(self.visible_devices))
        if devices:
            held.append(devices)
        return held

    def described(self):
        """The engine as a sentence names it: `vllm (pid 4242, pidfile)`."""
        return "%s (pid %d, %s)" % (self.name, self.pid, self.manager)

    def fact(self):
        return {
            "name": self.name,
            "pid": self.pid,
            "manager": self.manager,
            "started_at": started_at(self.engine.stat["start_ticks"]),
            "pid_file": self.pid_file,
            "ports": list(self.ports),
            "visible_devices": self.visible_devices,
        }


def running_engines(files, listeners):
    """The OwnEngine of each pid file that names its running engine (a pid file without its
    launch record, or naming an ended or other process, names none). `listeners` are
    _listening_ports.listening_ports()."""
    engines = []
    for pid_file in files:
        engine, _stale = engine_of_pid_file(pid_file, None)
        if engine is None:
            continue
        record = read_json(launch_record_path(pid_file), default={})
        pids = remaining(engine) or [engine.pid]
        ports = sorted(set(
            listener["port"] for listener in listeners if set(listener["pids"]) & set(pids)
        ))
        visible = (environment(engine.pid) or {}).get("CUDA_VISIBLE_DEVICES")
        engines.append(OwnEngine(pid_file, engine, record.get("manager", "pidfile"), pids, ports, visible))
    return engines
