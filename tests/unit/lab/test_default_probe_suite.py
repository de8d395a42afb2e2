"""The default probe suite against the lab's engine stand-in, run on the test machine: it passes
on an engine carrying the payload's fixes, and each regression probe fails when the stand-in
is told to reproduce the failure that probe guards against."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.biv100.serving.plugins.modules.engine_probe import send_copies
from ansible_collections.biv100.serving.plugins.plugin_utils._probe_suite import (
    judge,
    load_suites,
    module_request,
    with_values,
)

from standin_engines import ENGINE_FLAGS, SERVED, Engine, make_host

DEFAULT_SUITE = Path(__file__).resolve().parents[3] / "files" / "probes" / "default.yml"
MAX_MODEL_LEN = 4096  # the stand-in's model config
MAX_NUM_BATCHED_TOKENS = 1024
FLAGS = ENGINE_FLAGS + ["--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS)]
# The values the probe role gives the suite, for this engine.
VALUES = {
    "served_model_name": SERVED,
    "max_model_len": MAX_MODEL_LEN,
    "max_num_seqs": 2,
    "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
    "n_above_max_num_seqs": 3,
    "long_prompt_words": min(MAX_MODEL_LEN // 2, 3 * MAX_NUM_BATCHED_TOKENS),
    "too_long_prompt_words": MAX_MODEL_LEN + 16,
}
# Each regression probe, and how the stand-in reproduces the failure it guards against: a
# BIV100_STANDIN_BREAK kind, or the base's serving files without the payload's patches.
REPRODUCED = {
    "max-completion-tokens": {"break": "max_completion_tokens"},
    "stream-max-completion-tokens": {"break": "max_completion_tokens"},
    "n-two": {"break": "n"},
    "n-above-max-num-seqs": {"patched": False},
    "two-long-prompts-at-once": {"break": "fragmentation"},
    "tool-result-after-null-content": {"break": "tool_content_none"},
    # The failure needs both: no validator switching thinking off, and thinking that runs long.
    "tool-call-with-thinking-on": {"break": "thinking_tools", "patched": False},
}

PROBES = load_suites([str(DEFAULT_SUITE)])


def run_probes(engine, names=None):
    """{name: Verdict} of the suite's probes (or the named ones) against the engine."""
    url = f"http://127.0.0.1:{engine.port}"
    verdicts = {}
    for probe in PROBES:
        if names is None or probe.name in names:
            filled = with_values(probe, VALUES)
            verdicts[probe.name] = judge(filled, send_copies(url, None, module_request(filled), 2000))
    return verdicts


@pytest.fixture(scope="module")
def fixed_engine(tmp_path_factory, base_vllm):
    """An engine on serving files that carry the payload's fixes."""
    host = make_host(tmp_path_factory.mktemp("fixed"), base_vllm, patched=True)
    engine = Engine(host, FLAGS).wait_started()
    yield engine
    engine.stop()


def test_the_suite_is_at_least_forty_probes_each_naming_what_it_guards():
    assert len(PROBES) >= 40
    assert all(probe.guards and probe.tags and probe.expect for probe in PROBES)


def test_every_probe_passes_on_an_engine_with_the_fixes(fixed_engine):
    verdicts = run_probes(fixed_engine)

    failures = {name: (verdict.failed_expectation, verdict.excerpt)
                for name, verdict in verdicts.items() if not verdict.passed}
    assert failures == {}
    assert len(verdicts) == len(PROBES)


def test_every_regression_probe_has_a_reproduction():
    regression = {probe.name for probe in PROBES if "regression" in probe.tags}
    assert regression == set(REPRODUCED)


@pytest.mark.parametrize("name", sorted(REPRODUCED))
def test_a_regression_probe_fails_when_its_failure_is_reproduced(start, name):
    how = REPRODUCED[name]
    env = {"BIV100_STANDIN_BREAK": how["break"]} if "break" in how else None
    engine = start(FLAGS, env=env, patched=how.get("patched", True))

    verdict = run_probes(engine, {name})[name]

    assert not verdict.passed, f"{name} passed on an engine reproducing its failure"
    assert verdict.failed_expectation and verdict.excerpt


def test_tool_calls_left_as_text_fail_the_tool_probes(start):
    engine = start(FLAGS, env={"BIV100_STANDIN_BREAK": "tools"}, patched=True)

    verdicts = run_probes(engine, {"tool-auto", "tool-stream", "tool-required"})

    assert not verdicts["tool-auto"].passed and not verdicts["tool-stream"].passed
