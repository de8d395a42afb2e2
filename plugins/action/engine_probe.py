# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller half of biv100.serving.engine_probe: run functional probe suites against a host's
engine and judge the answers.

The suites are read and checked here (a bad suite fails before any request is sent), their
requests go to the host in one module call, and each probe's jmespath expectations are
evaluated here on what came back. With `suites`, the task fails when any probe does; the
per-probe verdicts, the table and the answers are returned and written to `results_file`.
Called with only the module's own options, it is the module alone.
"""

from __future__ import annotations

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import (
    SuiteError,
    judge,
    load_suites,
    module_request,
    select,
    table,
    with_values,
    write_results,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import project_root

MODULE = "biv100.serving.engine_probe"
SUITE_OPTIONS = ("suites", "values", "tags", "skip", "skip_tags", "checks", "results_file")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if "suites" in args and "requests" in args:
            # The module would refuse the pair, but it is sent only the requests made of suites.
            raise AnsibleActionFail("parameters are mutually exclusive: requests|suites")
        if "suites" not in args:
            return self._execute_module(MODULE, module_args=args, task_vars=task_vars)
        suite_args = {key: args.pop(key, None) for key in SUITE_OPTIONS}
        try:
            values = dict(suite_args["values"] or {})
            probes = [with_values(probe, values) for probe in select(
                load_suites(list(suite_args["suites"])), list(suite_args["tags"] or []),
                list(suite_args["skip"] or []), list(suite_args["skip_tags"] or []),
                list(suite_args["checks"] or []))]
            args["requests"] = [module_request(probe) for probe in probes]
        except SuiteError as error:
            raise AnsibleActionFail(str(error)) from None
        if not probes:
            raise AnsibleActionFail("no probe selected: the suites are empty or probe_tags matches none")

        answered = self._execute_module(MODULE, module_args=args, task_vars=task_vars)
        if answered.get("failed"):
            return answered
        verdicts = [judge(probe, answer) for probe, answer in zip(probes, answered["results"])]
        failed = [verdict for verdict in verdicts if not verdict.passed]
        host = task_vars.get("inventory_hostname")
        summary = f"{len(verdicts) - len(failed)}/{len(verdicts)} probes passed"
        document = {
            "host": host,
            "summary": summary,
            "probes": [verdict.as_dict() for verdict in verdicts],
            "answers": answered["results"],
        }
        results_file = suite_args["results_file"]
        if results_file:
            # A relative path is the project's (where ansible.cfg is), never the collection's.
            results_file = str(project_root(C.CONFIG_FILE) / results_file)
            write_results(results_file, document)
        result.update(
            changed=False,
            summary=summary,
            probes=document["probes"],
            table=table(verdicts),
            failed_probes=[verdict.name for verdict in failed],
            results_file=results_file,
        )
        if failed:
            first = failed[0]
            result.update(failed=True, msg=(
                f"{host}: {len(failed)} of {len(verdicts)} probes failed, first {first.name} "
                f"(guards: {first.guards}): expected {first.failed_expectation}; the answer: "
                f"{first.excerpt}"))
        else:
            result["msg"] = f"{host}: {summary}"
        return result
