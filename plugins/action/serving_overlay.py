# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller half of biv100.serving.serving_overlay: plan the release, send only what differs.

One host round trip learns what the host has (installed and pristine digests, the pristine
text of the files the payload patches); the controller validates the payload against the
host's facts, applies the patches, and computes every file's desired digest; a second round
trip installs the release, carrying only the files whose installed digest differs.
"""

from __future__ import annotations

import base64
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR
from ansible_collections.biv100.serving.plugins.plugin_utils._payload import (
    PayloadError,
    Target,
    payload_digest,
    plan_for_host,
    read_manifest,
    sha256_bytes,
)
from ansible_collections.biv100.serving.plugins.plugin_utils._unified_diff import PatchError, apply_patch

MODULE = "biv100.serving.serving_overlay"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("payload_dir", "release", "auto_release", "state_dir", "protected_extra", "record", "plan"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        facts = (task_vars.get("ansible_facts") or {}).get("vllm_facts")
        if not facts:
            raise AnsibleActionFail("serving_overlay needs the facts of biv100.serving.vllm_facts: run it first")
        state_dir = args.get("state_dir", DEFAULT_STATE_DIR)
        if args.get("plan"):
            result.update(self._install(args["plan"], facts, state_dir, task_vars))
            return result
        if not (args.get("release") or args.get("auto_release")):
            raise AnsibleActionFail("serving_overlay needs release (a submission id) or auto_release")
        # A relative payload_dir is found as other plugins find their files: beside the playbook.
        payload_dir = Path(self._loader.path_dwim(args["payload_dir"]))
        try:
            manifest = read_manifest(payload_dir)
            targets = plan_for_host(manifest.entries, facts, args.get("protected_extra") or [])
        except PayloadError as error:
            raise AnsibleActionFail(f"payload {payload_dir}: {error}") from error

        host = self._inventory(facts, state_dir, targets, task_vars)
        _refuse_unsafe(task_vars.get("inventory_hostname", "?"), targets, host)
        new_folders = _new_folders(targets, host["files"])
        if new_folders and self._task.check_mode:
            # Said in the plan, where a person reads what a deploy is about to do.
            result.setdefault("warnings", []).extend(
                f"manifest entry {name!r} creates {', '.join(folders)}, which this host's vLLM does not have"
                for name, folders in sorted(new_folders.items())
            )
        contents = {target.path: self._content(target, host["files"][target.path]) for target in targets}
        desired = {path: sha256_bytes(data) for path, data in contents.items()}
        # A file an earlier release overlaid that this payload no longer touches goes back to
        # the vendor's version (or away, if the vendor never had it).
        for path in host["overlaid"]:
            desired.setdefault(path, host["files"][path]["pristine"])
        digest = payload_digest(targets, contents)
        stale = {path for path, sha in desired.items() if host["files"][path]["current"] != sha}
        current = host["current_release"]
        # What this plan takes for granted on the host; staging checks it again there.
        plan = {"current": current["id"], "payload_digest": digest, "new_folders": new_folders,
                "based_on": {path: {key: host["files"][path][key] for key in ("current", "pristine")}
                             for path in desired}}

        current_digest = ((current.get("record") or {}).get("payload_digest"))
        if not stale and current_digest == digest and args.get("release") in (None, current["id"]):
            plan.update(release=current["id"], unchanged=True, mappings=current["record"].get("mappings", []))
            result.update(changed=False, release=current["id"], changed_files=[], payload_digest=digest,
                          mappings=plan["mappings"], new_folders=new_folders, plan=plan)
            return result

        plan.update(
            release=args.get("release") or args["auto_release"],
            files=[
                {"path": path, "sha256": sha,
                 **({"content": _b64(contents[path])} if path in stale and path in contents else {})}
                for path, sha in sorted(desired.items())
            ],
            record=dict(args.get("record") or {}, payload_digest=digest, vllm_version=facts["version"],
                        entries=sorted({target.entry.name for target in targets}), mappings=_mappings(targets),
                        failure_points=manifest.failure_points, planned=manifest.planned),
        )
        applied = self._present(plan, facts, state_dir, task_vars, compiled=[])
        if self._task.check_mode and not applied.get("failed"):
            # The module compiled what would change; staging need not compile it again.
            plan["compiled"] = [desired[path] for path in applied.get("changed_files", []) if desired.get(path)]
            applied["plan"] = plan
        result.update(applied)
        return result

    def _install(self, plan: dict, facts: dict, state_dir: str, task_vars: dict) -> dict:
        """Stage the plan an earlier check-mode run of this task made for this host, after the
        host proves that nothing the plan was based on moved since."""
        if plan.get("unchanged"):
            checked = self._execute_module(
                module_name=MODULE,
                module_args={"_state": "verify", "_package_root": facts["package_root"], "state_dir": state_dir,
                             "_expect": plan["based_on"], "_expect_current": plan["current"]},
                task_vars=task_vars,
            )
            if checked.get("failed"):
                return checked
            return dict(changed=False, release=plan["release"], changed_files=[], payload_digest=plan["payload_digest"],
                        mappings=plan["mappings"], new_folders=plan["new_folders"])
        return self._present(plan, facts, state_dir, task_vars, compiled=plan.get("compiled", []), checked=True)

    def _present(self, plan: dict, facts: dict, state_dir: str, task_vars: dict, compiled: list[str],
                 checked: bool = False) -> dict:
        module_args = {
            "_state": "present",
            "_package_root": facts["package_root"],
            "state_dir": state_dir,
            "release": plan["release"],
            "_files": plan["files"],
            "record": plan["record"],
            "_interpreter": facts["interpreter"],
            "_compiled": compiled,
        }
        if checked:
            module_args.update(_expect=plan["based_on"], _expect_current=plan["current"])
        applied = self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)
        applied.update(payload_digest=plan["payload_digest"], mappings=plan["record"]["mappings"],
                       new_folders=plan["new_folders"])
        return applied

    def _inventory(self, facts: dict, state_dir: str, targets: list[Target], task_vars: dict) -> dict:
        reply = self._execute_module(
            module_name=MODULE,
            module_args={
                "_state": "inventory",
                "_package_root": facts["package_root"],
                "state_dir": state_dir,
                "_paths": [target.path for target in targets],
                "_pristine_content": [target.path for target in targets if target.entry.kind == "patch"],
            },
            task_vars=task_vars,
        )
        if reply.get("failed"):
            raise AnsibleActionFail(reply.get("msg", "the host could not report its files"), result=reply)
        return reply

    @staticmethod
    def _content(target: Target, on_host: dict) -> bytes:
        entry = target.entry
        label = f"manifest entry {entry.name!r} ({target.path})"
        if entry.base_sha256 and on_host["pristine"] != entry.base_sha256:
            raise AnsibleActionFail(
                f"{label}: the overlay was made from a base file with sha256 {entry.base_sha256[:12]}…, "
                f"but this host's pristine file has {(on_host['pristine'] or 'none')[:12]}…; "
                "remake the overlay for this base"
            )
        if entry.kind != "patch":
            return target.source.read_bytes()
        if "pristine_content" not in on_host:
            raise AnsibleActionFail(f"{label}: the host has no base file to patch")
        original = base64.b64decode(on_host["pristine_content"]).decode("utf-8")
        try:
            return apply_patch(original, target.source.read_text(encoding="utf-8"), filename=target.path).encode("utf-8")
        except PatchError as error:
            raise AnsibleActionFail(f"{label}: {error}") from error


def _refuse_unsafe(host_name: str, targets: list[Target], host: dict) -> None:
    """Fail before anything changes when a destination leads through a link on the host."""
    unsafe = host.get("unsafe") or {}
    if not unsafe:
        return
    entries = {target.path: f"manifest entry {target.entry.name!r}" for target in targets}
    reasons = [
        f"{entries.get(path, 'a file an earlier release overlaid')} ({path}): {why}"
        for path, why in sorted(unsafe.items())
    ]
    raise AnsibleActionFail(
        f"{host_name}: refusing destinations that lead through the host's own links or are not "
        f"regular files, nothing changed: {'; '.join(reasons)}",
        result={"unsafe": unsafe},
    )


def _new_folders(targets: list[Target], files: dict) -> dict[str, list[str]]:
    """{entry name: folders its files would create that the vendor base lacks}."""
    folders: dict[str, set[str]] = {}
    for target in targets:
        missing = files.get(target.path, {}).get("new_folders")
        if missing:
            folders.setdefault(target.entry.name, set()).update(missing)
    return {name: sorted(paths) for name, paths in folders.items()}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _mappings(targets: list[Target]) -> list[dict]:
    """The mapping of each entry that has one, with the files it installs on this host: what the
    release changed against another is found by those files (module_utils/_release_changes.py)."""
    seen = {}
    for target in targets:
        if target.entry.mapping:
            mapping = seen.setdefault(target.entry.name, dict(target.entry.mapping, entry=target.entry.name, paths=[]))
            mapping["paths"].append(target.path)
    return [dict(seen[name], paths=sorted(seen[name]["paths"])) for name in sorted(seen)]
