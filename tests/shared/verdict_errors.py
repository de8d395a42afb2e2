"""How often the canary analysis and the tuner are wrong: a seeded Monte-Carlo simulation of their
verdicts over the engine stand-in's speed model, with no lab and no engine.

Each simulated canary analysis runs as the canary role runs one (roles/canary): the A/A trials
(the canary and its baseline benched together on the release both run), then the trials after
the canary changed, judged once `trials` are in and again after each further trial while the
verdict is undecided, up to `max_trials`, by the analysis the role calls
(_canary_analysis.analyse, with its metrics, margins and thresholds).

A side's figures in a trial are the speed model's for the lab's bench (Sub168 on the lab's
rates, 24 requests of 1024 prompt and 192 output tokens, eight in flight: tests/lab/engine_standin/
speed_model.py), at the host's pace (a host slower by nature, or a release that slows the
engine, runs its prefill and decode rates that much lower and its steps' cost that much
longer), and noise:

- run-to-run noise sigma: each side's trial runs at exp(N(0, sigma)) of its pace, every figure
  alike (a trial on a busier host is slower in everything);
- a latency figure, the median of a trial's few dozen requests, moves by a further
  exp(N(0, sigma)) of its own.

No part of the noise is shared by the two sides of a trial, though in the lab and on a fleet
behind one switch some is (the machine's load): that would cancel in the pairs, so the rates here
are those of the harder case.

What it reports, per noise level (the rate at which the rollout stops is the share of analyses
that do not promote the canary):

- `same release stops`: an unchanged release, on two hosts of the same speed;
- `slower N % caught`: a release that makes the engine N % slower (5, 10, 15);
- `host 3 % slower stops`: an unchanged release on a canary host 3 % slower by nature, with the
  A/A trials and without them (the hosts' gap then counts as the release's).

And for the tuner (tuner_error_rate): the lab's search (files/tune/default.yml: max_num_seqs 1 to
8, max_num_batched_tokens 2048 to 8192, expandable_segments or not, at gpu_memory_utilization
0.95) from Sub168 on the tuning test's bench and objective (tests/integration/data/
long_prompts.yml: 16 requests of about 7,000 prompt and 256 output tokens, 8 in flight, and a
TPOT p99 limit of 1.2 ms), each candidate's true score the speed model's; the candidates the
tuner would never start left out (max_num_seqs below the probes' 2 choices), and those that
fail to start or break the limit (their TPOT p99 is a third above it or more, which no noise
here hides); one noisy bench each, the two best as finalists, three trials each and the
incumbent's, and the tuner's own final judgement (_tune_judge.judge_finalists). Wrong is a
proposal (or the incumbent kept) whose true score is more than 2 % below the best the space
holds.

Run `python benchmarks/verdict_errors.py` for the table docs/benchmarks.md shows; the unit test
tests/unit/plugins/plugin_utils/test_verdict_errors.py holds the defaults to the goals.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass

import itertools

from ansible_collections.biv100.serving.plugins.plugin_utils._canary_analysis import SETTINGS, analyse
from ansible_collections.biv100.serving.plugins.plugin_utils._tune_judge import judge_finalists
from engine_standin import speed_model

# The lab's bench on Sub168 (inventory/lab, files/bench/default.yml): the mean request.
SUB168 = {"max_model_len": 256000, "max_num_seqs": 2, "gpu_memory_utilization": 0.95,
          "max_num_batched_tokens": 4096, "enable_chunked_prefill": True, "enforce_eager": True,
          "dtype": "half", "tensor_parallel_size": 4}
LAB_RATES = {"BIV100_STANDIN_PREFILL_TPS": 200000.0, "BIV100_STANDIN_DECODE_TPS": 6000.0}
PROMPT_TOKENS, OUTPUT_TOKENS = 1024, 192
# The requests in flight (files/bench/default.yml), whatever a side's max_num_seqs.
BENCH_CONCURRENCY = 8
NOISES = (0.01, 0.02, 0.03)
SLOWER = (0.05, 0.10, 0.15)
HOST_GAP = 0.03
# The quality set and the probes do not vary between measurements: both sides score alike.
CORRECTNESS = {"quality": [(0.96875, 0.96875)], "probes": [(1.0, 1.0)]}
QUALITY_MARGIN = 0.04
LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")


@functools.lru_cache(maxsize=None)
def engine_figures(pace: float) -> dict:
    """A trial's figures at `pace` (1: the lab's rates) without noise: the bench's score and
    output tokens/s, and its requests' TTFT, TPOT and E2E in ms."""
    environ = {name: str(rate * pace) for name, rate in LAB_RATES.items()}
    environ[speed_model.STEP_SECONDS_VARIABLE] = str(speed_model.STEP_SECONDS / pace)
    predicted = speed_model.predicted_score(SUB168, PROMPT_TOKENS, OUTPUT_TOKENS, environ,
                                            concurrency=BENCH_CONCURRENCY)
    return {"score": predicted.score, "output_tps": predicted.output_tps,
            **{name: statistics.median(values) for name, values in predicted.latencies.items()}}


class Sides:
    """Noisy trials of a canary and its baseline, each at a pace of its own."""

    def __init__(self, draws: random.Random, noise: float):
        self.draws, self.noise = draws, noise

    def trial(self, pace: float) -> dict:
        exact = engine_figures(pace)
        run = math.exp(self.draws.gauss(0.0, self.noise))
        figures = {}
        for name, value in exact.items():
            if name in LATENCIES:
                figures[name] = value / run * math.exp(self.draws.gauss(0.0, self.noise))
            else:
                figures[name] = value * run
        return figures

    def pairs(self, canary_pace: float, baseline_pace: float, count: int) -> dict:
        pairs: dict[str, list] = {}
        for _trial in range(count):
            canary, baseline = self.trial(canary_pace), self.trial(baseline_pace)
            for name in canary:
                pairs.setdefault(name, []).append((canary[name], baseline[name]))
        return pairs


@dataclass(frozen=True)
class Case:
    """One kind of canary: its host's pace before and after it changes, the baseline's."""

    name: str
    canary_before: float = 1.0
    canary_after: float = 1.0
    baseline: float = 1.0
    trials_before: int | None = None  # None: the setting's


def analysis(draws: random.Random, noise: float, case: Case, settings: dict) -> dict:
    """One simulated canary analysis, trial by trial as the canary role makes it; its result,
    with the trials it took."""
    sides = Sides(draws, noise)
    count_before = settings["trials_before"] if case.trials_before is None else case.trials_before
    before = sides.pairs(case.canary_before, case.baseline, count_before)
    after = sides.pairs(case.canary_after, case.baseline, settings["trials"])
    trials = settings["trials"]
    while True:
        result = analyse({**after, **CORRECTNESS}, before=before, margin=settings["margin"],
                         request_margin=settings["request_margin"], quality_margin=QUALITY_MARGIN,
                         pass_score=settings["thresholds"]["pass"], marginal_score=settings["thresholds"]["marginal"],
                         confidence=settings.get("confidence", 0.98))
        undecided = result["verdict"] in ("marginal", "inconclusive") and not result["promote"]
        if not undecided or trials >= settings["max_trials"]:
            return dict(result, trials=trials)
        for name, pair in sides.pairs(case.canary_after, case.baseline, 1).items():
            after[name].extend(pair)
        trials += 1


def stop_rate(case: Case, noise: float, settings: dict | None = None, runs: int = 1000, seed: int = 0) -> dict:
    """The share of `runs` analyses of `case` at `noise` that stop the rollout, and their mean
    number of trials after the change."""
    settings = {**SETTINGS, **(settings or {})}
    draws = random.Random(f"{seed}:{case.name}:{noise}")
    results = [analysis(draws, noise, case, settings) for _run in range(runs)]
    return {"stops": sum(1 for result in results if not result["promote"]) / runs,
            "trials": sum(result["trials"] for result in results) / runs}


def cases() -> list[Case]:
    return [Case("same release stops"),
            *(Case(f"slower {100 * slower:g} % caught", canary_after=1 - slower) for slower in SLOWER),
            Case(f"host {100 * HOST_GAP:g} % slower stops", canary_before=1 - HOST_GAP, canary_after=1 - HOST_GAP),
            Case(f"host {100 * HOST_GAP:g} % slower stops, no A/A trials", canary_before=1 - HOST_GAP,
                 canary_after=1 - HOST_GAP, trials_before=0)]


def table(settings: dict | None = None, runs: int = 1000, seed: int = 0) -> dict:
    """{case name: {noise: stop_rate}} over every case and noise level."""
    return {case.name: {noise: stop_rate(case, noise, settings, runs, seed) for noise in NOISES} for case in cases()}


def score_shift(pace: float) -> float:
    """The score's change, in percent, of an engine at `pace`."""
    return 100.0 * (engine_figures(pace)["score"] / engine_figures(1.0)["score"] - 1.0)


# ---- the tuner -------------------------------------------------------------------------------

# The lab's search space (files/tune/default.yml) and what the deploy gives every engine.
TUNE_SPACE = {"max_num_seqs": (1, 2, 4, 8), "max_num_batched_tokens": (2048, 4096, 8192),
              "expandable_segments": (False, True)}
ALLOCATOR = "garbage_collection_threshold:0.8,max_split_size_mb:512"
# The tuning test's bench and latency limit (tests/integration/test_tune.py).
TUNE_PROMPT_TOKENS, TUNE_OUTPUT_TOKENS, TUNE_REQUESTS, TUNE_TPOT_P99_MS = 7000, 256, 16, 1.2
PROBE_CHOICES = 2
FINALISTS, TRIALS = 2, 3
WITHIN = 0.02


@functools.lru_cache(maxsize=None)
def true_scores() -> dict:
    """{(max_num_seqs, max_num_batched_tokens, expandable_segments): the speed model's score at the
    bench's load} of every candidate the tuner would start that starts and holds the limit."""
    scores = {}
    for seqs, batched, expandable in itertools.product(*TUNE_SPACE.values()):
        if seqs < PROBE_CHOICES:
            continue
        predicted = tuning_prediction(seqs, batched, expandable)
        if predicted.refused is None and tpot_p99(predicted) <= TUNE_TPOT_P99_MS:
            scores[seqs, batched, expandable] = predicted.score
    return scores


@functools.lru_cache(maxsize=None)
def tuning_prediction(seqs: int, batched: int, expandable: bool):
    allocator = ALLOCATOR + (",expandable_segments:True" if expandable else "")
    return speed_model.predicted_score(
        dict(SUB168, max_num_seqs=seqs, max_num_batched_tokens=batched), TUNE_PROMPT_TOKENS, TUNE_OUTPUT_TOKENS,
        {**LAB_RATES, "PYTORCH_CUDA_ALLOC_CONF": allocator}, concurrency=BENCH_CONCURRENCY, requests=TUNE_REQUESTS)


def tpot_p99(predicted) -> float:
    return speed_model.percentile(predicted.latencies["tpot_ms"], 99)


INCUMBENT = (SUB168["max_num_seqs"], SUB168["max_num_batched_tokens"], False)


def tuning(draws: random.Random, noise: float) -> tuple:
    """One simulated search: the setting it proposes (the incumbent when none beats it)."""
    scores = true_scores()

    def bench(setting):
        score = scores[setting] * math.exp(draws.gauss(0.0, noise))
        return {"score": score, "output_tps": score * 0.6}

    measured = {setting: bench(setting)["score"] for setting in scores}
    finalists = sorted((setting for setting in scores if setting != INCUMBENT), key=lambda setting: -measured[setting])
    finalists = finalists[:FINALISTS]
    trials = {_key(setting): [bench(setting) for _trial in range(TRIALS)] for setting in (INCUMBENT, *finalists)}
    correct = {_key(setting): {"quality": 1.0, "probes_passed": 1.0} for setting in (INCUMBENT, *finalists)}
    changes = {_key(setting): sum(1 for mine, theirs in zip(setting, INCUMBENT) if mine != theirs)
               for setting in (INCUMBENT, *finalists)}
    found = judge_finalists(trials, correct, _key(INCUMBENT), changes)
    chosen = found["winners"][0]["id"] if found["winners"] else _key(INCUMBENT)
    return next(setting for setting in scores if _key(setting) == chosen)


def tuner_error_rate(noise: float, runs: int = 1000, seed: int = 0) -> float:
    """The share of simulated searches whose proposal scores more than 2 % below the best."""
    draws = random.Random(f"{seed}:tuner:{noise}")
    best = max(true_scores().values())
    return sum(1 for _run in range(runs) if true_scores()[tuning(draws, noise)] < (1 - WITHIN) * best) / runs


def _key(setting: tuple) -> str:
    return "-".join(str(part) for part in setting)
