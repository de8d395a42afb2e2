"""The benchmark's figures on a recorded run with known timestamps, each checked against a value
worked out by hand from vLLM 0.10.1.1's definitions (vllm/benchmarks/serve.py, calculate_metrics)."""

from __future__ import annotations

import random

import pytest
from gates_defaults import WEIGHTS

from ansible_collections.biv100.serving.plugins.module_utils._bench_figures import (
    compute,
    new_record,
    percentile,
    rounded,
)


def record(start, chunks, last_event, prompt_tokens, completion_tokens, error=None, warmup=False):
    made = new_record(warmup)
    made.update(start=start, chunks=chunks, last_event=last_event, prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens, error=error)
    return made


# A measured second: three answers, one failure, and a warm-up answer before it that must count
# for nothing (its huge figures would show in every one).
RUN = [
    record(0.0, [5.0, 9.0], 9.5, 100000, 500, warmup=True),
    # TTFT 0.2; gaps 0.05, 0.10, 0.05; E2E 0.45 (the usage event at 10.45); TPOT 0.25 / 3.
    record(10.0, [10.2, 10.25, 10.35, 10.40], 10.45, 1000, 4),
    # TTFT 0.3; gap 0.12; E2E 0.5; TPOT 0.2 / 1.
    record(10.1, [10.4, 10.52], 10.6, 500, 2),
    # TTFT 0.1; no gap; E2E 0.1; one output token: no TPOT.
    record(10.2, [10.3], 10.3, 200, 1),
    record(10.3, [], None, None, None, error="HTTP 500: CUDA out of memory"),
]


@pytest.fixture
def figures():
    return compute(RUN, 1.0, WEIGHTS)


def test_requests_tokens_and_throughputs(figures):
    assert figures["requests"] == {"ok": 3, "failed": 1}
    # The server's usage counts of the successful measured requests; the warm-up's are not there.
    assert figures["input_tokens"] == 1700 and figures["output_tokens"] == 7
    assert figures["duration_s"] == 1.0
    assert figures["request_tps"] == pytest.approx(3.0)
    assert figures["input_tps"] == pytest.approx(1700.0)
    assert figures["output_tps"] == pytest.approx(7.0)
    assert figures["total_tps"] == pytest.approx(1707.0)


def test_the_score_weighs_output_and_input_throughput(figures):
    assert figures["weights"] == WEIGHTS
    assert figures["score"] == pytest.approx(WEIGHTS["output"] * 7 + WEIGHTS["input"] * 1700)
    weighted = compute(RUN, 2.0, {"output": 1.0, "input": 0.0})
    assert weighted["weights"] == {"output": 1.0, "input": 0.0}
    assert weighted["score"] == pytest.approx(3.5)


def test_ttft_is_the_first_chunk_less_the_start(figures):
    # [200, 300, 100] ms; sorted [100, 200, 300]: p90 at index 1.8, p99 at 1.98.
    assert figures["ttft_ms"] == pytest.approx({"mean": 200.0, "p50": 200.0, "p90": 280.0, "p99": 298.0})


def test_itl_is_every_gap_between_successive_chunks(figures):
    # [50, 100, 50, 120] ms; sorted [50, 50, 100, 120]: p50 at 1.5, p90 at 2.7, p99 at 2.97.
    assert figures["itl_ms"] == pytest.approx({"mean": 80.0, "p50": 75.0, "p90": 114.0, "p99": 119.4})


def test_tpot_is_latency_less_ttft_over_the_output_tokens_but_one(figures):
    # [(0.45 - 0.2) / 3, (0.5 - 0.3) / 1] = [83.333, 200] ms; the one-token answer has none.
    first = 250.0 / 3
    assert figures["tpot_ms"] == pytest.approx({
        "mean": (first + 200.0) / 2,
        "p50": (first + 200.0) / 2,
        "p90": first + 0.9 * (200.0 - first),
        "p99": first + 0.99 * (200.0 - first),
    })


def test_e2e_runs_to_the_last_event_before_done(figures):
    # [450, 500, 100] ms; sorted [100, 450, 500].
    assert figures["e2e_ms"] == pytest.approx({"mean": 350.0, "p50": 450.0, "p90": 490.0, "p99": 499.0})


def test_samples_keep_each_successful_measured_requests_own_figures_in_start_order(figures):
    samples = figures["samples"]
    assert samples["ttft_ms"] == pytest.approx([200.0, 300.0, 100.0])
    assert samples["tpot_ms"] == pytest.approx([250.0 / 3, 200.0])  # the one-token answer has none
    assert samples["e2e_ms"] == pytest.approx([450.0, 500.0, 100.0])
    # Output tokens over the request's own E2E latency: 4 / 0.45, 2 / 0.5, 1 / 0.1.
    assert samples["output_tps"] == pytest.approx([4 / 0.45, 4.0, 10.0])
    later_first = compute(list(reversed(RUN)), 1.0, WEIGHTS)["samples"]
    assert later_first == samples
    assert rounded(figures)["samples"]["output_tps"] == [8.889, 4.0, 10.0]


def test_no_successful_request_gives_zeros_as_vllm_does():
    empty = compute([record(1.0, [], None, None, None, error="refused")], 2.0, WEIGHTS)
    assert empty["requests"] == {"ok": 0, "failed": 1}
    assert empty["score"] == 0 and empty["output_tps"] == 0 and empty["input_tokens"] == 0
    assert empty["ttft_ms"] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_a_zero_duration_gives_no_throughput_rather_than_a_division_error():
    assert compute([record(1.0, [1.0], 1.0, 10, 1)], 0.0, WEIGHTS)["output_tps"] == 0.0


def test_percentiles_are_numpys_default_linear_interpolation():
    numpy = pytest.importorskip("numpy")  # on the controller only, through matplotlib
    generator = random.Random(7)
    for size in (1, 2, 3, 10, 24, 101):
        values = [generator.uniform(0, 5) for _draw in range(size)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q)), rel=1e-12, abs=1e-15)


def test_rounding_is_for_reports_only(figures):
    shown = rounded(figures)
    assert shown["tpot_ms"]["mean"] == 141.667 and shown["requests"] == {"ok": 3, "failed": 1}
