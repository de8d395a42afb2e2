"""Deploy one payload to 4 and 8 lab hosts with the collection and with a naive copy loop.

    .venv/bin/python benchmarks/stage_vs_naive.py [--hosts 4 8 16] [--profile build/profile]

The payload is the shipped one (less the registry patch, which only some hosts take) plus
whole-file overlays of vLLM 0.10.1.1's tool parsers and reasoning parsers: about 40 files.
The naive play (naive_copy.yml) stats and copies each file in its own task iteration; the
collection runs deploy.yml (facts, preflight, payload check, lock, guard twice, stage) without
its engine phase (--skip-tags engine), which the naive play has no counterpart for.
Each first run starts from freshly built hosts; the no-change run follows it. On the
collection's hosts two floors follow, measured the same way: Ansible's (ping.yml, one ping task
per host) and ssh's (one new `ssh host true` per host, all at once). The lab is built in a
folder of its own and taken down after; it refuses to start while another lab is up.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_lab import REPO, timed_playbook, work_dir

import lab as lab_builder
import vllm_sources
import yaml

from ansible_collections.biv100.serving.plugins.plugin_utils._unified_diff import apply_patch

BRIEF_PATHS = {
    "serving_chat.py": "entrypoints/openai/serving_chat.py",
    "protocol.py": "entrypoints/openai/protocol.py",
}
OVERLAID_TREES = ("entrypoints/openai/tool_parsers", "reasoning")
PACKAGE_ROOT = "/usr/local/corex/python3/lib/python3.11/site-packages/vllm"


def build_payload(work: Path, base: Path) -> tuple[Path, list[dict]]:
    """The benchmark payload, and the same files rendered for the naive play."""
    payload = work / "payload"
    shutil.copytree(REPO / "files" / "serving", payload)
    manifest = yaml.safe_load((payload / "manifest.yml").read_text())
    manifest["entries"] = [entry for entry in manifest["entries"] if entry.get("when") is None]
    rendered = work / "rendered"
    naive_files = []
    for entry in manifest["entries"]:
        dest = BRIEF_PATHS[entry["dest"]]
        text = apply_patch((base / dest).read_text(), (payload / entry["src"]).read_text(), filename=dest)
        naive_files.append(render(rendered, dest, text))
    for tree in OVERLAID_TREES:
        name = tree.replace("/", "-").replace("_", "-")
        for source in sorted((base / tree).glob("*.py")):
            text = source.read_text() + "# a team overlay\n"
            (payload / "overlays" / name).mkdir(parents=True, exist_ok=True)
            (payload / "overlays" / name / source.name).write_text(text)
            naive_files.append(render(rendered, f"{tree}/{source.name}", text))
        manifest["entries"].append({"name": name, "kind": "dir", "src": f"overlays/{name}", "dest": f"{tree}/"})
    (payload / "manifest.yml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return payload, naive_files


def render(rendered: Path, dest: str, text: str) -> dict:
    path = rendered / dest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return {"src": str(path), "dest": dest}


def measure(n_hosts: int, lab_dir: Path, plays: dict[str, tuple[str, dict, list[str]]],
            profile: Path | None = None) -> dict[str, tuple[float, ...]]:
    """First and no-change run of each play, each first run on freshly built hosts; then, on
    the last play's hosts, Ansible's floor and ssh's. With profile, the collection's runs write
    their seconds task by task to <profile>/<hosts>-first.txt and -no-change.txt."""
    times = {}
    for name, (playbook, extravars, options) in plays.items():
        built = lab_builder.up(n_hosts=n_hosts, lab_dir=lab_dir, rebuild=True)
        profiled = profile if name == "collection" else None
        try:
            first = timed_playbook(playbook, built.inventory_path, extravars, options,
                                   task_times=profiled and profiled / f"{n_hosts}-first.txt")
            again = timed_playbook(playbook, built.inventory_path, extravars, options,
                                   task_times=profiled and profiled / f"{n_hosts}-no-change.txt")
            if name == "collection":
                times["ping"] = (timed_playbook("benchmarks/ping.yml", built.inventory_path, {}, []),)
                times["ssh"] = (ssh_floor(built),)
        finally:
            lab_builder.down(lab_dir)
        times[name] = (first, again)
    return times


def ssh_floor(built) -> float:
    """Seconds for one new ssh connection to every host at once, each running `true`."""
    started = time.perf_counter()
    sessions = [subprocess.Popen(built.ssh_command(host, "true")) for host in built.hosts]
    if any(session.wait() for session in sessions):
        sys.exit("ssh to a lab host failed")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--profile", type=Path, help="a folder for the collection's seconds, task by task")
    args = parser.parse_args()
    base = vllm_sources.ensure_tree(vllm_sources.LAB_BASE_VERSION) / "vllm"
    with work_dir("biv100-bench-") as work:
        payload, naive_files = build_payload(work, base)
        plays = {
            "collection": ("deploy.yml", {"serving_release": "bench", "stage_payload_dir": str(payload)},
                           ["--skip-tags", "engine"]),
            "naive": ("benchmarks/naive_copy.yml", {"naive_files": naive_files, "naive_package_root": PACKAGE_ROOT},
                      []),
        }
        print(f"payload: {len(naive_files)} files")
        print(f"{'hosts':>5}  {'run':<9}  {'collection':>10}  {'naive':>8}  {'collection/naive':>16}"
              f"  {'ansible ping':>12}  {'ssh true':>8}  {'collection/ping':>15}")
        for n_hosts in args.hosts:
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
            times = measure(n_hosts, work / "lab", plays, args.profile and args.profile.resolve())
            (ping,), (ssh,) = times["ping"], times["ssh"]
            for index, run in enumerate(("first", "no-change")):
                ours, naive = times["collection"][index], times["naive"][index]
                print(f"{n_hosts:>5}  {run:<9}  {ours:>9.1f}s  {naive:>7.1f}s  {ours / naive:>16.2f}"
                      f"  {ping:>11.1f}s  {ssh:>7.2f}s  {ours / ping:>15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
