# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The canary analysis: which host the canary is measured against, what each side's samples are,
and the verdict that steers the rollout. The statistics are the judge's (_canary_judge.py).

The plan (canary_plan), decided before any host changes:

- no analysis when it is switched off, when the throughput gate is not measured (there is
  nothing to compare), when the rollout's first batch is more than the canary, when the fleet
  is the canary alone (nothing waits on its verdict), or when the canary has nothing to change;
- else the baseline is the first host after the canary, in rollout order, that runs the release
  the canary runs now (good, or the vendor's files when it has none), with as many GPUs and the
  same engine instances, all of them running: measured in the same window, side by side with
  the canary (`same window`). serving_canary_baseline names one, which must be such a host;
- where no host is, the canary's own figures recorded with that release (`historical`): the
  weaker kind, since the two were not measured under the same conditions.

The figures of a side, by metric, one per engine instance and trial (the judge's unit):

- `score` (the weighted token score) and `output_tps` (output tokens/s) of the trial's bench,
  as vLLM's serving benchmark counts them;
- `ttft_ms`, `tpot_ms` and `e2e_ms`: the median of the trial's requests' figures;
- per instance, measured once: `quality` (the quality set's score) and `probes` (the share of
  the functional probes that passed).

A trial's canary figure is paired with the baseline's of the same instance and trial: they were
measured in the same seconds. Before the canary changes, the two hosts are benched together on
the release they both run (the A/A trials, `trials_before`), so that the judge removes their
own gap (difference in differences: _canary_judge.py). A historical baseline has one recorded
figure per instance, which every trial of the instance is paired with, and no A/A trials.

The score and the probes are critical, as the competition's gates are, and so is the quality
set, which the canary's must hold to the baseline's: a regression of any of them fails the
canary whatever the rest says.
"""

from __future__ import annotations

import math
import statistics

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_judge import Metric, judge
from ansible_collections.biv100.serving.plugins.plugin_utils._engine_instances import recorded_instance
from ansible_collections.biv100.serving.plugins.plugin_utils._objective import describe, limits_text, parse_limit

SAME_WINDOW = "same window"
HISTORICAL = "historical"
# A trial's figures: the bench's own, and the median of its requests' latencies (the key in the
# bench's per-request samples).
RUN_FIGURES = ("score", "output_tps")
LATENCY_FIGURES = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_ms"}
TRIAL_FIGURES = (*RUN_FIGURES, *LATENCY_FIGURES)
# The objective's limit that stands for a trial's latency figure when the release changes its
# engine's concurrency, and the settings that change it.
LIMITED_FIGURE = {"ttft_ms": "ttft_p99_ms", "tpot_ms": "tpot_p99_ms"}
CONCURRENCY_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill")
# Kayenta's groups and their weights, out of 100: what the engine makes, how long its answers
# take, and whether they are right (the quality set and the probes).
WEIGHTS = {"throughput": 50, "latency": 30, "correctness": 20}
VERDICTS_ACCEPTABLE = ("marginal", "inconclusive")
# The analysis' settings, by the name of their variable (serving_canary_<name>). Each is the one
# tests/shared/verdict_errors.py measured (docs/benchmarks.md, "How often the canary and the
# tuner are wrong"): three A/A trials and three after the change, up to six while undecided; a
# trial's score held within 5 %, its latencies within 10 %; Kayenta's documented thresholds.
SETTINGS = {"trials": 3, "trials_before": 3, "max_trials": 6, "margin": 0.05, "request_margin": 0.10,
            "thresholds": {"pass": 95, "marginal": 75}, "accept": []}


def metrics(margin: float, request_margin: float, quality_margin: float, latency: dict | None = None,
            concurrency_changes=()) -> list[Metric]:
    """The metrics judged: a trial's throughput is held to `margin`; its latencies, the medians of
    a few dozen requests, vary more and are held to the wider `request_margin`.

    A release that changes how many requests the engine runs at once (concurrency_changes) trades
    each request's speed for the engine's throughput by design: its TTFT and TPOT are then held
    to the objective's limit (`latency`, the throughput gate's) instead of "must not increase" -
    a factor of the baseline's as that factor, an absolute one by the canary's gate alone (which
    held it), none at all when the objective has no limit. E2E, at the bench's fixed load, is the
    throughput's other face and stays judged."""
    latency_metrics = [Metric(name, "lower", request_margin, "latency") for name in LATENCY_FIGURES]
    if concurrency_changes:
        latency_metrics = [metric for metric in (_limited(metric, latency) for metric in latency_metrics) if metric]
    return [
        Metric("score", "higher", margin, "throughput", critical=True),
        Metric("output_tps", "higher", margin, "throughput"),
        *latency_metrics,
        Metric("quality", "higher", quality_margin, "correctness", critical=True, exact=True),
        Metric("probes", "higher", 0.0, "correctness", critical=True, exact=True),
    ]


def _limited(metric: Metric, latency: dict | None) -> Metric | None:
    """A latency metric held to the objective's limit on its p99 figure, or None when the canary
    does not judge it (an absolute limit, or none)."""
    figure = LIMITED_FIGURE.get(metric.name)
    if figure is None:
        return metric
    parsed = parse_limit((latency or {}).get(figure)) if figure in (latency or {}) else None
    if parsed is None or parsed[0] != "factor":
        return None
    return Metric(metric.name, "lower", max(parsed[1] - 1.0, 0.0), metric.group)


def latency_judgement(latency: dict | None, concurrency_changes) -> str | None:
    """How the canary judged its latencies, said when they were not held to "must not increase"."""
    if not concurrency_changes:
        return None
    return (f"the release changes {'; '.join(concurrency_changes)}: TTFT and TPOT judged against "
            f"{limits_text(latency)}")


def concurrency_changes(instances, recorded_engine: dict | None) -> list[str]:
    """`vllm: max_num_seqs 2 -> 8` for each setting of CONCURRENCY_SETTINGS the new settings of an
    engine instance change against what its host's current release recorded; none without a
    record (the vendor's files)."""
    if not recorded_engine:
        return []
    changes = []
    for instance in instances or ():
        before = recorded_instance(recorded_engine, instance["name"]).get("args") or {}
        after = (instance.get("record") or {}).get("args") or {}
        for name in CONCURRENCY_SETTINGS:
            if name in before and before.get(name) != after.get(name):
                label = f"{instance['name']}: " if len(instances) > 1 else ""
                changes.append(f"{label}{name} {before.get(name)} -> {after.get(name)}")
    return changes


def trial_figures(bench: dict) -> dict:
    """A trial's figures from its bench result (engine_bench's, or what a release recorded)."""
    figures = {name: float(bench[name]) for name in RUN_FIGURES if _number(bench.get(name))}
    per_request = bench.get("samples") or {}
    for name, key in LATENCY_FIGURES.items():
        values = [float(value) for value in per_request.get(key) or () if _number(value)]
        if values:
            figures[name] = statistics.median(values)
    return figures


def instance_trials(benches) -> dict:
    """{instance: [a trial's figures, in trial order]} of one side's benches; the instance is the
    bench label's part after the host (`lab-h1/vllm-1`), '' for a host's only engine."""
    trials: dict[str, list[dict]] = {}
    for bench in benches or ():
        if bench:
            label = str(bench.get("label") or "")
            trials.setdefault(label.partition("/")[2], []).append(trial_figures(bench))
    return trials


def paired(canary_benches, baseline_benches, *, reuse: bool = False) -> dict:
    """{metric: [(canary, baseline)]}: each canary trial's figures with the baseline's of the same
    instance and trial. `reuse` pairs every trial with the baseline's one figure per instance (a
    historical baseline)."""
    canary, baseline = instance_trials(canary_benches), instance_trials(baseline_benches)
    pairs: dict[str, list[tuple]] = {name: [] for name in TRIAL_FIGURES}
    for instance, trials in canary.items():
        theirs = baseline.get(instance) or []
        for number, ours in enumerate(trials):
            if not theirs or (number >= len(theirs) and not reuse):
                continue
            other = theirs[min(number, len(theirs) - 1)]
            for name in TRIAL_FIGURES:
                if name in ours and name in other:
                    pairs[name].append((ours[name], other[name]))
    return pairs


def correctness_pairs(canary: dict, baseline: dict) -> dict:
    """{quality: [(canary, baseline)], probes: [...]}: each side's quality scores (`qualities`) and
    shares of passed probes (`probe_shares`, else from `probes`, its verdict lists), one per
    instance."""
    def shares(side):
        if side.get("probe_shares") is not None:
            return [float(share) for share in side["probe_shares"] if _number(share)]
        return [sum(1 for verdict in verdicts if verdict.get("passed")) / len(verdicts)
                for verdicts in side.get("probes") or () if verdicts]

    def scores(side):
        return [float(value) for value in side.get("qualities") or () if _number(value)]

    return {"quality": _zipped(scores(canary), scores(baseline)), "probes": _zipped(shares(canary), shares(baseline))}


def historical_side(gates: dict | None, instances) -> dict:
    """A side made of what a release recorded for these instances: its gate bench (labelled by
    instance), quality score and, since a release is marked good only when every probe passed,
    probes that all passed."""
    benches, qualities, instances = [], [], list(instances)
    for name in instances:
        entry = recorded_instance(gates, name)
        if entry.get("bench"):
            # Labelled as engine_instances labels them: the host alone for a host's only engine.
            benches.append({**entry["bench"], "label": "recorded" if len(instances) == 1 else f"recorded/{name}"})
        qualities.append((entry.get("quality") or {}).get("score"))
    return {"benches": benches, "qualities": qualities, "probes": [[{"passed": True}] for _name in instances]}


def analyse(pairs: dict, *, before: dict | None = None, margin: float, request_margin: float, quality_margin: float,
            pass_score: float, marginal_score: float, confidence: float, accept=(), latency: dict | None = None,
            concurrency_changes=()) -> dict:
    """The judge's analysis of the canary's pairs with its baseline (paired and correctness_pairs),
    with the A/A trials' pairs `before`, and whether the rollout may go on: on a pass, or on a
    verdict `accept` names (never a fail). `latency` and `concurrency_changes` as for metrics()."""
    problem = accept_problem(accept)
    if problem:
        raise ValueError(problem)
    analysis = judge(metrics(margin, request_margin, quality_margin, latency, concurrency_changes), pairs,
                     before=before, weights=WEIGHTS, pass_score=pass_score, marginal_score=marginal_score,
                     confidence=confidence)
    analysis["promote"] = analysis["verdict"] == "pass" or analysis["verdict"] in accept
    analysis["accepted"] = analysis["verdict"] != "pass" and analysis["promote"]
    analysis["latency_judged"] = latency_judgement(latency, concurrency_changes)
    return analysis


def _zipped(canary: list, baseline: list) -> list[tuple]:
    """Pairs of two sides' values per instance; a side of one value is every instance's."""
    if len(baseline) == 1 and len(canary) > 1:
        baseline = baseline * len(canary)
    return list(zip(canary, baseline))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# What a release record, the ledger and the report keep of an analysis, and of each metric in it
# (the samples' sizes and quartiles, not the samples: those are in build/canary).
RECORD_KEYS = ("verdict", "score", "accepted", "trials", "trials_before", "latency_judged", "baseline", "reasons",
               "thresholds", "simulated", "metrics")
METRIC_KEYS = ("name", "group", "better", "margin_pct", "critical", "classification", "conclusive", "shift_pct",
               "interval_pct", "confidence", "p_value", "trials", "trials_before", "canary", "baseline")


def canary_record(analysis: dict | None) -> dict | None:
    """What is kept of canary_analysis's result: the verdict, its score and reasons, the baseline,
    and per metric its classification, shift, interval and each side's quartiles."""
    if not analysis or "verdict" not in analysis:
        return None
    record = {key: analysis.get(key) for key in RECORD_KEYS}
    record["metrics"] = [{key: metric.get(key) for key in METRIC_KEYS} for metric in analysis.get("metrics") or ()]
    return record


def verdict_line(analysis: dict, canary: str, baseline: dict, trials: int, trials_before: int = 0) -> str:
    """`gpu1: canary analysis pass, score 100 after 3 trials (3 before the change) against gpu2
    (same window, sub510)`, then the reasons of a verdict that is not a pass."""
    against = baseline.get("host") or canary
    score = "no score" if analysis["score"] is None else f"score {analysis['score']:.0f}"
    before = f" ({trials_before} before the change)" if trials_before else ""
    line = (f"{canary}: canary analysis {analysis['verdict']}{' (accepted)' if analysis['accepted'] else ''}, "
            f"{score} after {trials} trial{'s' if trials != 1 else ''}{before} against {against} "
            f"({baseline.get('kind')}, {baseline.get('release') or 'vendor files'})")
    if analysis["reasons"]:
        line += ": " + "; ".join(analysis["reasons"])
    return line


def canary_settings(given: dict | None) -> tuple[dict, list[str]]:
    """The analysis' settings, each given one (None: not given) in place of its default, and what
    is wrong with them, one sentence each naming the variable."""
    settings, problems = {}, []
    for name, default in SETTINGS.items():
        value = (given or {}).get(name)
        settings[name] = default if value is None else value
    for name, least in (("trials", 1), ("trials_before", 0), ("max_trials", 1)):
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int) and not str(value).isdigit() or int(value) < least:
            problems.append(f"serving_canary_{name} must be a whole number of trials, at least {least}, not {value!r}")
        else:
            settings[name] = int(value)
    if not problems and settings["max_trials"] < settings["trials"]:
        problems.append(f"serving_canary_max_trials ({settings['max_trials']}) must be at least serving_canary_trials "
                        f"({settings['trials']})")
    for name in ("margin", "request_margin"):
        try:
            settings[name] = float(settings[name])
            fits = 0 <= settings[name] < 1
        except (TypeError, ValueError):
            fits = False
        if not fits:
            problems.append(f"serving_canary_{name} must be a fraction in [0, 1) such as 0.05, not {settings[name]!r}")
    thresholds = settings["thresholds"]
    try:
        thresholds = {**SETTINGS["thresholds"], **thresholds}
        thresholds = {key: float(thresholds[key]) for key in ("pass", "marginal")}
        if not 0 <= thresholds["marginal"] <= thresholds["pass"] <= 100:
            raise ValueError
        settings["thresholds"] = thresholds
    except (TypeError, ValueError):
        problems.append("serving_canary_thresholds must be {pass: <score>, marginal: <score>} with "
                        f"0 <= marginal <= pass <= 100, not {settings['thresholds']!r}")
    accept = settings["accept"]
    if isinstance(accept, str):
        accept = [word.strip() for word in accept.split(",") if word.strip()]
    settings["accept"] = list(accept) if isinstance(accept, (list, tuple)) else [accept]
    problem = accept_problem(settings["accept"])
    if problem:
        problems.append(problem)
    return settings, problems


def accept_problem(accept) -> str | None:
    """Why serving_canary_accept names a verdict that cannot let a rollout go on, or None."""
    unknown = [str(value) for value in accept if value not in VERDICTS_ACCEPTABLE]
    if not unknown:
        return None
    return (f"serving_canary_accept: {', '.join(unknown)} cannot be accepted; it takes "
            f"{' and '.join(VERDICTS_ACCEPTABLE)} (a fail never goes on)")


def canary_plan(order, hosts: dict, *, enabled: bool = True, measured: bool = True, first_batch: int = 1,
                baseline: str | None = None, settings: dict | None = None, latency: dict | None = None) -> dict:
    """The plan with its settings, the objective judged (`latency`: the throughput gate's limits)
    and the canary's concurrency changes, and `error` when a setting or the named baseline is
    wrong."""
    resolved, problems = canary_settings(settings)
    plan = dict(decide(order, hosts, enabled=enabled, measured=measured, first_batch=first_batch,
                       baseline=baseline), settings=resolved, before=False, objective=describe(latency),
                concurrency_changes=list((hosts.get(order[0]) or {}).get("concurrency_changes") or ()) if order else [])
    if plan["analyse"] and plan["kind"] == SAME_WINDOW and not problems:
        plan["before"], why = trials_before(hosts[plan["canary"]], resolved["trials_before"])
        plan["why"] += f"; {why}"
    if enabled and problems:
        plan["error"] = "; ".join(problems + ([plan["error"]] if plan.get("error") else []))
    return plan


def decide(order, hosts: dict, *, enabled: bool, measured: bool, first_batch: int, baseline: str | None) -> dict:
    """Whether the canary (order[0]) is analysed, and against what.

    `order` is the rollout's hosts, canary first; `hosts` maps each to what the plan reads of it:
    takes_part, release ({id, status} of what it runs now, id null on the vendor's files), gpus
    (its GPU count), instances (its engine instances' names), engines (the programs they run,
    sorted: a baseline of another engine measures another engine), gates (what its current
    release recorded), and serving (the names of the collection's engines running on it).
    `baseline` is the host serving_canary_baseline names.
    """
    order = list(order)
    if not order:
        return skipped(None, "no host takes part")
    canary = order[0]
    if not enabled:
        return skipped(canary, "serving_canary_analysis is false")
    if not measured:
        return skipped(canary, "the throughput gate is not measured, so there is nothing to compare")
    if len(order) == 1:
        return skipped(canary, "the fleet is the canary alone: no host waits on its verdict")
    if first_batch > 1:
        return skipped(canary, f"the rollout's first batch holds {first_batch} hosts: no canary goes first")
    info = hosts[canary]
    if not info.get("takes_part"):
        return skipped(canary, "the canary has nothing to change")
    release = info.get("release") or {}
    if release.get("id") and release.get("status") != "good":
        return skipped(canary, f"the canary runs {release['id']}, which is {release.get('status')}, not good")

    def unlike(name):
        """Why `name` cannot be the canary's baseline, or None."""
        other = hosts.get(name)
        if other is None:
            return "it is not in this rollout"
        theirs = other.get("release") or {}
        if (theirs.get("id"), theirs.get("status")) != (release.get("id"), release.get("status")):
            return (f"it runs {theirs.get('id') or 'the vendor files'}, not the canary's "
                    f"{release.get('id') or 'vendor files'}")
        if other.get("gpus") != info.get("gpus"):
            return f"it has {other.get('gpus')} GPUs, the canary {info.get('gpus')}"
        if sorted(other.get("instances") or ()) != sorted(info.get("instances") or ()):
            return (f"its engine instances ({', '.join(other.get('instances') or ())}) are not the canary's "
                    f"({', '.join(info.get('instances') or ())})")
        if other.get("engines") != info.get("engines"):
            return (f"its engine is {' and '.join(other.get('engines') or ('unknown',))}, the canary's "
                    f"{' and '.join(info.get('engines') or ('unknown',))}")
        idle = sorted(set(other.get("instances") or ()) - set(other.get("serving") or ()))
        if idle:
            return f"its engine{'s' if len(idle) > 1 else ''} {', '.join(idle)} {'do' if len(idle) > 1 else 'does'} not run"
        return None

    if baseline:
        problem = "it is the canary" if baseline == canary else unlike(baseline)
        if problem:
            return dict(skipped(canary, ""), error=f"serving_canary_baseline={baseline} cannot be {canary}'s "
                                                   f"baseline: {problem}")
        return chosen(canary, baseline, SAME_WINDOW, release)
    for name in order[1:]:
        if unlike(name) is None:
            return chosen(canary, name, SAME_WINDOW, release)
    recorded_benches = [recorded_instance(info.get("gates"), name).get("bench") for name in info.get("instances") or ()]
    if release.get("id") and recorded_benches and all(recorded_benches):
        return chosen(canary, None, HISTORICAL, release)
    return skipped(canary, f"no host serves {release.get('id') or 'the vendor files'} on {info.get('gpus')} GPUs "
                           f"with the canary's engine instances, and {release.get('id') or 'the vendor files'} "
                           "recorded no bench on the canary")


def trials_before(info: dict, count: int) -> tuple[bool, str]:
    """Whether the canary and its baseline are benched together before the canary changes (the A/A
    trials), and why: only when the canary serves every engine instance it is to run."""
    if count < 1:
        return False, ("no trial before the change (serving_canary_trials_before is 0): the hosts' own gap "
                       "counts as the release's")
    idle = sorted(set(info.get("instances") or ()) - set(info.get("serving") or ()))
    if idle:
        return False, (f"no trial before the change: the canary does not serve {', '.join(idle)} now, so the "
                       "hosts' own gap counts as the release's")
    return True, f"their own gap measured by {count} trial{'s' if count != 1 else ''} before the canary changes"


def skipped(canary, why: str) -> dict:
    return {"analyse": False, "canary": canary, "baseline": None, "kind": None, "release": None, "why": why}


def chosen(canary: str, baseline: str | None, kind: str, release: dict) -> dict:
    against = baseline if baseline else f"{canary}'s own figures"
    return {"analyse": True, "canary": canary, "baseline": baseline, "kind": kind, "release": release.get("id"),
            "why": f"against {against} ({kind}, {release.get('id') or 'vendor files'})"}


def engine_program(command) -> str:
    """The program of an engine's command line, its words before the first option: the same
    engine on two hosts is the same program (`python3 -m vllm.entrypoints.openai.api_server`)."""
    words = list(command)
    options = next((index for index, word in enumerate(words) if word.startswith("--")), len(words))
    return " ".join(words[:options])


def candidate(current_release: dict | None, *, takes_part: bool, gpus: dict | None, instances) -> dict:
    """What canary_plan reads of one host of the rollout, as the check play found it: its part in
    the rollout, the release it runs now (its plan's current_release), its GPUs (gpu_facts) and its
    engine instances."""
    current = current_release or {}
    record = current.get("record") or {}
    gpus = gpus or {}
    instances = list(instances or ())
    return {
        "takes_part": bool(takes_part),
        "release": {"id": current.get("id"), "status": record.get("status")},
        "concurrency_changes": concurrency_changes(instances, record.get("engine")),
        "gpus": gpus.get("count"),
        "serving": [engine.get("name") for engine in gpus.get("engines") or ()],
        "instances": [instance["name"] for instance in instances],
        "engines": sorted({engine_program(instance.get("command") or ()) for instance in instances}),
        "gates": record.get("gates"),
    }


def first_batch_size(serial, count: int) -> int:
    """The number of hosts in a rollout's first batch, as Ansible reads `serial` (a number, a
    percentage or a list of them): a percentage of the hosts rounded down but at least one."""
    first = serial[0] if isinstance(serial, (list, tuple)) and serial else serial
    if first in (None, "", 0):
        return count
    text = str(first).strip()
    if text.endswith("%"):
        return max(int(float(text[:-1]) / 100.0 * count), 1)
    return min(int(text), count) or count
