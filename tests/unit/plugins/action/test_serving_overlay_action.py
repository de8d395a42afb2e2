"""The controller half of biv100.serving.serving_overlay, driven through ActionModule.run().

The host is a package tree in tmp_path; the action's calls to the host half run the module's
main() in-process on it, as the host would, and are recorded: a refusal made on the controller
must send nothing that writes (no `present` call), and one made on the host must leave its tree
as it was. (Named apart from tests/unit/plugins/modules/test_serving_overlay.py: the test folders
are not packages, so two test files may not share a name.)
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from ansible.module_utils import _internal as module_utils_internal
from ansible.module_utils.common import warnings
from ansible.module_utils.testing import patch_module_args
from ansible.parsing.dataloader import DataLoader

from host_tree import SYSTEM_PYTHON

from ansible_collections.biv100.serving.plugins.action import serving_overlay as overlay_action
from ansible_collections.biv100.serving.plugins.modules import serving_overlay as overlay_module

CHAT = "entrypoints/openai/serving_chat.py"
API_SERVER = "entrypoints/openai/api_server.py"
CLI_ARGS = "entrypoints/openai/cli_args.py"
PARSER = "reasoning/mine_parser.py"
SAMPLER = "model_executor/layers/sampler.py"
VENDOR = {
    CHAT: b"# the vendor's chat serving\n",
    API_SERVER: b"# the vendor's api server\n",
    CLI_ARGS: b"def make_arg_parser():\n    return None\n",
    SAMPLER: b"# the vendor's sampler\n",
    "model_executor/models/llama.py": b"# the vendor's model\n",
}
OURS_CHAT = b"# our chat serving\n"
OURS_PARSER = b"X = 1\n"
HOST = "gpu1"


def sha(data):
    return hashlib.sha256(data).hexdigest() if data is not None else None


def brief(path):
    return {"path": path, "exists": True}


@pytest.fixture
def host(tmp_path):
    """A host's vllm package as the vendor shipped it, and its (empty) state store."""
    package = tmp_path / "host" / "site-packages" / "vllm"
    for path, data in VENDOR.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_bytes(data)
    (package / "reasoning").mkdir()
    facts = {
        "version": "0.10.1.1",
        "layout": "v0",
        "package_root": str(package),
        # The host's own interpreter compiles what it receives: here, the controller's 3.11.
        "interpreter": sys.executable,
        "files": {
            "serving": {name: brief(path) for name, path in (
                ("serving_chat.py", CHAT), ("api_server.py", API_SERVER), ("cli_args.py", CLI_ARGS))},
            "protected": {"sampler.py": brief(SAMPLER)},
        },
        "model": {"missing": []},
    }
    return SimpleNamespace(package=package, state_dir=str(tmp_path / "host" / "state"), facts=facts, calls=[])


@pytest.fixture
def payload(tmp_path):
    """files/serving with two entries: an overlay of serving_chat.py and a new reasoning parser."""
    root = tmp_path / "payload"
    (root / "overlays").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "overlays" / "chat.py").write_bytes(OURS_CHAT)
    (root / "overlays" / "mine_parser.py").write_bytes(OURS_PARSER)
    (root / "manifest.yml").write_text(textwrap.dedent("""\
        entries:
          - name: chat
            kind: file
            src: overlays/chat.py
            dest: serving_chat.py
            mapping: {idea: ours, place: serving_chat.py, change: overlay}
          - name: mine-parser
            kind: file
            src: overlays/mine_parser.py
            dest: reasoning/mine_parser.py
        """))
    return root


def add_entry(payload: Path, entry: dict) -> None:
    manifest = payload / "manifest.yml"
    document = yaml.safe_load(manifest.read_text())
    document["entries"].append(entry)
    manifest.write_text(yaml.safe_dump(document, sort_keys=False))


def overlay(payload: Path, name: str, dest: str, text: str, **extra) -> None:
    (payload / "overlays" / name).write_text(text)
    add_entry(payload, {"name": name, "kind": "file", "src": f"overlays/{name}", "dest": dest, **extra})


@pytest.fixture
def run_action(host, monkeypatch, capsys):
    """run_action(args, check_mode=False) -> ActionModule.run()'s result on the host.

    Each call the action makes to the host half is recorded in host.calls and answered by the
    module's main() run in-process, as a fresh host-side process would run it.
    """

    def execute_module(module_name=None, module_args=None, task_vars=None, check_mode=False, **_):
        assert module_name == overlay_action.MODULE
        host.calls.append(copy.deepcopy(module_args))
        with monkeypatch.context() as on_host:
            on_host.setattr(module_utils_internal, "is_controller", False)
            on_host.setattr(warnings, "_global_warnings", {})
            with patch_module_args(dict(module_args, _ansible_check_mode=check_mode)), pytest.raises(SystemExit):
                overlay_module.main()
        return json.loads(capsys.readouterr().out)

    def run(args: dict, check_mode: bool = False) -> dict:
        task = SimpleNamespace(args=dict(args), check_mode=check_mode, async_val=0, action=overlay_action.MODULE)
        connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
        action = overlay_action.ActionModule(task, connection, None, DataLoader(), None)
        action._execute_module = lambda **kwargs: execute_module(check_mode=check_mode, **kwargs)
        task_vars = {"inventory_hostname": HOST, "ansible_facts": {"vllm_facts": host.facts}}
        return action.run(task_vars=task_vars)

    return run


def deploy_args(host, payload, **options):
    return dict({"payload_dir": str(payload), "state_dir": host.state_dir}, **options)


def states(host) -> list[str]:
    return [call["_state"] for call in host.calls]


def snapshot(host) -> dict:
    """Every file, folder and link under the host's package and state store, with its content."""
    found = {}
    for root, folders, files in os.walk(host.package.parent.parent):
        for name in folders + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                found[path] = "-> " + os.readlink(path)
            elif os.path.isdir(path):
                found[path] = "dir"
            else:
                found[path] = Path(path).read_bytes()
    return found


def installed(host, path):
    full = host.package / path
    return full.read_bytes() if full.exists() else None


@pytest.fixture
def deployed(host, payload, run_action):
    """The host after a first deploy of the payload as sub510; the calls list starts empty."""
    result = run_action(deploy_args(host, payload, release="sub510"))
    assert result["changed"] and not result.get("failed"), result
    assert installed(host, CHAT) == OURS_CHAT
    host.calls.clear()
    return host


# --- hostile payloads -----------------------------------------------------------------------
# Each makes the payload hostile and returns the text the refusal must contain.


def hostile_protected(payload):
    overlay(payload, "sampler", SAMPLER, "X = 1\n")
    return f"manifest entry 'sampler': {SAMPLER} is a protected model-layer file"


def hostile_outside(payload):
    overlay(payload, "worker", "worker/worker.py", "X = 1\n")
    return "manifest entry 'worker': worker/worker.py is outside the serving layer"


def hostile_traversal(payload):
    overlay(payload, "escape", "../../../../etc/evil.py", "X = 1\n")
    return "manifest entry 'escape': dest ../../../../etc/evil.py escapes the vllm package"


def hostile_symlink(payload):
    secret = payload.parent / "controller-secret"
    secret.write_text("not for any host\n")
    (payload / "overlays" / "link.py").symlink_to(secret)
    add_entry(payload, {"name": "link", "kind": "file", "src": "overlays/link.py",
                        "dest": "entrypoints/openai/link.py"})
    return "manifest entry 'link': overlays/link.py is a symlink"


def hostile_pinned(payload):
    overlay(payload, "old-base", "api_server.py", "X = 1\n", base_sha256="0" * 64)
    return (f"manifest entry 'old-base' ({API_SERVER}): the overlay was made from a base file with "
            f"sha256 000000000000…, but this host's pristine file has {sha(VENDOR[API_SERVER])[:12]}…")


def hostile_patch(payload):
    (payload / "patches" / "cli_args.patch").write_text(
        "--- a/cli_args.py\n+++ b/cli_args.py\n@@ -1,2 +1,3 @@\n not the first line\n not the second\n+added\n")
    add_entry(payload, {"name": "cli", "kind": "patch", "src": "patches/cli_args.patch", "dest": "cli_args.py"})
    return f"manifest entry 'cli' ({CLI_ARGS}): {CLI_ARGS}: hunk 1 (@@ -1,2 +1,3 @@) does not apply"


@pytest.mark.parametrize("make_hostile", [
    hostile_protected, hostile_outside, hostile_traversal, hostile_symlink, hostile_pinned, hostile_patch,
], ids=lambda make: make.__name__.removeprefix("hostile_"))
def test_a_hostile_payload_is_refused_on_the_controller_naming_the_entry_and_nothing_is_sent(
        deployed, payload, run_action, make_hostile):
    expected = make_hostile(payload)
    before = snapshot(deployed)
    with pytest.raises(AnsibleActionFail) as refusal:
        run_action(deploy_args(deployed, payload, release="sub666"))
    assert expected in str(refusal.value), str(refusal.value)
    # At most the inventory was asked for (the pin and the patch need the host's pristine file).
    assert "present" not in states(deployed) and "verify" not in states(deployed)
    assert snapshot(deployed) == before


def hostile_syntax(payload):
    overlay(payload, "broken", "entrypoints/openai/broken.py", "def broken(:\n    pass\n")
    return "entrypoints/openai/broken.py line 1"


# The host here is a lab host's Python (Debian's python3), whichever Python runs the controller.
HOST_PYTHON = SYSTEM_PYTHON
HOST_VERSION = tuple(int(part) for part in subprocess.run(
    [HOST_PYTHON, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
    check=True).stdout.split())
# A statement the next Python after each is the first to compile.
NEWER_THAN = {
    (3, 11): "type Choices = list[str]\n",  # PEP 695
    (3, 12): "type Pair[T = int] = tuple[T, T]\n",  # PEP 696
    (3, 13): "try:\n    pass\nexcept ValueError, TypeError:\n    pass\n",  # PEP 758
}


def hostile_too_new(payload):
    overlay(payload, "newer", "entrypoints/openai/newer.py", NEWER_THAN[HOST_VERSION])
    return "entrypoints/openai/newer.py line 1"


@pytest.mark.parametrize("make_hostile", [hostile_syntax, hostile_too_new],
                         ids=lambda make: make.__name__.removeprefix("hostile_"))
def test_a_payload_file_the_hosts_interpreter_cannot_compile_is_refused_and_nothing_changes(
        deployed, payload, run_action, make_hostile):
    deployed.facts["interpreter"] = HOST_PYTHON
    expected = make_hostile(payload)
    before = snapshot(deployed)
    result = run_action(deploy_args(deployed, payload, release="sub666"))
    assert result["failed"], result
    assert f"payload files do not compile with {HOST_PYTHON}: {expected}" in result["msg"], result["msg"]
    # Only the host's own interpreter judges the file: the present call carried no compiled digest.
    assert states(deployed) == ["inventory", "present"]
    assert deployed.calls[-1]["_compiled"] == []
    assert snapshot(deployed) == before


# --- the host's own tree -------------------------------------------------------------------


def test_a_destination_through_the_hosts_own_link_is_refused_naming_host_entry_path_and_link(
        host, payload, run_action):
    """A vendor image may link a serving folder into the model layer: a destination is judged by
    where it leads on the host, not by its name."""
    os.symlink("../../model_executor/models", host.package / "entrypoints" / "openai" / "linked")
    overlay(payload, "through-link", "entrypoints/openai/linked/team_model.py", "X = 1\n")
    before = snapshot(host)
    with pytest.raises(AnsibleActionFail) as refusal:
        run_action(deploy_args(host, payload, release="sub667"))
    message = str(refusal.value)
    assert message.startswith(f"{HOST}: refusing destinations that lead through the host's own links"), message
    for part in ("manifest entry 'through-link'", "entrypoints/openai/linked/team_model.py",
                 "entrypoints/openai/linked is a symlink to ../../model_executor/models", "nothing changed"):
        assert part in message, message
    assert states(host) == ["inventory"]
    assert snapshot(host) == before


# --- plans ----------------------------------------------------------------------------------


@pytest.fixture
def planned(deployed, payload, run_action):
    """A check-mode run of a payload whose chat overlay changed since sub510: its plan."""
    (payload / "overlays" / "chat.py").write_bytes(b"# our chat serving, revised\n")
    before = snapshot(deployed)
    result = run_action(deploy_args(deployed, payload, release="sub511"), check_mode=True)
    assert result["changed"] and not result.get("failed"), result
    assert snapshot(deployed) == before
    deployed.calls.clear()
    return result


def test_check_mode_returns_the_plan_with_content_only_for_the_files_that_differ(planned, deployed):
    revised = b"# our chat serving, revised\n"
    plan = planned["plan"]
    assert plan["release"] == "sub511" and plan["current"] == "sub510"
    assert planned["changed_files"] == [CHAT]
    assert plan["files"] == [
        {"path": CHAT, "sha256": sha(revised), "content": base64.b64encode(revised).decode("ascii")},
        {"path": PARSER, "sha256": sha(OURS_PARSER)},
    ]
    assert plan["based_on"] == {
        CHAT: {"current": sha(OURS_CHAT), "pristine": sha(VENDOR[CHAT])},
        PARSER: {"current": sha(OURS_PARSER), "pristine": None},
    }
    # The module compiled the file that would change; staging need not compile it again.
    assert plan["compiled"] == [sha(revised)]
    assert plan["record"]["entries"] == ["chat", "mine-parser"]
    assert plan["payload_digest"] == planned["payload_digest"]


def test_a_given_plan_is_installed_in_one_present_call_without_reading_the_manifest(
        planned, deployed, run_action, monkeypatch):
    def no_manifest(payload_dir):
        raise AssertionError(f"the manifest in {payload_dir} was read while installing a plan")

    monkeypatch.setattr(overlay_action, "read_manifest", no_manifest)
    plan = planned["plan"]
    result = run_action({"plan": plan, "state_dir": deployed.state_dir})
    assert result["changed"] and result["release"] == "sub511" and not result.get("failed"), result
    (call,) = deployed.calls
    assert call["_state"] == "present" and call["release"] == "sub511"
    assert call["_expect"] == plan["based_on"] and call["_expect_current"] == "sub510"
    assert call["_compiled"] == plan["compiled"] and call["_files"] == plan["files"]
    assert installed(deployed, CHAT) == b"# our chat serving, revised\n"
    assert os.readlink(os.path.join(deployed.state_dir, "current")) == "releases/sub511"


def test_a_given_plan_is_not_installed_once_the_host_moved(planned, deployed, run_action):
    (deployed.package / CHAT).write_bytes(b"# edited by hand after the plan\n")
    result = run_action({"plan": planned["plan"], "state_dir": deployed.state_dir})
    assert result["failed"] and "the host changed since this run planned its release" in result["msg"], result
    assert os.readlink(os.path.join(deployed.state_dir, "current")) == "releases/sub510"


def test_an_unchanged_plan_is_installed_by_verifying_the_host(deployed, payload, run_action):
    planned = run_action(deploy_args(deployed, payload, auto_release="20250101T000000Z"), check_mode=True)
    plan = planned["plan"]
    assert planned["changed"] is False and plan["unchanged"] is True and plan["release"] == "sub510"
    assert "files" not in plan and states(deployed) == ["inventory"]
    deployed.calls.clear()
    before = snapshot(deployed)

    result = run_action({"plan": plan, "state_dir": deployed.state_dir})
    assert result["changed"] is False and result["release"] == "sub510" and result["changed_files"] == []
    (call,) = deployed.calls
    assert call["_state"] == "verify"
    assert call["_expect"] == plan["based_on"] and call["_expect_current"] == "sub510"
    assert snapshot(deployed) == before
