"""engine_bench against vLLM's own benchmark client, `vllm bench serve`, on the lab's real vLLM
0.10.1.1: the same prompts, output lengths, concurrency and sampling, the two clients taking
turns on the same engine.

    .venv/bin/python benchmarks/bench_vs_vllm.py [--prompts 48] [--input-words 400]
        [--output-tokens 128] [--concurrency 2] [--rounds 3] [--isolate]

A one-host lab whose engine is the real vLLM is built in a folder of its own (no lab may be up),
deployed with deploy.yml and taken down after. The prompts are the bench workloads' synthetic
text, the same for both clients but for their first word, which names the round and the client:
no prompt shares a prefix with one the engine has seen, so its prefix cache serves neither. Each
request asks for exactly --output-tokens tokens (ignore_eos) at temperature 0. Both clients
send one request first that they do not measure (vLLM's client its initial test run). vLLM's
client runs in the engine's root with its custom dataset, the chat template left to the server
(--custom-skip-chat-template), as engine_bench leaves it. The engine's own view of each run
(its /metrics histograms of TTFT and time per output token, before and after) is printed
beside the clients', with the CPU seconds the engine's API server and engine core used and
the rest of the machine's (the client and its start, Ansible, the lab), read from /proc: the
lab's hosts share the machine's two cores, so what a client costs is taken from the engine.
Prints each round's figures and the ratio of the medians, engine_bench / vllm bench serve.

The engine's CPU backend binds its compute threads to the machine's CPUs, one each, and they
wait for one another at every step: whatever else runs on a CPU holds the whole step up. With
--isolate the engine core computes on the first CPU alone (one compute thread,
VLLM_CPU_OMP_THREADS_BIND) and everything else runs on the others: the API server, whatever the
host's sshd runs (both clients, Ansible's module calls), this script and the Ansible and ssh it
starts. What a client costs on the machine then no longer reaches the engine's step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import yaml
from bench_lab import REPO, timed_playbook, work_dir

import lab as lab_builder

from ansible_collections.biv100.serving.plugins.plugin_utils._bench_workload import synthetic_text

SERVED = "qwen3_5"
MODEL = "/opt/models/qwen3_5"
IN_ENGINE_ROOT = "/usr/local/corex/lab/bin/in-engine-root"
DATASET = "/root/bench-vs-vllm.jsonl"
# The engine's own histograms (sum and count, seconds) of what the clients measure.
SERVER_HISTOGRAMS = {"server TTFT mean ms": "vllm:time_to_first_token_seconds",
                     "server TPOT mean ms": "vllm:time_per_output_token_seconds"}
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
    *((label, lambda ours, key=label: ours[key], lambda theirs, key=label: theirs[key])
      for label in (*SERVER_HISTOGRAMS, "API server CPU s", "engine core CPU s", "other CPU s")),
)


def prompts_for(args, label: str) -> list[str]:
    """The round's prompts for one client: the same text for every client and round, the first
    word naming both, so that no prompt shares a prefix the engine has cached."""
    rng = random.Random(1)
    return [synthetic_text(rng, args.input_words, f"{label}-p{index}:") for index in range(args.prompts)]


def server_totals(built, host) -> dict[str, float]:
    """The sums and counts of the engine's TTFT and TPOT histograms, from its /metrics."""
    text = subprocess.run(built.ssh_command(host, "curl -s http://127.0.0.1:8000/metrics"),
                          capture_output=True, text=True, timeout=60, check=True).stdout
    totals = {}
    for line in text.splitlines():
        name, value = line.partition("{")[0].split(" ")[0], line.rsplit(" ", 1)[-1]
        if name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in SERVER_HISTOGRAMS.values():
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def server_view(before: dict, after: dict) -> dict[str, float]:
    """The engine's mean TTFT and TPOT (ms) over what was served between two readings."""
    view = {}
    for label, metric in SERVER_HISTOGRAMS.items():
        count = after[f"{metric}_count"] - before[f"{metric}_count"]
        view[label] = 1000 * (after[f"{metric}_sum"] - before[f"{metric}_sum"]) / count
    return view


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ENGINE_PID_FILE = "/run/biv100-serving/vllm.pid"


def busy_cpu_seconds() -> float:
    """The machine's CPU time spent outside idle and I/O wait, from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def engine_cpu_seconds(host) -> tuple[float, float]:
    """The CPU time of the engine's API server (the HTTP side, which streams the answers) and
    of the processes below it (the engine core, which computes them)."""
    pid = int(host.path(ENGINE_PID_FILE).read_text())
    return cpu_seconds(pid), sum(map(cpu_seconds, lab_builder.descendants(pid)))


def engine_env(isolate: bool) -> dict:
    """The real-engine hosts' engine_env of the lab's inventory, with one compute thread on the
    first CPU if `isolate`."""
    group_vars = REPO / "inventory" / "lab" / "group_vars" / "lab_real_engine.yml"
    env = dict(yaml.safe_load(group_vars.read_text())["engine_env"])
    if isolate:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(min(os.sched_getaffinity(0)))
    return env


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of the processes onto `cpus` (a process's children inherit it from then on)."""
    for pid in pids:
        for thread in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(thread), cpus)


def isolate_engine_core(host) -> None:
    """The engine core alone on the first CPU, everything of the host and this script's on the others."""
    first, *others = sorted(os.sched_getaffinity(0))
    server = int(host.path(ENGINE_PID_FILE).read_text())
    pin([host.sshd_pid, *lab_builder.descendants(host.sshd_pid), server, os.getpid()], set(others))
    pin(lab_builder.descendants(server), {first})


def body(prompt: str, output_tokens: int) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": output_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def measured(built, host, run) -> dict:
    """A client's figures with the engine's own view of the same run and where the CPU went."""
    before, busy, (server, core) = server_totals(built, host), busy_cpu_seconds(), engine_cpu_seconds(host)
    figures = run()
    server_after, core_after = engine_cpu_seconds(host)
    server, core = server_after - server, core_after - core
    return {**figures, **server_view(before, server_totals(built, host)), "API server CPU s": server,
            "engine core CPU s": core, "other CPU s": busy_cpu_seconds() - busy - server - core}


def engine_bench(inventory: Path, prompts: list[str], args, results: Path, release: str) -> dict:
    extravars = {"bench_requests": [body(prompt, args.output_tokens) for prompt in [prompts[0], *prompts]],
                 "bench_warmup": 1, "bench_concurrency": args.concurrency,
                 "bench_results_dir": str(results), "bench_release": release}
    timed_playbook("benchmarks/engine_bench_requests.yml", inventory, extravars, [])
    (figures,) = (results / release).glob("*.json")
    return json.loads(figures.read_text())


def vllm_bench(built, host, prompts: list[str], args, round_number: int) -> dict:
    result = f"vllm-bench-{round_number}.json"
    host.path(DATASET).write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    command = [IN_ENGINE_ROOT, host.interpreter, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
               "--backend", "openai-chat", "--endpoint-type", "openai-chat", "--base-url", "http://127.0.0.1:8000",
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
    lines = [f"{'':20}{'engine_bench':>26}{'vllm bench serve':>26}{'ratio':>8}"]
    for label, ours_of, theirs_of in METRICS:
        ours = [ours_of(pair[0]) for pair in rounds]
        theirs = [theirs_of(pair[1]) for pair in rounds]
        ratio = statistics.median(ours) / statistics.median(theirs)
        lines.append(f"{label:20}{', '.join(f'{value:.1f}' for value in ours):>26}"
                     f"{', '.join(f'{value:.1f}' for value in theirs):>26}{ratio:>8.3f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--input-words", type=int, default=400)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--isolate", action="store_true",
                        help="the engine core on the first CPU alone, everything else on the others")
    args = parser.parse_args()
    with work_dir("biv100-bench-vs-vllm-") as work:
        built = lab_builder.up(n_hosts=1, lab_dir=work / "lab", rebuild=True, real_engines=["h1"])
        try:
            (host,) = built.hosts
            timed_playbook("deploy.yml", built.inventory_path,
                           {"serving_release": "bench", "engine_env": engine_env(args.isolate)}, [])
            if args.isolate:
                isolate_engine_core(host)
            rounds = []
            for number in range(args.rounds):
                ours = measured(built, host, lambda: engine_bench(
                    built.inventory_path, prompts_for(args, f"r{number}-ours"), args, work / "results",
                    f"round{number}"))
                theirs = measured(built, host, lambda: vllm_bench(
                    built, host, prompts_for(args, f"r{number}-vllm"), args, number))
                rounds.append((ours, theirs))
        finally:
            lab_builder.down(built.dir)
    print(f"{args.prompts} prompts of {args.input_words} words, {args.output_tokens} output tokens each, "
          f"{args.concurrency} at a time, {args.rounds} rounds (the real vLLM 0.10.1.1 on the lab's CPU"
          f"{', its engine core alone on one CPU' if args.isolate else ''}):")
    print("\n".join(table(rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
