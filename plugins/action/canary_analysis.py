# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""biv100.serving.canary_analysis: judge a canary's measurements against its baseline's, on the
controller (plugin_utils/_canary_analysis.py, _canary_judge.py).

The sides come as the playbook gathered them: bench results per engine instance and trial
(paired by instance and trial), quality scores and probe verdicts per instance. The benches of
the A/A trials, both hosts on the release they ran before the canary changed, come as `before`.
A historical baseline comes as the gates' figures its release recorded. The verdict is data: the
task fails only on bad input, and the playbook decides what a verdict does to the rollout
(promote says whether it may go on). The analysis is shown as one line, and written with every
pair to build/canary/<release>/<host>.json at the project root.
"""

from __future__ import annotations

import json
import os

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display

from ansible_collections.biv100.serving.plugins.module_utils._state_store import utc_timestamp
from ansible_collections.biv100.serving.plugins.plugin_utils._atomic_file import write_atomic
from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import (
    HISTORICAL,
    METRIC_KEYS,
    SAME_WINDOW,
    SETTINGS,
    analyse,
    correctness_pairs,
    historical_side,
    paired,
    verdict_line,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._controller_action import ControllerAction
from ansible_collections.biv100.serving.plugins.plugin_utils._project_folder import project_root

display = Display()

SIDE = {
    "host": {"type": "str"},
    "release": {"type": "str"},
    "benches": {"type": "list", "elements": "dict", "default": []},
    "qualities": {"type": "list", "elements": "raw", "default": []},
    "probes": {"type": "list", "elements": "list", "default": []},
}
ARGUMENT_SPEC = {
    "canary": {"type": "dict", "required": True, "options": SIDE},
    "baseline": {"type": "dict", "required": True, "options": dict(
        SIDE,
        kind={"type": "str", "choices": [SAME_WINDOW, HISTORICAL], "default": SAME_WINDOW},
        gates={"type": "dict"},
        instances={"type": "list", "elements": "str", "default": []},
    )},
    "before": {"type": "dict", "options": {
        "canary": {"type": "list", "elements": "dict", "default": []},
        "baseline": {"type": "list", "elements": "dict", "default": []},
    }},
    "trials": {"type": "int", "required": True},
    "margin": {"type": "float", "default": SETTINGS["margin"]},
    "request_margin": {"type": "float", "default": SETTINGS["request_margin"]},
    "quality_margin": {"type": "float", "required": True},
    "pass_score": {"type": "float", "default": SETTINGS["thresholds"]["pass"]},
    "marginal_score": {"type": "float", "default": SETTINGS["thresholds"]["marginal"]},
    "confidence": {"type": "float", "default": 0.98},
    "accept": {"type": "list", "elements": "str", "default": []},
    "latency": {"type": "dict"},
    "concurrency_changes": {"type": "list", "elements": "str", "default": []},
    "results_dir": {"type": "path"},
}


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def act(self, args: dict, task_vars: dict) -> dict:
        result = {}
        canary, baseline = args["canary"], args["baseline"]
        if not canary["host"] or not canary["release"]:
            raise AnsibleActionFail("canary: host and release are required")
        if "/" in canary["release"] or canary["release"].startswith("."):
            # It names a folder of the results: a path in it would write elsewhere.
            raise AnsibleActionFail(f"canary.release must be a plain name such as sub510, got {canary['release']!r}")
        if baseline["kind"] == HISTORICAL:
            if not baseline["gates"] or not baseline["instances"]:
                raise AnsibleActionFail("baseline: a historical baseline needs the gates its release recorded "
                                        "and the instances to read from them")
            baseline = dict(baseline, **historical_side(baseline["gates"], baseline["instances"]))
            before = {}
        elif not baseline["host"]:
            raise AnsibleActionFail("baseline: a same-window baseline needs its host")
        else:
            before = args["before"] or {}
        pairs = dict(paired(canary["benches"], baseline["benches"], reuse=baseline["kind"] == HISTORICAL),
                     **correctness_pairs(canary, baseline))
        before_pairs = paired(before.get("canary"), before.get("baseline"))
        trials_before = len(before_pairs["score"])
        try:
            analysis = analyse(pairs, before=before_pairs, margin=args["margin"],
                               request_margin=args["request_margin"], quality_margin=args["quality_margin"],
                               pass_score=args["pass_score"], marginal_score=args["marginal_score"],
                               confidence=args["confidence"], accept=args["accept"], latency=args["latency"],
                               concurrency_changes=args["concurrency_changes"])
        except (ValueError, RuntimeError) as error:
            raise AnsibleActionFail(str(error)) from None
        analysis["trials_before"] = trials_before

        against = {"host": baseline["host"] if baseline["kind"] == SAME_WINDOW else None,
                   "kind": baseline["kind"], "release": baseline["release"]}
        simulated = any(bench.get("simulated") for bench in (*canary["benches"], *baseline["benches"]) if bench)
        line = (verdict_line(analysis, canary["host"], against, args["trials"], trials_before)
                + (f" ({analysis['latency_judged']})" if analysis["latency_judged"] else "")
                + (" [simulated]" if simulated else ""))
        display.display(line)
        result.update(
            changed=False,
            verdict=analysis["verdict"],
            score=analysis["score"],
            promote=analysis["promote"],
            accepted=analysis["accepted"],
            reasons=analysis["reasons"],
            thresholds=analysis["thresholds"],
            metrics=[{key: metric.get(key) for key in METRIC_KEYS} for metric in analysis["metrics"]],
            canary={"host": canary["host"], "release": canary["release"]},
            baseline=against,
            trials=args["trials"],
            trials_before=trials_before,
            latency_judged=analysis["latency_judged"],
            simulated=simulated,
            msg=line,
            results_file=None,
        )
        if not self._task.check_mode:
            folder = project_root(C.CONFIG_FILE) / (args["results_dir"] or os.path.join("build", "canary"))
            path = folder / canary["release"] / f"{canary['host']}.json"
            document = {key: result[key] for key in ("verdict", "score", "promote", "accepted", "reasons", "thresholds",
                                                     "canary", "baseline", "trials", "trials_before", "latency_judged",
                                                     "simulated")}
            document.update(metrics=analysis["metrics"], written=utc_timestamp(),
                            pairs=pairs, pairs_before=before_pairs)
            try:
                write_atomic(str(path), json.dumps(document, indent=1, sort_keys=True) + "\n")
            except OSError as error:
                raise AnsibleActionFail(f"the analysis could not be written to {path}: {error}") from None
            result["results_file"] = str(path)
        return result
