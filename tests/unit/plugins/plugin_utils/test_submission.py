"""The submission bundle built from the hosts' exports of a release: what it holds, per variant of
the vendor's base; what it refuses, naming the host and the path; the same bytes for the same
exports, whatever the hosts' order; and an archive that depends on nothing else."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import io
import re
import subprocess
import tarfile

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils import _patch_ops
from ansible_collections.biv100.serving.plugins.plugin_utils._submission import (
    SubmissionError,
    archive,
    build,
    variant_id,
)

CHAT = "entrypoints/openai/serving_chat.py"
PARSER = "reasoning/qwen3_5_reasoning_parser.py"
REGISTRY = "model_executor/models/registry.py"
COREX_PYTHON = "/usr/local/corex/bin/python3"

RUN = """\
env:
  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True,max_split_size_mb:512
parameters:
  tensor_parallel_size: 4
  model: /opt/models/qwen3_5
  served_model_name: qwen3.5
  port: 8000
command: [python, -m, vllm.entrypoints.openai.api_server, --tensor-parallel-size, '4']
"""
MOE_RUN = RUN.replace("/opt/models/qwen3_5", "/opt/models/qwen3_moe")

# The vendor's files of two bases: the older one lacks Qwen3_5 in its registry, so the release
# installs the registry there only.
BASES = {
    "0.10.1.1": {CHAT: b"# vendor chat, 0.10\n", REGISTRY: b"# vendor registry, no Qwen3_5\n", PARSER: None},
    "0.11.0": {CHAT: b"# vendor chat, 0.11\n", REGISTRY: b"# vendor registry with Qwen3_5\n", PARSER: None},
}
INSTALLED = {CHAT: b"# chat serving with n=2\n", PARSER: b"# the qwen3_5 reasoning parser\n",
             REGISTRY: b"# registry with Qwen3_5\n"}
MAPPINGS = {
    CHAT: {"source": "n>1 choices", "place": CHAT, "change": "file", "entry": "serving-chat", "paths": [CHAT],
           "proven_by": ["n-two"]},
    PARSER: {"source": "thinking split", "place": "reasoning/", "change": "file", "entry": "qwen3-5-parser",
             "paths": [PARSER], "proven_by": []},
    REGISTRY: {"source": "register Qwen3_5", "place": REGISTRY, "change": "patch", "entry": "qwen3-5-registry",
               "paths": [REGISTRY], "proven_by": ["chat-basic"]},
}
# What serving_release recorded each release changed against the last good one.
ALLOCATOR = {"kind": "setting", "source": "buddy_allocator.cu", "place": "computility-run.yaml env",
             "change": "PYTORCH_CUDA_ALLOC_CONF", "what": "max_split_size_mb = 512",
             "proven_by": ["two-long-prompts-at-once"], "settings": ["engine_allocator.max_split_size_mb"]}
FAILURE_POINTS = [{"name": "model-layer-untouched", "failure": "model-layer files deployed",
                   "fixed_by": "the guard", "proven_by": ["guard"]}]
PLANNED = [{"source": "agent_reduce_by_key ConsumeTile", "place": "serving_chat.py",
            "change": "fast path / safe path split"}]


def changes(paths):
    return [dict(kind="file", what=path, **{key: value for key, value in MAPPINGS[path].items() if key != "paths"})
            for path in paths] + [ALLOCATOR]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def latency(p50):
    return {"mean": p50, "p50": p50, "p90": p50 * 1.5, "p99": p50 * 2}


GATES = {
    "bench": {"score": 8437.1, "input_tps": 2000.0, "output_tps": 9755.5, "total_tps": 11755.5,
              "request_tps": 2.5, "requests": {"ok": 64, "failed": 0}, "ttft_ms": latency(120.0),
              "tpot_ms": latency(30.0), "itl_ms": latency(29.0), "e2e_ms": latency(3000.0),
              "weights": {"output": 0.83, "input": 0.17}, "gate": {"score": 8000, "passed": True},
              "simulated": True, "workload": "random 1024/256"},
    "quality": {"score": 0.969, "cases": 200, "correct": 194, "baseline": {"release": "sub168", "score": 0.981},
                "deviation": -0.0122, "bound": 0.04, "passed": True, "simulated": True},
}


def export(version="0.10.1.1", status="good", run=RUN, **record_fields):
    """A host's export of sub510, as serving_release returns it with state: exported."""
    paths = [CHAT, PARSER, REGISTRY] if version == "0.10.1.1" else [CHAT, PARSER]
    record = {
        "id": "sub510", "status": status, "created_at": "2026-12-01T10:00:00Z", "previous": "sub509",
        "digests": {path: sha(INSTALLED[path]) for path in paths},
        "files": {path: {"before": sha(BASES[version][path]) if BASES[version][path] else None,
                         "after": sha(INSTALLED[path])} for path in paths},
        "engine": {"instances": {"vllm": {"args": {"tensor_parallel_size": 4}, "allocator": {}, "env": {},
                                          "platform_run": run}}},
        "vllm_version": version, "payload_digest": "9" * 64,
        "mappings": [MAPPINGS[path] for path in paths],
        "changes": changes(paths), "failure_points": FAILURE_POINTS, "planned": PLANNED,
        "gates": {"instances": {"vllm": copy.deepcopy(GATES)}},
        "history": [{"status": "pending", "at": "2026-12-01T10:00:00Z", "reason": "staged"},
                    {"status": status, "at": "2026-12-01T10:20:00Z",
                     "reason": "75/75 probes passed (at least 50); quality 0.969; score 8437"}],
    }
    record.update(record_fields)
    return {
        "release": "sub510",
        "status": status,
        "record": record,
        "contents": {path: base64.b64encode(INSTALLED[path]).decode("ascii") for path in paths},
        "vendor": {path: sha(data) if data is not None else None for path, data in BASES[version].items()},
    }


def host(name, version="0.10.1.1", interpreter=COREX_PYTHON, **fields):
    return {"name": name, "interpreter": interpreter, "export": export(version, **fields)}


def fleet():
    """Two hosts of the older base, one of the newer, one that ran another model."""
    return [host("h1"), host("h2"), host("h3", "0.11.0", interpreter="/usr/bin/python3"),
            host("h4", run=MOE_RUN, interpreter="/opt/moe/bin/python3")]


def manifest_records(bundle):
    lines = bundle.files["MANIFEST"].decode().splitlines()
    assert lines[0] == "# biv100.serving submission sub510: read by patch_ops.sh; see README.md"
    return [line.split("\t") for line in lines[1:]]


OLD_ID = variant_id([(CHAT, sha(BASES["0.10.1.1"][CHAT])), (PARSER, None),
                     (REGISTRY, sha(BASES["0.10.1.1"][REGISTRY]))])
NEW_ID = variant_id([(CHAT, sha(BASES["0.11.0"][CHAT])), (PARSER, None),
                     (REGISTRY, sha(BASES["0.11.0"][REGISTRY]))])


# --- what the bundle holds -----------------------------------------------------------------------


def test_the_bundle_holds_its_files_in_byte_order_with_their_modes():
    bundle = build("sub510", fleet())

    assert list(bundle.files) == sorted(
        ["MANIFEST", "README.md", "SHA256SUMS", "computility-run.yaml", "patch_ops.sh",
         f"files/{OLD_ID}/{CHAT}", f"files/{OLD_ID}/{PARSER}", f"files/{OLD_ID}/{REGISTRY}",
         f"files/{NEW_ID}/{CHAT}", f"files/{NEW_ID}/{PARSER}"], key=str.encode)
    assert {path: oct(bundle.mode(path)) for path in bundle.files if bundle.mode(path) != 0o644} == {
        "patch_ops.sh": "0o755"}
    for variant in (OLD_ID, NEW_ID):
        assert bundle.files[f"files/{variant}/{CHAT}"] == INSTALLED[CHAT]
    assert bundle.files[f"files/{OLD_ID}/{REGISTRY}"] == INSTALLED[REGISTRY]
    assert bundle.reference == "h1" and bundle.forced == ()


def test_the_manifest_names_every_union_path_for_every_variant_with_its_base_and_result():
    records = manifest_records(build("sub510", fleet()))

    old, new = BASES["0.10.1.1"], BASES["0.11.0"]
    assert records == sorted([
        ["variant", OLD_ID, "0.10.1.1", "h1,h2"],
        ["variant", NEW_ID, "0.11.0", "h3"],
    ], key=lambda record: record[1]) + sorted([
        ["file", OLD_ID, CHAT, sha(old[CHAT]), sha(INSTALLED[CHAT])],
        ["file", OLD_ID, REGISTRY, sha(old[REGISTRY]), sha(INSTALLED[REGISTRY])],
        ["file", OLD_ID, PARSER, "-", sha(INSTALLED[PARSER])],
        ["file", NEW_ID, CHAT, sha(new[CHAT]), sha(INSTALLED[CHAT])],
        # The newer base's release left its registry alone: it stays the vendor's ("keep").
        ["file", NEW_ID, REGISTRY, sha(new[REGISTRY]), sha(new[REGISTRY])],
        ["file", NEW_ID, PARSER, "-", sha(INSTALLED[PARSER])],
    ], key=lambda record: (record[1], record[2]))


def test_a_variant_id_is_the_sha256_of_its_sorted_path_and_base_lines():
    lines = sorted(f"{path}\t{sha(data) if data else '-'}\n" for path, data in BASES["0.10.1.1"].items())
    assert OLD_ID == hashlib.sha256("".join(lines).encode()).hexdigest()[:12]
    assert re.fullmatch(r"[0-9a-f]{12}", OLD_ID) and OLD_ID != NEW_ID


def test_the_variants_do_not_depend_on_the_hosts_order():
    hosts = fleet()
    forward = build("sub510", hosts, reference="h2")
    backward = build("sub510", list(reversed(hosts)), reference="h2")

    assert [variant.summary() for variant in forward.variants] == [variant.summary() for variant in backward.variants]
    assert forward.files == backward.files
    assert {variant.id: variant.hosts for variant in forward.variants} == {OLD_ID: ("h1", "h2"), NEW_ID: ("h3",)}
    by_id = {variant.id: variant for variant in forward.variants}
    assert by_id[NEW_ID].installed == [CHAT, PARSER] and by_id[NEW_ID].kept == [REGISTRY]
    assert by_id[OLD_ID].kept == []


def test_the_run_document_is_the_reference_s_verbatim_and_the_script_has_the_included_interpreters():
    bundle = build("sub510", fleet())
    script = bundle.files["patch_ops.sh"].decode()

    assert bundle.files["computility-run.yaml"] == RUN.encode()
    assert "RELEASE='sub510'\n" in script
    # Sorted, once each; h4 is left out, so its interpreter is not tried.
    assert f"FLEET_INTERPRETERS='/usr/bin/python3 {COREX_PYTHON}'\n" in script
    assert _patch_ops.serving_patterns() in script and _patch_ops.protected_patterns() in script


def test_the_bundles_script_passes_shellcheck_for_the_platforms_sh(tmp_path):
    script = tmp_path / "patch_ops.sh"
    script.write_bytes(build("sub510", fleet()).files["patch_ops.sh"])

    checked = subprocess.run(["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True, check=False)

    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")


def test_sha256sums_lists_every_other_file_in_byte_order():
    bundle = build("sub510", fleet())
    lines = bundle.files["SHA256SUMS"].decode().splitlines()

    listed = [line.split("  ", 1)[1] for line in lines]
    assert listed == sorted((path for path in bundle.files if path != "SHA256SUMS"), key=str.encode)
    for line in lines:
        digest, path = line.split("  ", 1)
        assert digest == sha(bundle.files[path])


# --- refusals ------------------------------------------------------------------------------------


def test_a_named_host_that_does_not_hold_the_release_is_refused_by_name():
    hosts = fleet()
    hosts[2]["export"]["status"] = None
    with pytest.raises(SubmissionError, match="^host h3 does not hold release sub510$"):
        build("sub510", hosts)
    hosts[2]["export"] = None
    with pytest.raises(SubmissionError, match="^host h3 does not hold release sub510$"):
        build("sub510", hosts)


def test_a_release_not_good_on_a_named_host_is_refused_naming_host_and_status_unless_forced():
    hosts = fleet()
    hosts[1] = host("h2", status="failed")
    hosts[2] = host("h3", "0.11.0", status="pending")
    with pytest.raises(SubmissionError, match=r"^release sub510 is not good on h2 \(failed\), h3 \(pending\): "):
        build("sub510", hosts)

    forced = build("sub510", hosts, force=True)
    readme = forced.files["README.md"].decode()
    assert forced.forced == (("h2", "failed"), ("h3", "pending"))
    # Said before anything else, right under the title.
    assert readme.splitlines()[4] == (
        "> **Built with force: release sub510 was not proven good on h2 (failed), h3 (pending).** "
        "The fleet did not stand behind this bundle on those hosts: submit it knowingly.")
    assert "proven good on h1." in readme.splitlines()[2]


def test_a_reference_without_its_run_document_is_refused_naming_the_host():
    hosts = fleet()
    del hosts[1]["export"]["record"]["engine"]["instances"]["vllm"]["platform_run"]
    with pytest.raises(SubmissionError, match=(
            r"^host h2: release sub510 was recorded before run documents were kept .*"
            r"deploy it again under a new release id$")):
        build("sub510", hosts, reference="h2")
    # Another host without one is only left out.
    bundle = build("sub510", hosts)
    assert [(item.host, item.reason) for item in bundle.left_out] == [
        ("h2", "recorded before run documents were kept (no engine.platform_run in its record)"),
        ("h4", "runs another engine: model: /opt/models/qwen3_moe (line 5 of its computility-run.yaml, "
               "where h1's has model: /opt/models/qwen3_5)")]


def test_a_reference_that_is_not_named_is_refused():
    with pytest.raises(SubmissionError, match=r"^reference host h9 is not one of the named hosts \(h1, h2, h3, h4\)$"):
        build("sub510", fleet(), reference="h9")


def test_a_host_without_the_vendor_digest_of_a_union_path_is_refused_naming_host_and_path():
    hosts = fleet()
    del hosts[2]["export"]["vendor"][REGISTRY]
    with pytest.raises(SubmissionError, match=f"^host h3 does not report the vendor's digest of {REGISTRY}$"):
        build("sub510", hosts)
    # The host says why when it could not read the file: a link in the vendor's tree, say.
    hosts[2]["export"]["unsafe"] = {REGISTRY: f"{REGISTRY}: model_executor is a symlink to /elsewhere"}
    with pytest.raises(SubmissionError, match=(
            f"^host h3 does not report the vendor's digest of {REGISTRY}: {REGISTRY}: model_executor is a symlink")):
        build("sub510", hosts)


def test_two_hosts_of_one_base_that_installed_different_files_are_refused_naming_both_and_the_path():
    hosts = fleet()
    other = b"# another chat\n"
    hosts[1]["export"]["record"]["digests"][CHAT] = sha(other)
    hosts[1]["export"]["contents"][CHAT] = base64.b64encode(other).decode()
    with pytest.raises(SubmissionError, match=(
            f"^hosts h1 and h2 have the same vendor base but installed different files at {CHAT} "
            fr"\(sha256 {sha(INSTALLED[CHAT])[:12]}\.\.\. and sha256 {sha(other)[:12]}\.\.\.\)$")):
        build("sub510", hosts)


def test_a_release_that_removes_a_vendor_file_is_refused():
    hosts = fleet()
    hosts[2]["export"]["record"]["digests"][REGISTRY] = None
    with pytest.raises(SubmissionError, match=(
            f"^host h3: release would remove {REGISTRY}, which the vendor's base has "
            fr"\(sha256 {sha(BASES['0.11.0'][REGISTRY])}\): a submission only installs files$")):
        build("sub510", hosts)


def test_kept_bytes_that_are_not_the_recorded_ones_are_refused():
    hosts = fleet()
    tampered = b"# tampered\n"
    hosts[1]["export"]["contents"][CHAT] = base64.b64encode(tampered).decode()
    with pytest.raises(SubmissionError, match=f"^host h2: the kept content of {CHAT} has sha256 {sha(tampered)}, "):
        build("sub510", hosts)
    del hosts[1]["export"]["contents"][CHAT]
    with pytest.raises(SubmissionError, match=f"^host h2: the export holds no content for {CHAT} "):
        build("sub510", hosts)


@pytest.mark.parametrize("path, why", [
    ("worker/model_runner.py", "is outside the serving layer"),
    ("../etc/passwd", "is not a package path"),
    ("entrypoints//api_server.py", "is not a package path"),
    ("entrypoints/openai/$(id).py", "is not a package path"),
])
def test_a_path_outside_the_serving_layer_or_not_plain_is_refused(path, why):
    hosts = fleet()
    hosts[0]["export"]["record"]["digests"][path] = sha(b"x")
    with pytest.raises(SubmissionError, match=f"^host h1: {re.escape(repr(path) if 'not a package' in why else path)} {why}"):
        build("sub510", hosts)


def test_a_protected_file_is_refused(monkeypatch):
    from ansible_collections.biv100.serving.plugins.plugin_utils import _submission
    monkeypatch.setattr(_submission, "PROTECTED_LOCATIONS", frozenset({CHAT}))
    with pytest.raises(SubmissionError, match=f"^host h1: {CHAT} is one of the protected files$"):
        build("sub510", fleet())


@pytest.mark.parametrize("release", ["", ".hidden", "sub 510", "../x", "sub510/x"])
def test_a_release_id_that_is_not_a_plain_name_is_refused(release):
    with pytest.raises(SubmissionError, match="a release id is letters, digits"):
        build(release, fleet())


def test_names_manifest_cannot_carry_are_refused():
    hosts = fleet()
    hosts[0]["name"] = "h1,h2"
    with pytest.raises(SubmissionError, match=r"^hosts\[1\]: name 'h1,h2' is not a host name"):
        build("sub510", hosts)
    hosts = fleet()
    hosts[3]["name"] = "h1"
    with pytest.raises(SubmissionError, match="^host h1 is named twice$"):
        build("sub510", hosts)
    hosts = fleet()
    hosts[0]["export"]["record"]["vllm_version"] = "0.10\t1"
    with pytest.raises(SubmissionError, match=r"^host h1: vllm_version '0.10\\t1' is not a version string$"):
        build("sub510", hosts)
    with pytest.raises(SubmissionError, match="^no hosts named"):
        build("sub510", [])


# --- hosts left out ------------------------------------------------------------------------------


def test_a_host_that_ran_another_engine_is_left_out_naming_its_first_differing_line():
    bundle = build("sub510", fleet())

    assert [(item.host, item.reason) for item in bundle.left_out] == [
        ("h4", "runs another engine: model: /opt/models/qwen3_moe (line 5 of its computility-run.yaml, "
               "where h1's has model: /opt/models/qwen3_5)")]
    assert all("h4" not in variant.hosts for variant in bundle.variants)
    assert "/opt/moe/bin/python3" not in bundle.files["patch_ops.sh"].decode()


def test_the_reference_is_always_in_and_decides_which_engine_the_bundle_is_for():
    bundle = build("sub510", fleet(), reference="h4")

    assert bundle.files["computility-run.yaml"] == MOE_RUN.encode()
    assert [variant.hosts for variant in bundle.variants] == [("h4",)]
    assert [item.host for item in bundle.left_out] == ["h1", "h2", "h3"]
    assert bundle.left_out[0].reason == ("runs another engine: model: /opt/models/qwen3_5 (line 5 of its "
                                         "computility-run.yaml, where h4's has model: /opt/models/qwen3_moe)")


def test_a_run_document_longer_shorter_or_with_other_line_ends_is_another_engine():
    longer = host("h2", run=RUN + "secret_env: [VLLM_API_KEY]\n")
    shorter = host("h3", run=RUN.split("command:", maxsplit=1)[0])
    crlf = host("h4", run=RUN.replace("\n", "\r\n"))
    reasons = {item.host: item.reason for item in build("sub510", [host("h1"), longer, shorter, crlf]).left_out}

    assert reasons == {
        "h2": "runs another engine: secret_env: [VLLM_API_KEY] (line 9 of its computility-run.yaml, "
              "where h1's has ended)",
        "h3": "runs another engine: its computility-run.yaml ends at line 8, where h1's has "
              "command: [python, -m, vllm.entrypoints.openai.api_server, --tensor-parallel-size, '4']",
        "h4": "runs another engine: its computility-run.yaml differs from h1's in its line endings",
    }


# --- README --------------------------------------------------------------------------------------


def test_the_readme_says_what_the_bundle_holds_how_to_use_it_and_what_the_release_was_proven_with():
    readme = build("sub510", fleet()).files["README.md"].decode()

    assert readme.startswith("# Submission sub510\n\nRelease **sub510**, status **good** on h1 (the reference "
                             "host); proven good on h1, h2, h3.\n")
    for usage in ("`sh patch_ops.sh --dry-run`", "`sh patch_ops.sh`", "`sh patch_ops.sh --restore`",
                  "`--vllm-root DIR`", "`computility-run.yaml` is the platform's run document"):
        assert usage in readme
    # The gates' figures of the reference's record, marked simulated as the record says.
    assert "Staged at 2026-12-01T10:00:00Z. Marked good at 2026-12-01T10:20:00Z: 75/75 probes passed" in readme
    assert "| functional | passed |" in readme
    assert ("| quality | passed | score 0.969 (194/200 correct), deviation -1.2 % from sub168 (0.981), "
            "gate ±4 % (sim) |") in readme
    assert ("| throughput | passed | score 8437 (gate ≥ 8000) = 0.83 × output + 0.17 × input tok/s; "
            "9755.5 output tok/s; 2000.0 input tok/s; 11755.5 total tok/s; 2.5 requests/s; "
            "TTFT p50/p90/p99 120.0/180.0/240.0 ms; TPOT p50/p90/p99 30.0/45.0/60.0 ms; ") in readme
    assert "(sim): simulated - measured on the lab's engine stand-in" in readme
    # The brief's table: each change once, naming the hosts of one not every host made, then the planned.
    assert "| source | place in the base | kind of change | what changed | proven by |" in readme
    assert f"| n>1 choices | {CHAT} | file | {CHAT} | n-two |" in readme
    assert f"| register Qwen3_5 | {REGISTRY} | patch | {REGISTRY} (on h1, h2) | chat-basic |" in readme
    assert ("| buddy_allocator.cu | computility-run.yaml env | PYTORCH_CUDA_ALLOC_CONF | max_split_size_mb = 512 | "
            "two-long-prompts-at-once |") in readme
    assert "| agent_reduce_by_key ConsumeTile | serving_chat.py | fast path / safe path split | not yet built |  |" in readme
    assert "- model-layer files deployed: fixed by the guard; proven by guard." in readme
    assert (f"| `{NEW_ID}` | 0.11.0 | h3 | `{CHAT}`, `{PARSER}` | `{REGISTRY}` |") in readme
    assert (f"| `{OLD_ID}` | 0.10.1.1 | h1, h2 | `{CHAT}`, `{REGISTRY}`, `{PARSER}` | - |") in readme
    assert "| h4 | runs another engine: model: /opt/models/qwen3_moe (line 5" in readme
    assert "Built with force" not in readme


def test_the_readme_of_real_figures_or_none_says_so():
    hosts = fleet()[:1]
    record = hosts[0]["export"]["record"]
    record["gates"]["instances"]["vllm"]["bench"]["simulated"] = False
    record["gates"]["instances"]["vllm"]["quality"] = None
    readme = build("sub510", hosts).files["README.md"].decode()
    assert "(sim)" not in readme and "| quality | not measured | - |" in readme
    assert "None: every named host ran the engine of computility-run.yaml." in readme

    del record["gates"]
    record.update(changes=[], planned=[], failure_points=[])
    readme = build("sub510", hosts).files["README.md"].decode()
    assert "| quality | not measured | - |" in readme and "| throughput | not measured | - |" in readme
    assert "The release records no change against the last good release." in readme
    assert "Fixed failure points" not in readme

    hosts[0]["export"]["record"]["gates"] = {"instances": {"vllm": {
        "bench": dict(GATES["bench"], gate={"score": 9000, "passed": False})}}}
    assert "| throughput | **FAILED** | score 8437 (gate ≥ 9000)" in build("sub510", hosts).files["README.md"].decode()


def test_the_readme_holds_no_time_but_the_records():
    readme = build("sub510", fleet()).files["README.md"].decode()
    assert set(re.findall(r"\d{4}-\d\d-\d\dT[\d:]+Z", readme)) == {"2026-12-01T10:00:00Z", "2026-12-01T10:20:00Z"}


# --- the same bytes ------------------------------------------------------------------------------


def test_two_builds_of_the_same_exports_are_byte_identical_and_so_are_their_archives():
    first, second = build("sub510", fleet()), build("sub510", copy.deepcopy(fleet()))
    assert first.files == second.files and list(first.files) == list(second.files)
    assert archive(first) == archive(second)


def test_the_archive_holds_the_folder_under_the_release_with_fixed_metadata():
    bundle = build("sub510", fleet())
    data = archive(bundle)

    # gzip header: no file name (FLG 0), mtime 0.
    assert data[:4] == b"\x1f\x8b\x08\x00" and data[4:8] == b"\x00\x00\x00\x00"
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as tar:
        members = tar.getmembers()
        names = [member.name for member in members]
        assert names == sorted(names, key=str.encode)
        assert names[0] == "sub510"
        folders = {"sub510", "sub510/files", f"sub510/files/{OLD_ID}", f"sub510/files/{NEW_ID}"}
        assert folders <= {member.name for member in members if member.isdir()}
        for member in members:
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
            if member.isdir():
                assert member.mode == 0o755
            else:
                assert member.isfile()
                assert member.mode == (0o755 if member.name == "sub510/patch_ops.sh" else 0o644)
                assert tar.extractfile(member).read() == bundle.files[member.name.removeprefix("sub510/")]
        assert {member.name.removeprefix("sub510/") for member in members if member.isfile()} == set(bundle.files)


def test_a_host_of_several_instances_gives_the_run_document_of_its_first_instance_by_name():
    hosts = fleet()
    engine = hosts[0]["export"]["record"]["engine"]["instances"]["vllm"]
    hosts[0]["export"]["record"]["engine"] = {"instances": {
        "vllm-2": {**engine, "platform_run": engine["platform_run"].replace("8000", "8001")},
        "vllm-1": engine}}
    bundle = build("sub510", hosts)
    assert bundle.files["computility-run.yaml"] == engine["platform_run"].encode()
