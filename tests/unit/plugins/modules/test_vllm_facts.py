"""biv100.serving.vllm_facts through AnsibleModule, on copies of a real vLLM release."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys

import pytest

from engine_defaults import SUB168

from ansible_collections.biv100.serving.plugins.plugin_utils._engine_cli_args import (
    VLLM_0_10_1_1_ARGUMENTS,
)
from ansible_collections.biv100.serving.plugins.modules import vllm_facts

BASE_VERSION = "0.10.1.1"


@pytest.fixture
def facts_of(run_module, tmp_path):
    """facts_of(**args) -> ModuleRun of vllm_facts, with an empty state store of the test's own."""

    def run(**args):
        args.setdefault("state_dir", str(tmp_path / "state"))
        return run_module(vllm_facts, args)

    return run


@pytest.fixture(scope="module")
def vendor_like_root(vllm_trees, tmp_path_factory):
    """A copy of the 0.10.1.1 package with the vendor's qwen3_5.py added but not registered."""
    root = tmp_path_factory.mktemp("site-packages") / "vllm"
    shutil.copytree(vllm_trees[BASE_VERSION], root)
    models = "model_executor/models/qwen3_5.py"
    shutil.copy2(vllm_trees["0.33.0"] / models, root / models)
    return root


def make_venv(parent, name):
    """A venv of the Python running the tests, without pip; returns (python, site-packages)."""
    venv = parent / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python", next(venv.glob("lib/python*/site-packages"))


@pytest.fixture(scope="module")
def venv_with_vllm(vllm_trees, tmp_path_factory):
    """A venv where vllm is installed: the release tree linked in, and its installer metadata."""
    python, site_packages = make_venv(tmp_path_factory.mktemp("venvs"), "with-vllm")
    (site_packages / "vllm").symlink_to(vllm_trees[BASE_VERSION], target_is_directory=True)
    dist_info = site_packages / "vllm-0.10.1.1+corex.4.3.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.10.1.1+corex.4.3.0\n"
    )
    return python, site_packages


def test_an_explicit_package_root(facts_of, vendor_like_root, vllm_trees):
    outcome = facts_of(package_root=str(vendor_like_root))
    assert not outcome.failed
    facts = outcome.result["vllm_facts"]
    assert outcome.result["changed"] is False
    assert outcome.result["ansible_facts"] == {"vllm_facts": facts}
    assert facts["interpreter"] == sys.executable
    assert facts["python_version"] == platform.python_version()
    assert facts["package_root"] == str(vendor_like_root)
    assert facts["version"] == BASE_VERSION
    assert facts["layout"] == "v0"
    scheduler = facts["files"]["protected"]["scheduler.py"]
    original = (vllm_trees[BASE_VERSION] / "core/scheduler.py").read_bytes()
    assert scheduler == {
        "path": "core/scheduler.py",
        "exists": True,
        "sha256": hashlib.sha256(original).hexdigest(),
        "equivalent": None,
    }
    assert facts["files"]["protected"]["qwen3_5.py"]["exists"] is True
    assert facts["registry"]["error"] is None and facts["registry"]["has_qwen3_5"] is False
    assert "model" not in facts


def test_check_mode_reports_the_same_and_no_change(facts_of, vendor_like_root):
    normal = facts_of(package_root=str(vendor_like_root)).result
    checked = facts_of(package_root=str(vendor_like_root), _ansible_check_mode=True).result
    assert checked["changed"] is False
    assert checked["vllm_facts"] == normal["vllm_facts"]


def test_a_package_root_that_is_no_directory_fails(facts_of, tmp_path):
    outcome = facts_of(package_root=str(tmp_path / "nowhere"))
    assert outcome.failed
    assert outcome.result["msg"] == "package_root %s is not a directory" % (tmp_path / "nowhere")


def test_the_package_is_found_through_the_interpreter(facts_of, venv_with_vllm):
    python, site_packages = venv_with_vllm
    outcome = facts_of(interpreter=str(python))
    assert not outcome.failed, outcome.result
    facts = outcome.result["vllm_facts"]
    assert facts["interpreter"] == str(python)
    assert facts["python_version"] == platform.python_version()
    assert facts["package_root"] == str(site_packages / "vllm")
    assert facts["version"] == "0.10.1.1+corex.4.3.0"
    assert facts["layout"] == "v0"
    assert facts["files"]["serving"]["qwen3coder_tool_parser.py"]["exists"] is True


def test_an_interpreter_without_vllm_fails_naming_it_and_its_search_path(facts_of, tmp_path):
    python, site_packages = make_venv(tmp_path, "bare")
    outcome = facts_of(interpreter=str(python))
    assert outcome.failed
    assert outcome.result["msg"].startswith("no vllm package for %s (Python " % python)
    assert str(site_packages) in outcome.result["sys_path"]
    assert str(site_packages) in outcome.result["msg"]


def test_a_missing_interpreter_fails_naming_it(facts_of, tmp_path):
    outcome = facts_of(interpreter=str(tmp_path / "python3"))
    assert outcome.failed
    assert outcome.result["msg"] == "cannot run %s: No such file or directory" % (
        tmp_path / "python3"
    )


def test_an_interpreter_that_cannot_run_the_probe_fails_naming_it(facts_of):
    outcome = facts_of(interpreter="/bin/false")
    assert outcome.failed
    assert outcome.result["msg"] == "/bin/false did not answer the vllm probe (rc=1): "


REGISTRY = "model_executor/models/registry.py"


def model(tmp_path, config):
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    "config, served, missing, registrable",
    [
        ({"architectures": ["Qwen3ForCausalLM"]}, True, [], {}),
        (
            {"architectures": ["Qwen3_5ForConditionalGeneration"]},
            False,
            ["Qwen3_5ForConditionalGeneration"],
            {"Qwen3_5ForConditionalGeneration": True},
        ),
        (
            {"architectures": ["Qwen9ForCausalLM"]},
            False,
            ["Qwen9ForCausalLM"],
            {"Qwen9ForCausalLM": False},
        ),
    ],
    ids=["served", "registrable", "unregistrable"],
)
def test_model_path(facts_of, vendor_like_root, tmp_path, config, served, missing, registrable):
    outcome = facts_of(package_root=str(vendor_like_root), model_path=model(tmp_path, config))
    facts = outcome.result["vllm_facts"]["model"]
    assert facts["error"] is None
    assert (facts["served"], facts["missing"], facts["registrable"]) == (
        served,
        missing,
        registrable,
    )


def test_the_vendors_registry_decides_what_the_base_lacks(facts_of, vendor_like_root, tmp_path):
    """Once a release patched registry.py, the kept vendor copy still says the patch is needed."""
    installed = vendor_like_root / REGISTRY
    pristine = tmp_path / "state" / "base" / REGISTRY
    pristine.parent.mkdir(parents=True)
    shutil.copy2(installed, pristine)
    original = installed.read_text()
    arch = "Qwen3_5ForConditionalGeneration"
    entry = '    "%s": ("qwen3_5", "%s"),\n' % (arch, arch)
    installed.write_text(original.replace("_MULTIMODAL_MODELS = {\n", "_MULTIMODAL_MODELS = {\n" + entry, 1))
    try:
        config = {"architectures": [arch]}
        facts = facts_of(package_root=str(vendor_like_root), model_path=model(tmp_path, config))
    finally:
        installed.write_text(original)
    model_facts = facts.result["vllm_facts"]["model"]
    assert (model_facts["served"], model_facts["missing"], model_facts["missing_in_base"]) == (True, [], [arch])


def test_before_any_release_the_base_lacks_what_the_registry_lacks(facts_of, vendor_like_root, tmp_path):
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"]}
    facts = facts_of(package_root=str(vendor_like_root), model_path=model(tmp_path, config))
    model_facts = facts.result["vllm_facts"]["model"]
    assert model_facts["missing_in_base"] == model_facts["missing"] == ["Qwen3_5ForConditionalGeneration"]


def test_a_model_without_config_is_reported_not_failed(facts_of, vendor_like_root, tmp_path):
    model_path = model(tmp_path, None)
    outcome = facts_of(package_root=str(vendor_like_root), model_path=model_path)
    assert not outcome.failed
    error = outcome.result["vllm_facts"]["model"]["error"]
    assert error.startswith("cannot read %s/config.json: " % model_path)


# ---- the host's own CLI ---------------------------------------------------------------------


def test_the_cli_is_read_from_the_parser_source_as_the_release_builds_it(facts_of, vllm_trees):
    """On 0.10.1.1 exactly the names its parser has (the filter's list, itself checked against
    the stand-in's parser generated from the same source); on the other layouts the Sub168 ones."""
    read = facts_of(package_root=str(vllm_trees[BASE_VERSION])).result["vllm_facts"]["cli"]
    assert read["error"] is None and set(read["arguments"]) == set(VLLM_0_10_1_1_ARGUMENTS)
    for version, tree in vllm_trees.items():
        arguments = set(facts_of(package_root=str(tree)).result["vllm_facts"]["cli"]["arguments"])
        assert set(SUB168) | {"model", "served_model_name"} <= arguments, version


def test_a_base_without_the_parser_files_says_so(facts_of, tmp_path):
    package = tmp_path / "vllm"
    (package / "model_executor" / "models").mkdir(parents=True)
    cli = facts_of(package_root=str(package)).result["vllm_facts"]["cli"]
    assert cli["arguments"] is None and "neither engine/arg_utils.py" in cli["error"]
