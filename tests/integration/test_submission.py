"""submission.yml and its patch_ops.sh against the lab: the bundle is built from the release the
fleet proved good, and on a pristine twin of each deployed host patch_ops.sh, run by Debian's
dash, makes exactly the vllm tree the Ansible deploy made; --restore brings the vendor's tree
back; a bundle for another base or a tampered one is refused with nothing changed.

The module's lab has six hosts: hosts 1 to 3 (one of each variant) are deployed, hosts 4 to 6
are their pristine twins. The module's fixtures make the state the tests start from: the deploy,
the bundles, and patch_ops.sh applied on every twin (for the tests of applying and restoring).
That the bundle's script passes shellcheck needs no host: tests/unit/plugins/plugin_utils/
test_submission.py checks it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from lab_files import current_release, recorded
from lab_guard import built_lab
from playbook_runs import ONE_BATCH, run_playbook


pytestmark = pytest.mark.lab

DEPLOY = "deploy.yml"
SUBMISSION = "submission.yml"
BUILD_TASK = "Build the bundle on the controller"
RELEASE = "sub510"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Three deployed hosts and their three pristine twins (the variants repeat every three)."""
    yield from built_lab(tmp_path_factory, n_hosts=6)


@pytest.fixture(scope="module")
def twins(lab):
    """(deployed host, its pristine twin) per variant."""
    return [(lab.hosts[index], lab.hosts[index + 3]) for index in range(3)]


def deployed_hosts(lab, count: int = 3) -> str:
    """The limit of the first `count` deployed hosts (the twins are never deployed to)."""
    return ",".join(host.name for host in lab.hosts[:count])


@pytest.fixture(scope="module")
def deployed(lab, tmp_path_factory):
    run = run_playbook(DEPLOY, lab.inventory_path, tmp_path_factory.mktemp("deploy"),
                       limit=deployed_hosts(lab), extravars={"serving_release": RELEASE, **ONE_BATCH})
    assert run.rc == 0, run.stats
    return run


@pytest.fixture(scope="module")
def bundles(lab, deployed, tmp_path_factory):
    """{variant: bundle folder}: the vendor hosts' bundle, and the upstream host's, whose engine
    serves another model and so is a submission of its own."""
    out = tmp_path_factory.mktemp("submissions")
    upstream_host = lab.hosts[2].name
    vendor = run_playbook(SUBMISSION, lab.inventory_path, out / "vendor-run", limit=deployed_hosts(lab),
                          extravars={"serving_release": RELEASE, "serving_submission_dir": str(out / "vendor")})
    upstream = run_playbook(SUBMISSION, lab.inventory_path, out / "upstream-run", limit=upstream_host,
                            extravars={"serving_release": RELEASE, "serving_submission_dir": str(out / "upstream")})
    assert vendor.rc == 0 and upstream.rc == 0, (vendor.stats, upstream.stats)
    (built,) = vendor.results(lab.hosts[0].name, BUILD_TASK)
    return {"run": vendor, "result": built, "vendor": out / "vendor" / RELEASE,
            "upstream": out / "upstream" / RELEASE}


def tree_of(host) -> dict[str, tuple]:
    """Every entry of the host's vllm package: (sha256, mode) of a file, the text of a link."""
    root = host.path(host.package_root)
    entries = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            entries[relative] = ("link", str(path.readlink()))
        elif stat.S_ISREG(info.st_mode):
            entries[relative] = (hashlib.sha256(path.read_bytes()).hexdigest(), stat.S_IMODE(info.st_mode))
        else:
            entries[relative] = ("dir", stat.S_IMODE(info.st_mode))
    return entries


def patch_ops(lab, host, bundle: Path, *options: str) -> subprocess.CompletedProcess:
    """The bundle's patch_ops.sh, run on the host by its sh (Debian's dash), as the platform does."""
    command = lab.ssh_command(host, "sh", str(bundle / "patch_ops.sh"), *options)
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_the_bundle_carries_what_the_release_was_proven_with(lab, bundles):
    bundle, built = bundles["vendor"], bundles["result"]
    h1, h2 = lab.hosts[0], lab.hosts[1]
    record = current_release(h1)
    # The run file the release recorded, not one rendered from the inventory now.
    assert (bundle / "computility-run.yaml").read_text() == recorded(record, "engine")["platform_run"]
    document = yaml.safe_load((bundle / "computility-run.yaml").read_text())
    assert {key: document["parameters"][key] for key in recorded(record, "engine")["args"]} == recorded(record, "engine")["args"]
    assert document["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8,max_split_size_mb:512"
    # One variant per vendor base: the vendor's (registry kept) and the unregistered one's
    # (registry patched); the upstream host serves another model, so it is left out, named.
    assert sorted(tuple(variant["hosts"]) for variant in built["variants"]) == [(h1.name,), (h2.name,)]
    assert [entry["host"] for entry in built["left_out"]] == [lab.hosts[2].name]
    assert "/opt/models/qwen3_moe" in built["left_out"][0]["reason"]
    # Every file is summed; the files are the very bytes the hosts installed.
    sums = dict(reversed(line.split("  ", 1)) for line in (bundle / "SHA256SUMS").read_text().splitlines())
    listed = sorted(path.relative_to(bundle).as_posix() for path in bundle.rglob("*")
                    if path.is_file() and path.name != "SHA256SUMS")
    assert sorted(sums) == listed
    for name, expected in sums.items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == expected, name
    for host in (h1, h2):
        for path, digest in current_release(host)["digests"].items():
            installed = host.path(f"{host.package_root}/{path}").read_bytes()
            carried = [name for name in sums if name.startswith("files/") and name.endswith("/" + path)
                       and sums[name] == digest]
            assert carried and hashlib.sha256(installed).hexdigest() == digest, (host.name, path)
    readme = (bundle / "README.md").read_text()
    # The brief's table: the release's first deploy changed every entry and setting against the base.
    for mapping in record["mappings"]:
        assert f"| {mapping['source']} | {mapping['place']} | {mapping['change']} |" in readme
    assert "| device_reduce policy_selector | computility-run.yaml params | launch parameters aligned with Sub168 |" in readme
    assert "| agent_reduce_by_key ConsumeTile | serving_chat.py | fast path / safe path split | not yet built |" in readme
    assert (bundle / "patch_ops.sh").stat().st_mode & 0o777 == 0o755


def bundle_for(bundles, host) -> Path:
    return bundles["upstream" if host.variant == "upstream" else "vendor"]


@pytest.fixture(scope="module")
def applied(lab, twins, bundles):
    """patch_ops.sh run twice on every pristine twin: per twin, its tree before, and both runs."""
    runs = {}
    for _deployed, twin in twins:
        before = tree_of(twin)
        first = patch_ops(lab, twin, bundle_for(bundles, twin))
        runs[twin.name] = {"before": before, "first": first, "again": patch_ops(lab, twin, bundle_for(bundles, twin))}
    return runs


def test_patch_ops_makes_the_fleets_tree_on_every_twin(twins, applied):
    for deployed, twin in twins:
        before, first, again = (applied[twin.name][key] for key in ("before", "first", "again"))
        assert before != tree_of(deployed)
        assert first.returncode == 0, first.stdout + first.stderr
        assert tree_of(twin) == tree_of(deployed), twin.name
        assert first.stdout.splitlines()[-1].endswith("OK")
        assert "installed entrypoints/openai/serving_chat.py" in first.stdout
        assert again.returncode == 0 and "installed" not in again.stdout.replace(" 0 installed", ""), again.stdout


def test_restore_brings_back_the_vendors_tree(lab, twins, bundles, applied):
    for _deployed, twin in twins:
        assert applied[twin.name]["first"].returncode == 0 and twin.path(f"{twin.package_root}.patch-ops-backup").exists()

        restored = patch_ops(lab, twin, bundle_for(bundles, twin), "--restore")

        assert restored.returncode == 0, restored.stdout + restored.stderr
        root = twin.path(twin.package_root)
        now = {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
               for path in root.rglob("*") if path.is_file()}
        assert now == twin.package_sha256, twin.name
        assert not twin.path(f"{twin.package_root}.patch-ops-backup").exists()


def test_a_rebuild_changes_nothing_and_its_archive_is_byte_identical(lab, bundles, tmp_path):
    archive = bundles["vendor"].with_suffix(".tar.gz")
    before = archive.read_bytes()
    # The inventory's values now differ from the release's: the bundle keeps the release's.
    again = run_playbook(SUBMISSION, lab.inventory_path, tmp_path, limit=deployed_hosts(lab), extravars={
        "serving_release": RELEASE, "serving_submission_dir": str(archive.parent),
        "engine_args": {"max_num_seqs": 4}})
    assert again.rc == 0 and again.hosts_with("changed") == set()
    assert archive.read_bytes() == before
    with tarfile.open(fileobj=io.BytesIO(before)) as members:
        names = members.getnames()
        assert names == sorted(names) and all(name.startswith(RELEASE) for name in names)
        assert {member.mtime for member in members.getmembers()} == {0}


def test_a_base_the_bundle_was_not_made_for_is_refused_and_changes_nothing(lab, twins, bundles):
    twin = twins[0][1]
    chat = twin.path(f"{twin.package_root}/entrypoints/openai/serving_chat.py")
    vendors = chat.read_bytes()
    # Another build of the base: one serving file the bundle patches is not the one it knows.
    chat.write_bytes(vendors + b"# another vendor build\n")
    before = tree_of(twin)
    try:
        refused = patch_ops(lab, twin, bundles["vendor"])
        after = tree_of(twin)
    finally:
        chat.write_bytes(vendors)

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "entrypoints/openai/serving_chat.py is sha256" in refused.stdout + refused.stderr
    assert after == before


def test_a_tampered_bundle_is_refused_and_changes_nothing(lab, twins, bundles, tmp_path):
    twin = twins[1][1]
    before = tree_of(twin)
    tampered = tmp_path / RELEASE
    shutil.copytree(bundles["vendor"], tampered)
    # A model-layer file slipped into the manifest, its sums made to match: the script itself
    # refuses a target outside the serving layer, whatever the sums say.
    variant = next(line.split("\t")[1] for line in (tampered / "MANIFEST").read_text().splitlines()
                   if line.startswith("variant\t"))
    payload = tampered / "files" / variant / "sequence.py"
    payload.write_text("# not the vendor's\n")
    sequence = twin.path(f"{twin.package_root}/sequence.py").read_bytes()
    with (tampered / "MANIFEST").open("a") as manifest:
        manifest.write(f"file\t{variant}\tsequence.py\t{hashlib.sha256(sequence).hexdigest()}\t"
                       f"{hashlib.sha256(payload.read_bytes()).hexdigest()}\n")
    sums = subprocess.run("find . -type f ! -name SHA256SUMS | sort | sed 's|^./||' | xargs sha256sum",
                          shell=True, cwd=tampered, capture_output=True, text=True, check=True).stdout
    (tampered / "SHA256SUMS").write_text(sums)

    refused = patch_ops(lab, twin, tampered)

    assert refused.returncode == 1 and "sequence.py" in refused.stdout + refused.stderr
    assert tree_of(twin) == before


def test_a_release_not_good_on_a_named_host_is_refused_unless_forced(lab, deployed, tmp_path):
    host = lab.hosts[1]
    record_file = host.path(f"/var/lib/biv100-serving/releases/{RELEASE}/release.json")
    proven = record_file.read_text()
    record = json.loads(proven)
    record["status"] = "failed"
    record_file.write_text(json.dumps(record))
    try:
        refused = run_playbook(SUBMISSION, lab.inventory_path, tmp_path / "refused", limit=deployed_hosts(lab, 2),
                               extravars={"serving_release": RELEASE, "serving_submission_dir": str(tmp_path / "out")})
        forced = run_playbook(SUBMISSION, lab.inventory_path, tmp_path / "forced", limit=deployed_hosts(lab, 2),
                              extravars={"serving_release": RELEASE, "serving_submission_force": True,
                                         "serving_submission_dir": str(tmp_path / "forced-out")})
    finally:
        record_file.write_text(proven)

    assert refused.rc != 0
    (failure,) = [event["event_data"]["res"]["msg"] for event in refused.events
                  if event["event"] == "runner_on_failed"]
    assert host.name in failure and "failed" in failure
    assert not (tmp_path / "out").exists()
    assert forced.rc == 0
    assert host.name in (tmp_path / "forced-out" / RELEASE / "README.md").read_text()
