# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Making way for a host's engine layout: which of the collection's other engines stand in the
way of an engine about to start (they hold its port or one of its GPUs), which the layout no
longer names, and stopping or retiring each by the manager that started it. A retired engine
leaves nothing that would start it again: no systemd unit, no supervisord program, no pid file
(its env file and log stay, for the post-mortem).

Runs on the host: standard library only, Python 3.8, Linux.
"""

from __future__ import annotations

import os

from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import (
    launch_record_path,
    remove_pid_files,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_managers import choose_manager
from ansible_collections.biv100.serving.plugins.module_utils._listening_ports import listening_ports
from ansible_collections.biv100.serving.plugins.module_utils._own_engines import (
    engine_name,
    pid_files,
    running_engines,
)
from ansible_collections.biv100.serving.plugins.module_utils._state_store import read_json


def pid_file_of(params, name):
    return os.path.join(params["pid_dir"], name + ".pid")


def manager_of(params, name, run_command, fallback):
    """The manager of the engine `name`: the one its launch record names, else `fallback` (the
    host's, for an engine known only by its unit or program file)."""
    pid_file = pid_file_of(params, name)
    recorded = read_json(launch_record_path(pid_file), default={}).get("manager")
    own = dict(params, name=name, pid_file=pid_file, manager=recorded or fallback)
    return choose_manager(own, run_command)


def in_the_way(params, name, port, devices):
    """[(OwnEngine, what it holds)] of the collection's running engines other than `name` that
    hold `port` or a GPU of `devices` (CUDA_VISIBLE_DEVICES items; None: every GPU)."""
    others = [path for path in pid_files(params["pid_dir"]) if engine_name(path) != name]
    if not others:
        return []
    found = []
    for engine in running_engines(others, listening_ports()):
        held = engine.holds(port, devices)
        if held:
            found.append((engine, held))
    return found


def retirement_candidates(params, manager):
    """The engines the collection keeps a trace of on the host: a pid file (of a running engine
    or not), or a unit or program file of the host's manager."""
    names = set(engine_name(path) for path in pid_files(params["pid_dir"]))
    names.update(manager.installed_names())
    return sorted(names)


def retire(params, run_command, name, fallback, remove, check_mode):
    """Stop the engine `name` by its manager; with `remove`, retire it: also remove its unit or
    program file and its pid file. Returns what was (or in check mode would be) done: name,
    manager, pid (of the engine that ran; null when none did), action (stop, retire) and removed
    (the unit or program file removed, or null)."""
    manager = manager_of(params, name, run_command, fallback)
    engine, _stale = manager.find(None)
    definition = None
    if remove and manager.installed_definition() is not None:
        definition = manager.definition_path
    if not check_mode:
        if engine is not None:
            manager.stop(engine)
        if definition is not None:
            manager.uninstall()
        if remove:
            remove_pid_files(manager.params["pid_file"])
    return {
        "name": name,
        "manager": manager.name,
        "pid": engine.pid if engine is not None else None,
        "action": "retire" if remove else "stop",
        "removed": definition,
    }


def changed_anything(done):
    """Whether a retirement stopped an engine or removed its unit or program file (a pid file
    naming nothing that runs is no engine)."""
    return done["pid"] is not None or done["removed"] is not None


def retirement_words(done, check_mode):
    """One retirement as a clause: `retired vllm (pid 4242, pidfile), which held port 8000`."""
    verb = {"retire": "retired", "stop": "stopped"}[done["action"]]
    if check_mode:
        verb = "would " + done["action"]
    if done["pid"] is not None:
        words = "%s %s (pid %d, %s)" % (verb, done["name"], done["pid"], done["manager"])
    else:
        words = "%s %s (not running)" % (verb, done["name"])
    if done["removed"]:
        words += ", removing %s" % done["removed"]
    if done.get("held"):
        words += ", which held %s" % ", ".join(done["held"])
    return words
