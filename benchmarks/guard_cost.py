"""What guarding the whole model layer costs a deploy that changes nothing, against an earlier
revision of the collection, side by side on the same lab hosts in one run.

    .venv/bin/python benchmarks/guard_cost.py [--baseline REV] [--hosts 4] [--rounds 3]

REV (default 9edfaf9, the last revision whose guard covered only the brief's twelve names) is
checked out into a temporary git worktree. This checkout deploys the shipped payload with
`--skip-tags engine`; each host's state store is then copied for the earlier revision, less
the guard's baseline, so that the earlier revision takes over the same release (the same
files, the same pristine copies) and records the baseline of the scope it knows. From then on
every run of either changes nothing. The no-change runs alternate between the revisions, so
that a slower or faster moment of the machine falls on both. Prints the median of each and
their ratio. The lab is built in a folder of its own and taken down after.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from bench_lab import REPO, timed_playbook, work_dir

import lab as lab_builder

from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR as STATE_DIR


def deploy(checkout: Path, inventory: Path, state_dir: str) -> float:
    extravars = {"serving_release": "bench", "serving_state_dir": state_dir}
    return timed_playbook("deploy.yml", inventory, extravars, ["--skip-tags", "engine"], checkout)


def rounded(seconds: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="9edfaf9")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with work_dir("biv100-guard-bench-") as work:
        earlier = work / "earlier"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(earlier), args.baseline],
                       check=True)
        built = lab_builder.up(n_hosts=args.hosts, lab_dir=work / "lab", rebuild=True)
        try:
            checkouts = {"this": (REPO, f"{STATE_DIR}/bench-this"),
                         args.baseline: (earlier, f"{STATE_DIR}/bench-earlier")}
            deploy(REPO, built.inventory_path, checkouts["this"][1])  # first contact, not timed
            for host in built.hosts:
                subprocess.run(built.ssh_command(host, f"cp -a {STATE_DIR}/bench-this {STATE_DIR}/bench-earlier"
                                                       f" && rm -r {STATE_DIR}/bench-earlier/baseline"), check=True)
            deploy(earlier, built.inventory_path, checkouts[args.baseline][1])  # its own first contact
            times = {name: [] for name in checkouts}
            for _round in range(args.rounds):
                for name, (checkout, state_dir) in checkouts.items():
                    times[name].append(deploy(checkout, built.inventory_path, state_dir))
        finally:
            lab_builder.down(work / "lab")
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(earlier)], check=True)
    this, before = statistics.median(times["this"]), statistics.median(times[args.baseline])
    print(f"no-change deploy (--skip-tags engine), {args.hosts} hosts, median of {args.rounds}:")
    print(f"  this checkout (whole model layer guarded)   {this:6.2f} s   {rounded(times['this'])}")
    print(f"  {args.baseline} (the brief's twelve names guarded)  {before:6.2f} s   {rounded(times[args.baseline])}")
    print(f"  ratio this/{args.baseline}: {this / before:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
