#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_rollback
short_description: Put a host's serving files back to an earlier release, or to the vendor's
version_added: 0.1.0
description:
  - Restores every file the collection has ever overlaid on the host to what the target release
    installed - the release's own content where it touches the file, the vendor's pristine
    copy where it does not - checks each by sha256, and switches C(current) to the target
    (removes it for V(base)).
  - The target is read from the release records, never guessed from file times. V(previous) is
    the newest C(good) release along the chain of releases that were current before the current
    one (each record names its predecessor); V(last_good) is the current release when it is
    C(good), else V(previous). Either falls back to V(base) on a host that never had a good
    release.
  - The release replaced is marked C(rolled_back) with the reason, unless it is already
    C(failed). Rolling back to the release already current, with every file in place, changes
    nothing.
  - Every path is checked on the host one component at a time before anything changes, and
    written or removed without following a link; a symlink between the package root and a
    file, or a file that is not a regular one, refuses the whole rollback naming both.
  - Returns the engine settings recorded with the target release, which the caller restarts the
    engine with.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  to:
    description: V(previous), V(last_good), V(base), or a release id such as C(sub168).
    type: str
    default: previous
  reason:
    description: Why, recorded in the history of the release replaced.
    type: str
    default: ""
  base_lacks:
    description:
      - The architectures of the served model that the vendor's own registry lacks
        (RV(biv100.serving.vllm_facts#module:vllm_facts.model.missing_in_base)). When the
        target is V(base) and this is not empty, the host's vLLM could not serve the model
        after the rollback, and the task fails before changing anything, unless O(force=true).
    type: list
    elements: str
    default: []
  force:
    description: Roll back to V(base) even when O(base_lacks) says the engine could not serve the model there.
    type: bool
    default: false
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - biv100.serving.run_lock
  - biv100.serving.vllm_package
attributes:
  check_mode:
    support: full
    details:
      - Reports the target, the files that would change and the engine settings it would bring back.
  diff_mode:
    support: full
    details:
      - The current release and the sha256 of every file that would change.
seealso:
  - module: biv100.serving.serving_overlay
  - module: biv100.serving.serving_release
"""

EXAMPLES = r"""
- name: Go back to the previous good release
  biv100.serving.serving_rollback:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    reason: submission 512 failed its evaluation
  register: rolled_back

- name: Put the vendor's files back
  biv100.serving.serving_rollback:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    to: base
"""

RETURN = r"""
from_release:
  description: The release current before the task; null for the vendor's files.
  returned: always
  type: str
  sample: sub512
release:
  description: The release current after the task; null for the vendor's files (V(base)).
  returned: always
  type: str
  sample: sub510
changed_files:
  description: The package paths whose content changed (or would change).
  returned: always
  type: list
  elements: str
  sample: [entrypoints/openai/serving_chat.py]
engine:
  description: The engine settings recorded with the target release when it was proven; empty when none were.
  returned: always
  type: dict
  sample: {args: {max_num_seqs: 2}, allocator: {max_split_size_mb: 512}, env: {}}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath
from ansible_collections.biv100.serving.plugins.module_utils._run_lock import NotHeld, fenced
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    StateDir,
    first_good,
    fsync_dir,
    mark_status,
    read_json,
    switch_symlink,
    write_json,
)

BASE = "base"
KEYWORDS = ("previous", "last_good", BASE)


class RollbackError(Exception):
    pass


def record_of(store, release):
    record = read_json(store.release_record(release))
    if record is None:
        raise RollbackError("release %s has no record in %s" % (release, store.root))
    return record


def previous_good(store, record):
    """The newest good release before `record`, following each record's predecessor."""
    return first_good(record.get("previous"), lambda release: read_json(store.release_record(release)))


def resolve_target(store, current, wanted):
    """The target release id, None for the vendor's files."""
    if wanted == BASE:
        return None
    if wanted not in KEYWORDS:
        if "/" in wanted or wanted.startswith("."):
            raise RollbackError("to must be previous, last_good, base or a release id, got %r" % wanted)
        status = record_of(store, wanted).get("status")
        if status in ("failed", "pending"):
            raise RollbackError(
                "release %s is %s: only a release that was proven good can be rolled back to"
                % (wanted, status)
            )
        return wanted
    if current is None:
        return None
    record = record_of(store, current)
    if wanted == "last_good" and record.get("status") == "good":
        return current
    return previous_good(store, record)


def refuse_unservable(params, current, target):
    """Fail before anything changes when the target is the vendor's files and those cannot
    serve the model: the engine would not start, and the host would be left with none."""
    if target is not None or current is None or not params["base_lacks"] or params["force"]:
        return  # current None: the host runs the vendor's files already; putting them back only repairs
    why = "asked for" if params["to"] == BASE else "no release before %s was good" % (current or "it")
    raise RollbackError(
        "refusing to roll back to base, the vendor's files (%s): this host's vLLM cannot serve %s "
        "there (its registry lacks it), so the engine would not start; nothing changed. "
        "-e serving_rollback_force=true rolls back all the same"
        % (why, ", ".join(params["base_lacks"]))
    )


def desired_content(store, target, target_digests, index, path):
    """(sha256 or None for absent, the file holding that content, relative to the store)."""
    if target is not None and path in target_digests:
        digest = target_digests[path]
        source = store.release_file(target, path) if digest is not None else None
    elif index.get(path) is None:
        return None, None  # the vendor has no such file
    else:
        digest, source = index[path], store.base_copy(path)
    return digest, os.path.relpath(source, store.root) if source else None


def plan(store, package, target):
    """{path: (desired sha256 or None, source in the store or None)} of every path that differs.

    Raises UnsafePath for a path that leads through a link, before anything is written.
    """
    index = read_json(store.base_index, default={})
    target_digests = record_of(store, target).get("digests", {}) if target else {}
    kept = Tree(store.root)
    changes = {}
    for path in sorted(set(index) | set(target_digests)):
        digest, source = desired_content(store, target, target_digests, index, path)
        if package.digest(path) != digest:
            if digest is not None and kept.digest(source) != digest:
                raise RollbackError(
                    "the store's copy of %s for %s is missing or damaged (%s)"
                    % (path, target or "the vendor's files", os.path.join(store.root, source))
                )
            changes[path] = (digest, source)
    return changes


def restore(store, package, changes):
    """Write each file through a temporary file and a rename; check every result by sha256."""
    kept = Tree(store.root)
    for path, (digest, source) in sorted(changes.items()):
        if digest is None:
            package.remove(path)
        else:
            package.write(path, kept.read(source))
    wrong = [path for path, (digest, _source) in changes.items() if package.digest(path) != digest]
    if wrong:
        raise RollbackError("after restoring, these files still differ: %s" % ", ".join(sorted(wrong)))


def mark_replaced(store, release, target, reason):
    record = record_of(store, release)
    if record.get("status") == "failed":
        return
    mark_status(record, "rolled_back", reason, to=target or BASE)
    write_json(store.release_record(release), record)


def switch_current(store, target):
    if target is None:
        if os.path.lexists(store.current):
            os.unlink(store.current)
            fsync_dir(store.root)
        return
    switch_symlink(store.current, os.path.join("releases", target))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            package_root=dict(type="path", required=True),
            to=dict(type="str", default="previous"),
            reason=dict(type="str", default=""),
            base_lacks=dict(type="list", elements="str", default=[]),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    store = StateDir(params["state_dir"])
    package = Tree(params["package_root"])
    current = store.current_release()
    try:
        target = resolve_target(store, current, params["to"])
        refuse_unservable(params, current, target)
        changes = plan(store, package, target)
        # For the diff only; read here, where a link that appeared since the plan is refused.
        installed = dict((path, package.digest(path)) for path in changes) if module._diff else {}
        engine = (record_of(store, target).get("engine") or {}) if target else {}
    except UnsafePath as error:
        module.fail_json(msg="refusing to roll back through the host's own tree under %s, nothing "
                         "changed: %s" % (params["package_root"], error), from_release=current)
    except RollbackError as error:
        module.fail_json(msg=str(error), from_release=current)
    changed = bool(changes) or target != current
    result = dict(
        changed=changed,
        from_release=current,
        release=target,
        changed_files=sorted(changes),
        engine=engine,
    )
    summary = "%s -> %s: %d file(s) %s" % (
        current or BASE, target or BASE, len(changes), "would change" if module.check_mode else "changed")
    if module._diff:
        result["diff"] = {
            "before": "current: %s\n" % (current or BASE) + "".join(
                "%s %s\n" % (path, installed[path]) for path in sorted(changes)),
            "after": "current: %s\n" % (target or BASE) + "".join(
                "%s %s\n" % (path, digest) for path, (digest, _source) in sorted(changes.items())),
        }
    if changed and not module.check_mode:
        try:
            # Only while the run holds the host's lock, checked under its flock (no take-over between).
            with fenced(store.root, writing="rolling back to %s" % (target or BASE)):
                restore(store, package, changes)
                if current is not None and current != target:
                    mark_replaced(store, current, target, params["reason"])
                switch_current(store, target)
        except NotHeld as error:
            result.update(changed=False, changed_files=[])
            module.fail_json(msg=str(error), **result)
        except (RollbackError, UnsafePath, OSError) as error:
            module.fail_json(msg="rolling back to %s: %s" % (target or BASE, describe(error)), **result)
    module.exit_json(msg=summary, **result)


def describe(error):
    if isinstance(error, OSError) and error.strerror:
        return "%s: %s" % (error.filename or "?", error.strerror)
    return str(error)


if __name__ == "__main__":
    main()
