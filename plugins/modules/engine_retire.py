#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_retire
short_description: Retire the collection's engines a host no longer runs
version_added: 0.2.0
description:
  - Retires an engine - stops it by the manager its launch record names and removes its systemd
    unit or supervisord program file and its pid file, so that nothing starts it again; its env
    file and log stay, for the post-mortem.
  - With O(layout), the names of every engine the host is to run, it retires every engine of the
    collection's on the host (a pid file in O(pid_dir), or a unit or program file of the host's
    manager) that O(layout) does not name; with O(name), that one engine.
  - A pid file naming no running engine is removed without it being a change.
  - M(biv100.serving.engine_process) starts and stops one engine, and makes way for it; this
    module keeps the host to its layout once every engine of the layout runs.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  name:
    description: The engine to retire. Excludes O(layout).
    type: str
  layout:
    description: The names of every engine the host is to run; every other one is retired. Excludes O(name).
    type: list
    elements: str
extends_documentation_fragment:
  - biv100.serving.engine_manager
  - biv100.serving.run_lock
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports what it would retire; stops and removes nothing.
  diff_mode:
    support: full
    details: The collection's engines on the host before and after.
  platform:
    support: full
    platforms: linux
notes:
  - The collection's engines are those whose pid files are in O(pid_dir); an engine started with
    another pid file is left out when O(layout) is given.
seealso:
  - module: biv100.serving.engine_process
"""

EXAMPLES = r"""
- name: Retire the engines the host no longer runs
  biv100.serving.engine_retire:
    layout: [vllm-1, vllm-2]

- name: Retire one engine
  biv100.serving.engine_retire:
    name: vllm-3
"""

RETURN = r"""
name:
  description: O(name); null with O(layout).
  returned: always
  type: str
  sample: vllm-3
manager:
  description: The host's manager, by which an engine without a launch record is retired.
  returned: always
  type: str
  choices: [systemd, supervisord, pidfile]
  sample: systemd
action:
  description: V(retire) when the task retired any engine (or would, in check mode), else V(none).
  returned: always
  type: str
  choices: [none, retire]
retired:
  description:
    - The engines retired (or that would be, in check mode), each with its C(name), C(manager),
      the C(pid) it ran as (null when it was not running), C(action) V(retire) and the unit or
      program file C(removed) (null when none).
  returned: always
  type: list
  elements: dict
  sample:
    - name: vllm
      manager: pidfile
      pid: 48213
      action: retire
      removed: null
kept:
  description: The engines of O(layout) the host has; empty with O(name).
  returned: always
  type: list
  elements: str
  sample: [vllm-1, vllm-2]
"""

import contextlib

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._engine_identity import EngineError
from ansible_collections.biv100.serving.plugins.module_utils._engine_managers import (
    MANAGERS,
    choose_manager,
)
from ansible_collections.biv100.serving.plugins.module_utils._engine_process import PID_DIR
from ansible_collections.biv100.serving.plugins.module_utils._engine_retire import (
    changed_anything,
    retire,
    retirement_candidates,
    retirement_words,
)
from ansible_collections.biv100.serving.plugins.module_utils._run_lock import NotHeld, fenced
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str"),
            layout=dict(type="list", elements="str"),
            pid_dir=dict(type="path", default=PID_DIR),
            manager=dict(type="str", choices=["auto"] + list(MANAGERS), default="auto"),
            stop_timeout=dict(type="int", default=30),
            systemctl=dict(type="path"),
            supervisorctl=dict(type="path"),
            supervisor_conf_dir=dict(type="path"),
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
        ),
        required_one_of=[("name", "layout")],
        mutually_exclusive=[("name", "layout")],
        supports_check_mode=True,
    )
    # The manager of each engine retired is given that engine's pid file (_engine_retire.manager_of).
    params = dict(module.params, pid_file=None)
    name, layout = params["name"], params["layout"]
    try:
        host_manager = choose_manager(dict(params, name=name or ""), module.run_command)
        if name:
            kept, names = [], [name]
        else:
            present = retirement_candidates(params, host_manager)
            kept = [other for other in present if other in layout]
            names = [other for other in present if other not in layout]
        # Only while the run holds the host's lock, checked under its flock (no take-over between).
        with fenced(params["state_dir"], writing="retiring %s" % ", ".join(names)) \
                if names and not module.check_mode else contextlib.nullcontext():
            done = [retire(params, module.run_command, other, host_manager.name, True, module.check_mode)
                    for other in names]
    except NotHeld as error:
        module.fail_json(msg=str(error), name=name, action="none")
    except EngineError as error:
        module.fail_json(msg=str(error), **error.extra)
    except OSError as error:
        module.fail_json(msg="%s: %s" % (name or "retiring", error))
    retired = [entry for entry in done if changed_anything(entry)]
    if retired:
        text = "; ".join(retirement_words(entry, module.check_mode) for entry in retired)
    elif name:
        text = "%s is not running and has no unit or program file" % name
    else:
        text = "nothing to retire"
    if kept:
        text += "; kept %s" % ", ".join(kept)
    result = dict(changed=bool(retired), name=name, action="retire" if retired else "none",
                  manager=host_manager.name, retired=retired, kept=kept, msg=text)
    if module._diff:
        result["diff"] = {
            "before": {"engines": sorted(kept + [entry["name"] for entry in retired])},
            "after": {"engines": kept},
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
