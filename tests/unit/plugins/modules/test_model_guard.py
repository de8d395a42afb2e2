"""biv100.serving.model_guard through AnsibleModule, on a small package tree and state dir."""

from __future__ import annotations

import hashlib
import json

import pytest

from ansible_collections.biv100.serving.plugins.modules import model_guard

SAMPLER = "model_executor/layers/sampler.py"
SCHEDULER = "core/scheduler.py"
# Where vllm_facts looks for qwen3_5.py, which this layout lacks.
QWEN3_5 = "model_executor/models/qwen3_5.py"
PROTECTED = {"sampler.py": SAMPLER, "scheduler.py": SCHEDULER, "qwen3_5.py": None}


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "site-packages" / "vllm"
    for path in (SAMPLER, SCHEDULER, "worker/model_runner.py"):
        write(root, path, "# vendor %s\n" % path)
    return root


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


def write(root, path, text):
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


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


def baseline(state_dir):
    return json.loads((state_dir / "baseline" / "protected.json").read_text())


def test_first_contact_records_every_protected_path(guard, package, state_dir):
    failed, result = guard(phase="before stage")
    assert not failed and result["changed"] is True
    recorded = baseline(state_dir)
    assert recorded["package_root"] == str(package)
    assert recorded["files"] == {
        SAMPLER: sha256("# vendor %s\n" % SAMPLER),
        SCHEDULER: sha256("# vendor %s\n" % SCHEDULER),
        QWEN3_5: None,
    }
    assert result["guard"]["recorded"] == sorted(recorded["files"])
    assert result["guard"]["baseline_recorded_at"] == recorded["recorded_at"]
    assert result["guard"]["checked"] == 3
    assert result["msg"] == "recorded 3 in the baseline: %s, %s, %s (before stage)" % (
        SCHEDULER,
        SAMPLER,
        QWEN3_5,
    )


def test_an_unchanged_model_layer_changes_nothing(guard, state_dir):
    guard()
    written = (state_dir / "baseline" / "protected.json").read_bytes()
    failed, result = guard(phase="after stage")
    assert not failed and result["changed"] is False
    assert result["guard"]["mismatches"] == [] and result["guard"]["recorded"] == []
    assert result["guard"]["files"] == baseline(state_dir)["files"]
    assert (state_dir / "baseline" / "protected.json").read_bytes() == written
    assert result["msg"].startswith("3 protected files unchanged since ")


def test_a_modified_file_fails_naming_it_and_the_phase(guard, package, state_dir):
    guard()
    write(package, SAMPLER, "# patched\n")
    failed, result = guard(phase="after stage")
    before, after = sha256("# vendor %s\n" % SAMPLER), sha256("# patched\n")
    assert failed
    expected = "%s sha256 %s\u2026 \u2192 %s\u2026" % (SAMPLER, before[:8], after[:8])
    assert result["msg"] == "model layer changed since first contact (after stage): " + expected
    assert result["guard"]["mismatches"] == [
        {"path": SAMPLER, "baseline": before, "current": after}
    ]
    assert baseline(state_dir)["files"][SAMPLER] == before


def test_a_vanished_file_fails(guard, package):
    guard()
    (package / SCHEDULER).unlink()
    failed, result = guard()
    assert failed
    assert (
        "%s sha256 %s\u2026 \u2192 absent" % (SCHEDULER, sha256("# vendor %s\n" % SCHEDULER)[:8])
        in result["msg"]
    )


def test_a_protected_file_appearing_where_the_layout_had_none_fails(guard, package):
    guard()
    write(package, QWEN3_5, "class Qwen3_5ForCausalLM: pass\n")
    failed, result = guard(phase="after stage")
    assert failed
    assert (
        "(after stage): %s absent \u2192 sha256 %s\u2026"
        % (QWEN3_5, sha256("class Qwen3_5ForCausalLM: pass\n")[:8])
        in result["msg"]
    )


def test_every_mismatch_is_named(guard, package):
    guard()
    write(package, SAMPLER, "# patched\n")
    (package / SCHEDULER).unlink()
    failed, result = guard()
    assert failed
    assert [mismatch["path"] for mismatch in result["guard"]["mismatches"]] == [SCHEDULER, SAMPLER]
    assert SCHEDULER in result["msg"] and SAMPLER in result["msg"]


def test_a_recorded_path_stays_guarded_when_no_longer_asked_for(guard, package):
    guard()
    write(package, SAMPLER, "# patched\n")
    failed, result = guard(protected={"scheduler.py": SCHEDULER})
    assert failed and SAMPLER in result["msg"]


def test_check_mode_records_nothing(guard, state_dir):
    failed, result = guard(_ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert len(result["guard"]["recorded"]) == 3
    assert not state_dir.exists()


def test_check_mode_still_fails_on_a_mismatch(guard, package):
    guard()
    write(package, SAMPLER, "# patched\n")
    failed, result = guard(_ansible_check_mode=True)
    assert failed and SAMPLER in result["msg"]


def test_an_extra_path_is_recorded_then_guarded(guard, package, state_dir):
    guard()
    extra = "model_executor/layers/quantization/awq.py"
    write(package, extra, "# awq\n")
    failed, result = guard(extra=[extra])
    assert not failed and result["changed"] is True
    assert result["guard"]["recorded"] == [extra]
    assert baseline(state_dir)["files"][extra] == sha256("# awq\n")
    write(package, extra, "# awq, tuned\n")
    failed, result = guard(extra=[extra])
    assert failed and extra in result["msg"]


def test_check_mode_does_not_record_a_new_extra_path(guard, package, state_dir):
    guard()
    write(package, "sequence.py", "# sequence\n")
    failed, result = guard(extra=["sequence.py"], _ansible_check_mode=True)
    assert not failed and result["changed"] is True
    assert "sequence.py" not in baseline(state_dir)["files"]


def test_rebaseline_accepts_the_current_files_and_says_so(guard, package, state_dir):
    guard()
    write(package, SAMPLER, "# vendor upgrade\n")
    failed, result = guard(rebaseline=True)
    assert not failed and result["changed"] is True
    assert result["guard"]["rebaselined"] is True
    assert [mismatch["path"] for mismatch in result["guard"]["mismatches"]] == [SAMPLER]
    [warning] = warning_messages(result)
    assert "rebaseline" in warning and SAMPLER in warning
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


def test_a_damaged_baseline_fails_until_rebaselined(guard, state_dir):
    (state_dir / "baseline").mkdir(parents=True)
    (state_dir / "baseline" / "protected.json").write_text("{not json")
    failed, result = guard()
    assert failed and "not valid JSON" in result["msg"] and "rebaseline=true" in result["msg"]
    failed, result = guard(rebaseline=True)
    assert not failed and baseline(state_dir)["files"][SAMPLER]


def test_diff_shows_the_baseline_before_and_after(guard, package):
    failed, result = guard(_ansible_diff=True)
    assert not failed
    assert result["diff"]["before"] == ""
    assert json.loads(result["diff"]["after"])["files"][SAMPLER] == sha256(
        "# vendor %s\n" % SAMPLER
    )
    write(package, "sequence.py", "# sequence\n")
    _, result = guard(extra=["sequence.py"], _ansible_diff=True)
    assert "sequence.py" not in json.loads(result["diff"]["before"])["files"]
    assert "sequence.py" in json.loads(result["diff"]["after"])["files"]
    _, result = guard(extra=["sequence.py"], _ansible_diff=True)
    assert "diff" not in result


@pytest.mark.parametrize("path", ["../site.py", "/etc/passwd", "models/../../x.py"])
def test_a_path_outside_the_package_fails(guard, state_dir, path):
    failed, result = guard(extra=[path])
    assert failed and path in result["msg"]
    assert not state_dir.exists()


def test_a_whole_facts_entry_instead_of_a_path_fails(guard):
    failed, result = guard(protected={"sampler.py": {"path": SAMPLER, "exists": True}})
    assert failed and "sampler.py" in result["msg"]


def test_a_missing_package_root_fails(guard, tmp_path):
    failed, result = guard(package_root=str(tmp_path / "nowhere"))
    assert failed and result["msg"] == "package_root %s is not a directory" % (tmp_path / "nowhere")
