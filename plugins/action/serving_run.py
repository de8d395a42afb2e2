# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""biv100.serving.serving_run: write a phase boundary into the host's run record.

The record (plugins/plugin_utils/_run_record.py) is the host's fact `serving_run`: the phase the
host is in, the instance it is about, what each phase proved and any failure. Everything after
a phase reads it there: the deploy's rescue, the release record, the canary analysis and the
ledger callback. Nothing runs on a host and no connection is opened.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail

from ansible_collections.biv100.serving.plugins.plugin_utils import _run_record as run_record
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_action import ControllerAction

# The run's id (playbooks/tasks/name_run.yml), which tells this run's record from a cached one.
RUN_VARIABLE = "serving_run_id"

ARGUMENT_SPEC = {
    "phase": {"type": "str", "choices": list(run_record.PHASES)},
    "instance": {"type": "raw"},
    "failed": {"type": "dict"},
    "failed_task": {"type": "str"},
    **{name: {"type": "dict"} for name in run_record.RESULTS},
}


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args: dict, task_vars: dict) -> dict:
        host = task_vars.get("inventory_hostname", "")
        run = str(task_vars.get(RUN_VARIABLE) or "")
        if not run:
            raise AnsibleActionFail(f"{host}: {RUN_VARIABLE} is not set; the playbook names its run "
                                    "(playbooks/tasks/name_run.yml) before it records one")
        previous = (task_vars.get("ansible_facts") or {}).get(run_record.FACT)
        try:
            record = run_record.update(previous, run=run, host=host, **args)
        except run_record.RunRecordError as error:
            raise AnsibleActionFail(f"{host}: {error}") from None
        return dict(changed=False, ansible_facts={run_record.FACT: record}, record=record,
                    msg=f"{host}: {record['phase']} phase"
                        + (f" of {record['instance']}" if record["instance"] else "")
                        + (f"; {record['failure']}" if record.get("failure") else ""))
