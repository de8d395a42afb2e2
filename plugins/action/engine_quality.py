# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""biv100.serving.engine_quality: the quality gate, all on the controller but the asking.

The set is loaded and checked here (a bad set fails before any request is sent), its chat
requests go to the host's engine through biv100.serving.engine_probe in one module call, and
the answers are scored here and compared with the baseline release's score. Missing the gate
is data (`passed`), for the playbook to act on; the task fails only when the engine could not
be asked at all. The format of a set: plugins/plugin_utils/_quality.py.
"""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.biv100.serving.plugins.plugin_utils._quality import (
    QualityError,
    chat_requests,
    compare,
    evaluate,
    load_set,
    resolve_set,
    simulated,
)

PROBE_MODULE = "biv100.serving.engine_probe"
SETS = Path(__file__).resolve().parents[2] / "files" / "quality"
KEY_REFUSED = (401, 403)

# What plugins/modules/engine_quality.py documents; tests/unit checks the two agree.
ARGUMENT_SPEC = dict(
    url=dict(type="str", default="http://127.0.0.1:8000"),
    api_key=dict(type="str", no_log=True),
    served_model_name=dict(type="str"),
    set=dict(type="str", default="default"),
    baseline=dict(type="dict", options=dict(
        release=dict(type="str", required=True),
        score=dict(type="float", required=True),
    )),
    bound=dict(type="float", required=True),
    timeout=dict(type="float", default=60),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(ARGUMENT_SPEC)
        if args["bound"] < 0:
            raise AnsibleActionFail(f"bound must be at least 0, not {args['bound']}")
        if args["timeout"] <= 0:
            raise AnsibleActionFail(f"timeout must be above 0, not {args['timeout']}")
        baseline = args["baseline"]
        if baseline is not None and not 0 <= baseline["score"] <= 1:
            raise AnsibleActionFail(f"baseline score must be from 0 to 1, not {baseline['score']}")
        try:
            quality_set = load_set(resolve_set(args["set"], SETS))
        except QualityError as error:
            raise AnsibleActionFail(str(error)) from None

        # Only engine_probe's documented options travel: the host half is that module, unchanged.
        module_args = {"url": args["url"],
                       "requests": chat_requests(quality_set, args["served_model_name"], args["timeout"])}
        if args["api_key"]:
            module_args["api_key"] = args["api_key"]
        answered = self._execute_module(PROBE_MODULE, module_args=module_args, task_vars=task_vars)
        if answered.get("failed"):
            return dict(answered, msg=f"the quality set could not be sent to {args['url']}: "
                                      f"{answered.get('msg')}")
        results = answered.get("results") or []
        refusal = unaskable(results, args["url"])
        if refusal:
            return dict(result, failed=True, changed=False, msg=refusal)

        try:
            evaluation = evaluate(quality_set, results)
        except QualityError as error:
            raise AnsibleActionFail(str(error)) from None
        comparison = compare(evaluation.score, baseline, args["bound"])
        result.update(
            changed=False,
            set=quality_set.name,
            score=evaluation.score,
            cases=evaluation.cases,
            correct=evaluation.correct,
            failed_cases=[{"name": verdict.name, "expected": verdict.expected, "given": verdict.given}
                          for verdict in evaluation.failed],
            baseline=baseline,
            deviation=None if comparison.deviation is None else round(comparison.deviation, 6),
            bound=args["bound"],
            passed=comparison.passed,
            simulated=simulated(results),
            msg=comparison.msg,
        )
        return result


def unaskable(results: list[dict], url: str) -> str | None:
    """Why the engine could not be asked, when no case got an answer to score: nothing answered
    at all (refused, timed out), or the key was refused every time. A score of 0 would say the
    release's model is wrong when it is the address or the key."""
    if not results:
        return f"the engine at {url} returned no answers"
    if all(result.get("status") is None for result in results):
        return f"the engine at {url} could not be asked: {results[0].get('error')}"
    if all(result.get("status") in KEY_REFUSED for result in results):
        return (f"the engine at {url} refused every request (HTTP {results[0]['status']}): "
                f"check api_key")
    return None
