"""engine_bench against vLLM's own benchmark client, `vllm bench serve`, on the lab's real vLLM
0.10.1.1: the same prompts, output lengths, concurrency and sampling, the two clients taking
turns on the same engine.

    .venv/bin/python benchmarks/bench_vs_vllm.py [--prompts 16] [--input-words 400]
        [--output-tokens 64] [--concurrency 2] [--rounds 2]

A one-host lab whose engine is the real vLLM is built in a folder of its own (no lab may be up),
deployed with deploy.yml and taken down after. The prompts are the bench workloads' synthetic
text; each request asks for exactly --output-tokens tokens (ignore_eos) at temperature 0. Both
clients send one request first that they do not measure (vLLM's client its initial test run).
vLLM's client runs in the engine's root with its custom dataset, the chat template left to the
server (--custom-skip-chat-template), as engine_bench leaves it. Prints each round's figures and
the ratio of the medians, engine_bench / vllm bench serve.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests" / "lab")]

import lab as lab_builder  # noqa: E402
from stage_vs_naive import timed_playbook  # noqa: E402  (puts the collection on the path)

from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import (  # noqa: E402
    synthetic_text,
)

SERVED = "qwen3_5"
MODEL = "/opt/models/qwen3_5"
IN_ENGINE_ROOT = "/usr/local/corex/lab/bin/in-engine-root"
DATASET = "/root/bench-vs-vllm.jsonl"
# (label, engine_bench's figure, vllm bench serve's) for the table.
METRICS = (
    ("output tok/s", lambda ours: ours["output_tps"], lambda theirs: theirs["output_throughput"]),
    ("input tok/s", lambda ours: ours["input_tps"],
     lambda theirs: theirs["total_input_tokens"] / theirs["duration"]),
    ("input tokens", lambda ours: ours["input_tokens"], lambda theirs: theirs["total_input_tokens"]),
    ("output tokens", lambda ours: ours["output_tokens"], lambda theirs: theirs["total_output_tokens"]),
    ("TTFT mean ms", lambda ours: ours["ttft_ms"]["mean"], lambda theirs: theirs["mean_ttft_ms"]),
    ("TTFT median ms", lambda ours: ours["ttft_ms"]["p50"], lambda theirs: theirs["median_ttft_ms"]),
    ("TPOT mean ms", lambda ours: ours["tpot_ms"]["mean"], lambda theirs: theirs["mean_tpot_ms"]),
    ("TPOT median ms", lambda ours: ours["tpot_ms"]["p50"], lambda theirs: theirs["median_tpot_ms"]),
)


def body(prompt: str, output_tokens: int) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": output_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def engine_bench(inventory: Path, prompts: list[str], args, results: Path, release: str) -> dict:
    extravars = {"bench_requests": [body(prompt, args.output_tokens) for prompt in [prompts[0], *prompts]],
                 "bench_warmup": 1, "bench_concurrency": args.concurrency,
                 "bench_results_dir": str(results), "bench_release": release}
    timed_playbook("benchmarks/engine_bench_requests.yml", inventory, extravars, [])
    (figures,) = (results / release).glob("*.json")
    return json.loads(figures.read_text())


def vllm_bench(built, host, args, round_number: int) -> dict:
    result = f"vllm-bench-{round_number}.json"
    command = [IN_ENGINE_ROOT, host.interpreter, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
               "--backend", "openai-chat", "--base-url", "http://127.0.0.1:8000",
               "--endpoint", "/v1/chat/completions", "--model", MODEL, "--served-model-name", SERVED,
               "--dataset-name", "custom", "--dataset-path", DATASET, "--custom-skip-chat-template",
               "--custom-output-len", str(args.output_tokens), "--num-prompts", str(args.prompts),
               "--max-concurrency", str(args.concurrency), "--ignore-eos", "--temperature", "0",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", "/root",
               "--result-filename", result]
    run = subprocess.run(built.ssh_command(host, *command), capture_output=True, text=True,
                         timeout=1800, check=False)
    if run.returncode:
        sys.exit(f"vllm bench serve failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    return json.loads(host.path(f"/root/{result}").read_text())


def table(rounds: list[tuple[dict, dict]]) -> list[str]:
    lines = [f"{'':16}{'engine_bench':>24}{'vllm bench serve':>24}{'ratio':>8}"]
    for label, ours_of, theirs_of in METRICS:
        ours = [ours_of(pair[0]) for pair in rounds]
        theirs = [theirs_of(pair[1]) for pair in rounds]
        ratio = statistics.median(ours) / statistics.median(theirs)
        lines.append(f"{label:16}{', '.join(f'{value:.1f}' for value in ours):>24}"
                     f"{', '.join(f'{value:.1f}' for value in theirs):>24}{ratio:>8.3f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--input-words", type=int, default=400)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    running = lab_builder.running_lab_dir()
    if running:
        sys.exit(f"a lab is up in {running}: take it down first (make lab-down)")
    rng = random.Random(1)
    prompts = [synthetic_text(rng, args.input_words, f"p{index}:") for index in range(args.prompts)]
    with tempfile.TemporaryDirectory(prefix="biv100-bench-vs-vllm-") as work:
        built = lab_builder.up(n_hosts=1, lab_dir=Path(work) / "lab", rebuild=True, real_engines=["h1"])
        try:
            (host,) = built.hosts
            timed_playbook("deploy.yml", built.inventory_path, {"serving_release": "bench"}, [])
            host.path(DATASET).write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
            rounds = []
            for round_number in range(args.rounds):
                ours = engine_bench(built.inventory_path, prompts, args, Path(work) / "results", f"round{round_number}")
                rounds.append((ours, vllm_bench(built, host, args, round_number)))
        finally:
            lab_builder.down(built.lab_dir)
    print(f"{args.prompts} prompts of {args.input_words} words, {args.output_tokens} output tokens each, "
          f"{args.concurrency} at a time, {args.rounds} rounds (the real vLLM 0.10.1.1 on the lab's CPU):")
    print("\n".join(table(rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
