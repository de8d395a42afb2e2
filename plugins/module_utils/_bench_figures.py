# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The throughput benchmark's figures, defined as vLLM's own serving benchmark defines them.

Runs on the host: standard library only, Python 3.8.

The definitions follow vLLM 0.10.1.1's `vllm bench serve` (vllm/benchmarks/serve.py,
calculate_metrics, and the chat request function in vllm/benchmarks/lib/endpoint_request_func.py),
so that a figure here means what the same name means in a vLLM benchmark report:

- a request's clock starts just before it is sent; every server-sent event whose `choices` is
  not empty is a token chunk, timed when its line is read;
- TTFT is the first chunk's time less the start; ITL is the list of gaps between successive
  chunks (not divided by the tokens a chunk carries);
- E2E latency is the time of the last event before `[DONE]` (the usage event included) less the
  start;
- TPOT is (latency - TTFT) / (output tokens - 1), only for requests with more than one output
  token;
- the output tokens are the server's `usage.completion_tokens`; the input tokens are its
  `usage.prompt_tokens` (vLLM's benchmark counts its own tokenizer's prompt length there; the
  server's count is used here because the client has no tokenizer, and it is the count the
  engine worked on);
- throughputs are totals over the successful requests divided by the measured duration, the
  wall time from the first measured request's start to the last one's end;
- a request's own output throughput (a sample, not one of vLLM's figures) is its output tokens
  over its E2E latency; `samples` keeps each successful measured request's output throughput,
  TTFT, TPOT (more than one output token) and E2E latency, in the order the requests started;
- mean, p50, p90 and p99 are numpy's mean and np.percentile with its default linear
  interpolation; an empty list counts as [0], as vLLM's `np.mean(x or 0)` does.

Warm-up requests are left out of every figure (and of the duration, which the caller measures
after the warm-up).
"""

from __future__ import annotations

import math

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def new_record(warmup=False):
    """What a request leaves for the figures; the sender fills it in.

    start, chunks (arrival time of each token chunk), last_event (time of the last event before
    [DONE]) are seconds on one monotonic clock; prompt_tokens and completion_tokens come from
    the server's usage; error is None for a request that counts as successful."""
    return {
        "warmup": bool(warmup),
        "start": None,
        "chunks": [],
        "last_event": None,
        "prompt_tokens": None,
        "completion_tokens": None,
        "error": None,
    }


def percentile(values, q):
    """np.percentile(values or 0, q) with numpy's default method ("linear")."""
    ordered = sorted(values) or [0.0]
    index = (len(ordered) - 1) * (q / 100.0)
    below = int(math.floor(index))
    above = min(below + 1, len(ordered) - 1)
    fraction = index - below
    low, high = ordered[below], ordered[above]
    # numpy's _lerp, which interpolates from the nearer end so that the result is monotonic.
    if fraction >= 0.5:
        return high - (high - low) * (1 - fraction)
    return low + (high - low) * fraction


def mean(values):
    return math.fsum(values) / len(values) if values else 0.0


def summary_ms(seconds):
    """{mean, p50, p90, p99} of a list of seconds, in milliseconds."""
    result = {"mean": mean(seconds) * 1000}
    for q in PERCENTILES:
        result["p%d" % q] = percentile(seconds, q) * 1000
    return result


def succeeded(record):
    return record["error"] is None


def ttft(record):
    return record["chunks"][0] - record["start"]


def latency(record):
    return record["last_event"] - record["start"]


def itls(record):
    chunks = record["chunks"]
    return [later - earlier for earlier, later in zip(chunks, chunks[1:])]


def tpot(record):
    """None for a request of one output token or fewer, which vLLM leaves out of TPOT."""
    output_len = record["completion_tokens"]
    if output_len is None or output_len <= 1:
        return None
    return (latency(record) - ttft(record)) / (output_len - 1)


def output_rate(record):
    """A request's own output throughput: its output tokens over its E2E latency (0 for a
    request answered in no measurable time)."""
    seconds = latency(record)
    return int(record["completion_tokens"]) / seconds if seconds > 0 else 0.0


def weights_of(weights):
    """{output, input} as floats. The weights have no default: they are the competition's, which
    the gates role passes (serving_competition in the serving role's defaults)."""
    return {"output": float(weights["output"]), "input": float(weights["input"])}


def score(output_tps, input_tps, weights):
    chosen = weights_of(weights)
    return chosen["output"] * output_tps + chosen["input"] * input_tps


def compute(records, duration_s, weights):
    """The figures of the measured (non-warm-up) records over duration_s seconds, the score
    weighted by weights ({output, input})."""
    measured = [record for record in records if not record["warmup"]]
    ok = [record for record in measured if succeeded(record)]
    input_tokens = sum(int(record["prompt_tokens"]) for record in ok)
    output_tokens = sum(int(record["completion_tokens"]) for record in ok)
    ttfts, tpots, gaps, e2els, request_output_tps = [], [], [], [], []
    for record in sorted(ok, key=lambda record: record["start"]):
        ttfts.append(ttft(record))
        e2els.append(latency(record))
        gaps.extend(itls(record))
        per_token = tpot(record)
        if per_token is not None:
            tpots.append(per_token)
        request_output_tps.append(output_rate(record))

    def rate(amount):
        return amount / duration_s if duration_s > 0 else 0.0

    input_tps, output_tps = rate(input_tokens), rate(output_tokens)
    chosen = weights_of(weights)
    return {
        "requests": {"ok": len(ok), "failed": len(measured) - len(ok)},
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "duration_s": duration_s,
        "request_tps": rate(len(ok)),
        "input_tps": input_tps,
        "output_tps": output_tps,
        "total_tps": rate(input_tokens + output_tokens),
        "ttft_ms": summary_ms(ttfts),
        "tpot_ms": summary_ms(tpots),
        "itl_ms": summary_ms(gaps),
        "e2e_ms": summary_ms(e2els),
        "weights": chosen,
        "score": score(output_tps, input_tps, chosen),
        # Each request's own figures, for comparing two runs' distributions, not only their
        # summaries (the canary analysis).
        "samples": {
            "output_tps": request_output_tps,
            "ttft_ms": [1000.0 * value for value in ttfts],
            "tpot_ms": [1000.0 * value for value in tpots],
            "e2e_ms": [1000.0 * value for value in e2els],
        },
    }


def rounded(figures, digits=3):
    """The figures with every float rounded, for reports (the arithmetic uses full precision)."""
    if isinstance(figures, dict):
        return dict((key, rounded(value, digits)) for key, value in figures.items())
    if isinstance(figures, list):
        return [rounded(value, digits) for value in figures]
    if isinstance(figures, float):
        return round(figures, digits)
    return figures
