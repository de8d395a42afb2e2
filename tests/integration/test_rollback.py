"""Rollback against the lab: automatic in deploy.yml when a host fails its probes, canary first
in a rollout, and on demand with rollback.yml, each time byte for byte and proven healthy.

The module's fixtures make the releases the tests start from: A (sub510) everywhere, then B
(sub511) everywhere but on one host, which fails its probes and goes back to A. The tests then
try a failing canary, rollback.yml twice in a row on one host, to base, and to a named release.
"""

from __future__ import annotations

import json

import pytest

from lab_files import (
    ALL_PROBES_PASSED,
    STATE,
    copy_payload,
    current_release,
    digest,
    engine_pids,
    host_of,
    overlay,
    package_file,
    recorded,
)
from playbook_runs import ONE_BATCH, run_playbook

pytestmark = pytest.mark.lab

DEPLOY = "deploy.yml"
ROLLBACK = "rollback.yml"
PROBE_TASK = "Probe the engine with the functional suites"
STANDIN_ENV = {"PYTHONPATH": "/usr/local/corex/lab", "BIV100_STANDIN_LOAD_SECONDS": "0.3"}


def same_as(host, snapshot) -> bool:
    """The host's files are the snapshot's; paths a later release added are absent again."""
    files = serving_files(host)
    return all(files[path] == snapshot.get(path) for path in files)


def serving_files(host) -> dict[str, str | None]:
    """The sha256 of every file the collection ever overlaid on the host (None: absent)."""
    index = json.loads(host.path(f"{STATE}/base/index.json").read_text())
    return {path: digest(package_file(host, path)) for path in sorted(index)}


def vendor_files(host) -> dict[str, str | None]:
    """What the lab built at those paths: the vendor's files."""
    index = json.loads(host.path(f"{STATE}/base/index.json").read_text())
    return {path: host.package_sha256.get(path) for path in sorted(index)}


def protected_baseline(host) -> dict:
    return json.loads(host.path(f"{STATE}/baseline/protected.json").read_text())["files"]


def breaking(host, kind="n") -> dict:
    """Extra variables that make only `host` run a stand-in that answers one kind of request
    wrongly (extra variables are templated per host)."""
    return {"standin_env": STANDIN_ENV, "engine_env": (
        "{{ standin_env | combine({'BIV100_STANDIN_BREAK': '%s'} if inventory_hostname == '%s' "
        "else {}) }}" % (kind, host.name))}


def payload_with(tmp_path, name):
    (tmp_path / name).mkdir()
    payload = copy_payload(tmp_path / name)
    overlay(payload, name, f"reasoning/{name}_parser.py", f"PARSER = {name!r}\n")
    return payload


@pytest.fixture(scope="module")
def snapshots():
    """{(host, release): serving_files} as each release was when it was good."""
    return {}


@pytest.fixture(scope="module")
def release_a(lab, tmp_path_factory, snapshots):
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path_factory.mktemp("a"),
                       extravars={"serving_release": "sub510", **ONE_BATCH})
    assert run.rc == 0, run.stats
    for host in lab.hosts:
        snapshots[host.name, "sub510"] = serving_files(host)
    return run


@pytest.fixture(scope="module")
def release_b(lab, release_a, snapshots, tmp_path_factory):
    """The rollout of sub511, the canary first, in which the second host fails its probes: the
    run, its folder (with its ledger), and the guard's baselines before it."""
    broken = lab.hosts[1]  # not the canary: the rollout reaches it in the second batch
    protected = {host.name: protected_baseline(host) for host in lab.hosts}
    folder = tmp_path_factory.mktemp("b")
    run = run_playbook(DEPLOY, lab.inventory_path, folder, extravars={
        "serving_release": "sub511", "stage_payload_dir": str(payload_with(folder, "b")),
        **breaking(broken)})
    for host in lab.hosts:
        if host is not broken and current_release(host)["id"] == "sub511":
            snapshots[host.name, "sub511"] = serving_files(host)
    return {"run": run, "folder": folder, "broken": broken, "protected": protected}


def test_a_host_failing_its_probes_goes_back_to_the_last_good_release(lab, release_b, snapshots):
    run, broken, protected = release_b["run"], release_b["broken"], release_b["protected"]

    assert run.rc != 0 and run.hosts_with("failures") == {broken.name}
    (message,) = [text for text in run.failure_messages(broken.name) if "rolled back to" in text]
    assert message.startswith(f"{broken.name}: the probes phase failed at 'Probe the engine")
    assert "first n-two" in message and f"rolled back to sub510, engine healthy, {ALL_PROBES_PASSED}" in message
    # Byte for byte the release it had, its engine serving again with that release's settings.
    assert same_as(broken, snapshots[broken.name, "sub510"])
    assert current_release(broken)["id"] == "sub510"
    failed = json.loads(broken.path(f"{STATE}/releases/sub511/release.json").read_text())
    assert failed["status"] == "failed" and "n-two" in failed["history"][-1]["reason"]
    probes = run.results(broken.name, PROBE_TASK)
    assert [bool(result["failed_probes"]) for result in probes] == [True, False]
    for host in lab.hosts:
        if host is not broken:
            assert current_release(host)["id"] == "sub511" and current_release(host)["status"] == "good"
        assert protected_baseline(host) == protected[host.name]
    # The ledger has the run's line for every host, the rollback included.
    ledger = release_b["folder"] / "ledger"
    lines = {line["host"]: line for line in map(json.loads, (ledger / "ledger.jsonl").read_text().splitlines())}
    assert set(lines) == {host.name for host in lab.hosts}
    assert lines[broken.name]["rollback"] == {"from": "sub511", "to": "sub510",
                                              "files": ["reasoning/b_parser.py"]}
    assert (lines[broken.name]["state"], lines[broken.name]["submission"]) == ("rolled back", "sub511")
    assert "Probe the engine" in lines[broken.name]["failure"]
    good = lines[lab.hosts[0].name]
    assert (good["release"], good["state"]) == ("sub511", "good")
    assert good["probes"].startswith(f"{ALL_PROBES_PASSED}, median ")
    assert "reasoning/b_parser.py" in good["files_changed"]
    assert {mapping["entry"] for mapping in good["mappings"]} >= {"n-within-max-num-seqs", "thinking-off-for-tools"}
    table = (ledger / "LEDGER.md").read_text()
    assert f"| {broken.name} | deploy.yml | sub511 | sub510 | rolled back |" in table


def test_a_failing_canary_stops_the_rollout_before_any_other_host_changes(lab, release_b, snapshots, tmp_path):
    canary, *others = lab.hosts[2], lab.hosts[0], lab.hosts[1], lab.hosts[3]
    before = {host.name: serving_files(host) for host in others}
    releases = {host.name: current_release(host)["id"] for host in others}
    pids = {name: pid for name, pid in engine_pids(lab).items() if name != canary.name}

    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, extravars={
        "serving_release": "sub512", "stage_payload_dir": str(payload_with(tmp_path, "c")),
        "serving_canary": canary.name, **breaking(canary, "tools")})

    assert run.rc != 0 and run.hosts_with("failures") == {canary.name}
    assert {host.name: serving_files(host) for host in others} == before
    assert {host.name: current_release(host)["id"] for host in others} == releases
    assert {name: pid for name, pid in engine_pids(lab).items() if name != canary.name} == pids
    assert current_release(canary)["id"] == "sub511"
    assert same_as(canary, snapshots[canary.name, "sub511"])
    # Held for the run from the start, the hosts it did not reach were given back as it stopped.
    assert [host.name for host in lab.hosts if host.path(f"{STATE}/lock").exists()] == []


def test_rolling_back_twice_goes_one_good_release_further_each_time(lab, release_b, snapshots, tmp_path):
    host = lab.hosts[3]  # on sub511 since release B, which followed sub510
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path / "sub513", limit=host.name, extravars={
        "serving_release": "sub513", "stage_payload_dir": str(payload_with(tmp_path, "d"))})
    assert run.rc == 0, run.stats

    first = run_playbook(ROLLBACK, lab.inventory_path, tmp_path / "first", limit=host.name)
    assert first.rc == 0 and current_release(host)["id"] == "sub511", first.stats
    assert same_as(host, snapshots[host.name, "sub511"])
    second = run_playbook(ROLLBACK, lab.inventory_path, tmp_path / "second", limit=host.name)
    assert second.rc == 0 and current_release(host)["id"] == "sub510", second.stats
    assert same_as(host, snapshots[host.name, "sub510"])
    statuses = {release: json.loads(host.path(f"{STATE}/releases/{release}/release.json").read_text())["status"]
                for release in ("sub510", "sub511", "sub513")}
    assert statuses == {"sub510": "good", "sub511": "rolled_back", "sub513": "rolled_back"}


def test_rollback_to_base_puts_back_every_vendor_file_where_the_vendor_serves_the_model(lab, release_a, tmp_path):
    protected = {host.name: protected_baseline(host) for host in lab.hosts}
    unregistered = host_of(lab, "vendor-unregistered")
    kept = serving_files(unregistered)
    engine = engine_pids(lab)[unregistered.name]

    run = run_playbook(ROLLBACK, lab.inventory_path, tmp_path / "base", extravars={"serving_rollback_to": "base"})

    for host in lab.hosts:
        if host is not unregistered:
            assert serving_files(host) == vendor_files(host)
            assert not host.path(f"{STATE}/current").is_symlink()
        assert protected_baseline(host) == protected[host.name]
    # The vendor's own files serve where the vendor registered the model (without the team's
    # fixes: the regression probes are left out).
    for host in lab.hosts:
        if host is not unregistered:
            (probed,) = run.results(host.name, PROBE_TASK)
            assert probed["failed_probes"] == [] and "chat-basic" in [p["name"] for p in probed["probes"]]
            assert "n-above-max-num-seqs" not in [p["name"] for p in probed["probes"]]
    # Where it did not, the rollback is refused before anything changes: the release and its
    # engine stay.
    assert run.hosts_with("failures") == {unregistered.name}
    (refusal,) = run.failure_messages(unregistered.name)
    assert "refusing to roll back to base, the vendor's files (asked for)" in refusal
    assert "Qwen3_5ForConditionalGeneration" in refusal and "nothing changed" in refusal
    assert serving_files(unregistered) == kept and engine_pids(lab)[unregistered.name] == engine
    assert current_release(unregistered)["id"] == "sub510"

    forced = run_playbook(ROLLBACK, lab.inventory_path, tmp_path / "forced", limit=unregistered.name,
                          extravars={"serving_rollback_to": "base", "serving_rollback_force": True})
    assert serving_files(unregistered) == vendor_files(unregistered)
    # The engine cannot start there: its log says why.
    assert any("Qwen3_5ForConditionalGeneration" in line
               for result in forced.failures(unregistered.name) for line in result.get("log_tail", []))


def test_rollback_to_a_named_release_and_again_changes_nothing(lab, release_a, snapshots, tmp_path):
    run = run_playbook(ROLLBACK, lab.inventory_path, tmp_path / "named",
                       extravars={"serving_rollback_to": "sub510"})
    assert run.rc == 0, run.stats
    for host in lab.hosts:
        assert same_as(host, snapshots[host.name, "sub510"])
        assert current_release(host)["id"] == "sub510"
    again = run_playbook(ROLLBACK, lab.inventory_path, tmp_path / "again", limit=lab.hosts[0].name,
                         extravars={"serving_rollback_to": "sub510"})
    assert again.rc == 0 and not again.hosts_with("changed"), again.stats


def test_an_engine_that_dies_after_it_was_healthy_is_rolled_back_and_serves_again(lab, release_a, snapshots, tmp_path):
    host = lab.hosts[0]
    before = engine_pids(lab)[host.name]
    # Healthy, then dead after its third chat answer: in the middle of the probes.
    dying = {"standin_env": STANDIN_ENV, "engine_env": "{{ standin_env | combine({'BIV100_STANDIN_CRASH_AFTER': '3'}) }}"}

    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path, limit=host.name, extravars={
        "serving_release": "sub530", "stage_payload_dir": str(payload_with(tmp_path, "dying")), **dying})

    assert run.rc != 0 and run.hosts_with("failures") == {host.name}
    (message,) = [text for text in run.failure_messages(host.name) if "rolled back to" in text]
    assert message.startswith(f"{host.name}: the probes phase failed")
    assert f"rolled back to sub510, engine healthy, {ALL_PROBES_PASSED}" in message
    assert same_as(host, snapshots[host.name, "sub510"]) and current_release(host)["id"] == "sub510"
    # A new engine, started with sub510's recorded settings (no crash), serves.
    assert engine_pids(lab)[host.name] != before
    assert "BIV100_STANDIN_CRASH_AFTER" not in recorded(current_release(host), "engine").get("env", {})
