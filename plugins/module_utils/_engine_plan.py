# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What an engine_process task does to its engine, and how its diff and message say so.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.module_utils._engine_retire import retirement_words

NOT_RUNNING = {"running": False, "pid": None, "command": [], "env": {}, "started_at": None}

PAST_TENSE = {"start": "started", "restart": "restarted", "stop": "stopped"}


def planned_action(state, engine, drifted):
    if state == "status":
        return "none"
    if state == "stopped":
        return "stop" if engine else "none"
    if state == "restarted":
        return "restart" if engine else "start"
    if engine is None:
        return "start"
    return "restart" if drifted else "none"


def diff_view(observed):
    return dict((key, observed[key]) for key in ("running", "command", "env"))


def desired_view(action, observed, command, env):
    if action == "stop":
        return dict(NOT_RUNNING)
    if action in ("start", "restart"):
        return {"running": True, "command": command, "env": env}
    return observed


def message(name, manager, action, check_mode, after, retired):
    if action != "none":
        text = "%s %s %s by %s" % (
            name,
            "would be" if check_mode else "was",
            PAST_TENSE[action],
            manager,
        )
    elif after["running"]:
        text = "%s runs as pid %d under %s" % (name, after["pid"], manager)
    else:
        text = "%s is not running" % name
    if retired:
        text += "; to make way, %s" % "; ".join(retirement_words(done, check_mode) for done in retired)
    return text
