#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_release
short_description: Read a release of the on-host store, check its files, and record its verdict
version_added: 0.1.0
description:
  - Reads a release record of the store M(biv100.serving.serving_overlay) writes (by default
    the one C(current) points at) and compares every file the release installed with what is
    installed now, by sha256. A file the release removed must be absent.
  - With O(status), records the release's verdict - V(good) once its probes passed, V(failed)
    with O(reason) - in its record, with the time and reason appended to its history, and
    O(engine), the engine settings the verdict was reached with, which a rollback to the
    release brings back, and O(gates), the figures the gates measured. The record is rewritten
    atomically; recording what it already holds changes nothing.
  - Reports what the gates compare a release with - the last good release before it, with its
    figures, and the quality baseline - so that one read-only call before the gates gives
    them both.
  - The first release marked V(good) with a quality score, when O(quality_baseline=first_good)
    and the store has no quality baseline yet, becomes it (C(baseline/quality.json) in the
    store), so that the baseline stays when old releases are pruned.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  release:
    description: The release; C(current) when not given.
    type: str
  status:
    description: The verdict to record; nothing is recorded when not given.
    type: str
    choices: [good, failed]
  reason:
    description: Why, recorded with the status (the failed probe, say).
    type: str
    default: ""
  engine:
    description: The engine settings to record with O(status) (arguments, allocator, variables).
    type: dict
  gates:
    description:
      - The gates' figures to record with O(status) - C(bench) (the throughput figures of
        M(biv100.serving.engine_bench)) and C(quality) (the score of
        M(biv100.serving.engine_quality)) and the verdicts.
    type: dict
  quality_baseline:
    description:
      - The release whose quality score the gate holds others to - V(first_good), the first
        release marked good with a quality score, or a release id, whose record must hold one.
    type: str
    default: first_good
  keep_good:
    description:
      - With O(status=good), then remove old releases as M(biv100.serving.serving_retention)
        does, keeping this many proven ones; nothing is removed when not given.
    type: int
  keep_failed_days:
    description: With O(keep_good), failed releases younger than this many days are kept.
    type: int
    default: 14
  export:
    description:
      - Also return what a submission bundle is built from (M(biv100.serving.serving_submission))
        - the release's whole record, the bytes of every file it installed, and the vendor's
        sha256 of every serving-layer file - and, for a release this host lacks, a null
        RV(status) instead of failing. Reads only; O(status) cannot be given with it.
    type: bool
    default: false
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - biv100.serving.state_store
  - biv100.serving.vllm_package
attributes:
  check_mode:
    support: full
    details:
      - Reports the status it would record.
  diff_mode:
    support: full
    details:
      - The release's status before and after.
seealso:
  - module: biv100.serving.serving_overlay
"""

EXAMPLES = r"""
- name: Mark the current release good
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    status: good

- name: Read what a submission bundle is built from
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    release: sub510
    export: true
  register: exported

- name: Check that the installed serving files are the current release's
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
  register: release
  failed_when: release.drift | length > 0
"""

RETURN = r"""
release:
  description: The release id; null when the host has no release yet.
  returned: always
  type: str
  sample: sub510
status:
  description: Its status after the task (pending, good, failed or rolled_back).
  returned: always
  type: str
  sample: good
previous_status:
  description: Its status before the task.
  returned: always
  type: str
  sample: pending
drift:
  description: One sentence per installed file that is not the release's.
  returned: always
  type: list
  elements: str
  sample: ["entrypoints/openai/serving_chat.py: installed 3f2a..., release 9b1c..."]
removed:
  description: The old releases removed (with O(keep_good)).
  returned: always
  type: list
  elements: str
  sample: [sub101]
files:
  description: The number of files the release installed or removed.
  returned: always
  type: int
  sample: 3
gates:
  description: The gates' figures the release's record holds after the task, or null.
  returned: always
  type: dict
last_good:
  description:
    - The last good release before this one (along the records' predecessors) and the gates'
      figures it was proven with, or null.
  returned: always
  type: dict
  sample: {release: sub509, gates: {bench: {score: 8437.1}, quality: {score: 0.969}}}
quality_baseline:
  description: The release and score the quality gate compares with, or null before there is one.
  returned: always
  type: dict
  sample: {release: sub168, score: 0.969}
record:
  description: The release's record as the store holds it; null when the host lacks the release.
  returned: with O(export)
  type: dict
  sample: {id: sub510, status: good, digests: {entrypoints/openai/serving_chat.py: 9b1c...}}
contents:
  description: The base64 bytes of every file the release installed, by package path.
  returned: with O(export)
  type: dict
  sample: {entrypoints/openai/serving_chat.py: "IyBTUERYLUxpY2Vuc2UtSWRlbnRpZmllcjog..."}
vendor:
  description:
    - The sha256 of the vendor's own file (its kept pristine copy where the collection overlaid
      it) at every path of the serving layer and of the release, null where the vendor has none.
    - A path that leads through a link or is not a regular file is left out and named in RV(unsafe).
  returned: with O(export)
  type: dict
  sample: {model_executor/models/registry.py: 4e07..., entrypoints/openai/protocol.py: 77d1...}
unsafe:
  description: Why each serving-layer path left out of RV(vendor) was.
  returned: with O(export)
  type: dict
  sample: {entrypoints/openai/extra.py: "entrypoints/openai/extra.py is a symlink"}
"""

import base64
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath
from ansible_collections.biv100.serving.plugins.module_utils._release_retention import prune
from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import REGISTRY, SERVING_TREES
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    StateDir,
    first_good,
    mark_status,
    read_json,
    write_json,
)


def short(digest):
    return "absent" if digest is None else digest[:12] + "..."


def file_drift(package_root, digests):
    """A sentence for each file that is not what the release installed; a file reached through a
    link is not the release's file, whatever it holds."""
    sentences = []
    package = Tree(package_root)
    for path in sorted(digests):
        try:
            installed = package.digest(path)
        except UnsafePath as error:
            sentences.append(str(error))
            continue
        if installed != digests[path]:
            sentences.append(
                "%s: installed %s, release %s" % (path, short(installed), short(digests[path]))
            )
    return sentences


def quality_score(record):
    """The quality score a release record's gates hold (of its first instance by name that has
    one: every instance serves the same release), or None."""
    gates = (record or {}).get("gates") or {}
    entries = ([gates["instances"][name] or {} for name in sorted(gates["instances"] or {})]
               if "instances" in gates else [gates])
    for entry in entries:
        score = (entry.get("quality") or {}).get("score")
        if isinstance(score, (int, float)) and not isinstance(score, bool):
            return score
    return None


def quality_baseline(module, store, wanted):
    """{release, score} the quality gate compares with: the store's first good one, or a named
    release's own score."""
    if wanted == "first_good":
        return read_json(store.quality_baseline)
    score = quality_score(read_json(store.release_record(wanted)))
    if score is None:
        module.fail_json(msg="quality_baseline %s: %s holds no release with a quality score of that name"
                         % (wanted, store.root))
    return {"release": wanted, "score": score}


def last_good(store, record):
    """The last good release before this record's, with the figures it was proven with."""
    release = first_good(record.get("previous"), lambda name: read_json(store.release_record(name)))
    if release is None:
        return None
    return {"release": release, "gates": read_json(store.release_record(release)).get("gates")}


def serving_paths(package_root):
    """Every file under the serving trees, found without following a link (a linked folder is
    not descended into: the vendor's tree has none, and its files would not be the package's)."""
    paths = [REGISTRY]
    for tree in SERVING_TREES:
        top = os.path.join(package_root, tree.rstrip("/"))
        for folder, folders, names in os.walk(top):
            folders[:] = sorted(name for name in folders if name != "__pycache__")
            relative = os.path.relpath(folder, package_root).replace(os.sep, "/")
            paths.extend(relative + "/" + name for name in names if not name.endswith(".pyc"))
    return paths


def export(store, package_root, release, record):
    """What a submission bundle is built from: the record, the installed bytes, the vendor's digests."""
    staged = Tree(store.release_dir(release))
    contents, vendor, unsafe = {}, {}, {}
    for path, digest in sorted((record.get("digests") or {}).items()):
        if digest is not None:
            data = staged.read("files/" + path)
            if data is None:
                raise UnsafePath(path, store.release_file(release, path), "is missing from the release")
            contents[path] = base64.b64encode(data).decode("ascii")
    kept = read_json(store.base_index) or {}
    package = Tree(package_root)
    for path in sorted(set(serving_paths(package_root)) | set(record.get("digests") or {})):
        try:
            vendor[path] = kept[path] if path in kept else package.digest(path)
        except UnsafePath as error:
            unsafe[path] = str(error)
    return dict(record=record, contents=contents, vendor=vendor, unsafe=unsafe)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            package_root=dict(type="path", required=True),
            release=dict(type="str"),
            status=dict(type="str", choices=["good", "failed"]),
            reason=dict(type="str", default=""),
            engine=dict(type="dict"),
            gates=dict(type="dict"),
            quality_baseline=dict(type="str", default="first_good"),
            keep_good=dict(type="int"),
            keep_failed_days=dict(type="int", default=14),
            export=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("export", "status")],
        supports_check_mode=True,
    )
    params = module.params
    store = StateDir(params["state_dir"])
    release = params["release"] or store.current_release()
    if release is None:
        if params["status"]:
            module.fail_json(msg="no release in %s to mark %s" % (store.root, params["status"]))
        module.exit_json(changed=False, release=None, status=None, previous_status=None, drift=[],
                         files=0, removed=[], gates=None, last_good=None,
                         quality_baseline=quality_baseline(module, store, params["quality_baseline"]))
    record_path = store.release_record(release)
    record = read_json(record_path)
    if record is None and module.check_mode and params["status"]:
        # A check run of a deploy: the staging that would write the record did not.
        module.exit_json(changed=True, release=release, status=params["status"], previous_status=None,
                         drift=[], files=0, removed=[], gates=params["gates"], last_good=None,
                         quality_baseline=quality_baseline(module, store, params["quality_baseline"]),
                         msg="release %s would be staged and marked %s" % (release, params["status"]))
    if params["export"]:
        if record is None:
            module.exit_json(changed=False, release=release, status=None, record=None, contents={},
                             vendor={}, unsafe={}, msg="release %s has no record in %s" % (release, store.root))
        try:
            exported = export(store, params["package_root"], release, record)
        except UnsafePath as error:
            module.fail_json(msg="release %s cannot be exported: %s" % (release, error))
        module.exit_json(changed=False, release=release, status=record.get("status"),
                         msg="release %s: %s" % (release, record.get("status")), **exported)
    if record is None:
        module.fail_json(msg="release %s has no record in %s" % (release, store.root))

    digests = record.get("digests") or {}
    previous = record.get("status")
    status = params["status"] or previous
    changed = status != previous
    engine_changed = bool(params["status"]) and params["engine"] is not None and (
        record.get("engine") != params["engine"])
    gates_changed = bool(params["status"]) and params["gates"] is not None and (
        record.get("gates") != params["gates"])
    if (changed or engine_changed or gates_changed) and not module.check_mode:
        if changed:
            mark_status(record, status, params["reason"])
        if engine_changed:
            record["engine"] = params["engine"]
        if gates_changed:
            record["gates"] = params["gates"]
        write_json(record_path, record)
    baseline = quality_baseline(module, store, params["quality_baseline"])
    baseline_changed = False
    if (status == "good" and baseline is None and params["quality_baseline"] == "first_good"
            and quality_score({"gates": params["gates"]}) is not None):
        baseline = {"release": release, "score": quality_score({"gates": params["gates"]})}
        baseline_changed = True
        if not module.check_mode:
            write_json(store.quality_baseline, baseline)
    removed, pruned = [], False
    if params["keep_good"] is not None and status == "good":
        if params["keep_good"] < 1:
            module.fail_json(msg="keep_good must be at least 1, got %d" % params["keep_good"])
        _kept, removed, pruned = prune(store, params["keep_good"], params["keep_failed_days"],
                                       module.check_mode)
    result = dict(
        changed=changed or engine_changed or gates_changed or baseline_changed or pruned,
        removed=removed,
        release=release,
        status=status,
        previous_status=previous,
        drift=file_drift(params["package_root"], digests),
        files=len(digests),
        gates=params["gates"] if gates_changed else record.get("gates"),
        last_good=last_good(store, record),
        quality_baseline=baseline,
        msg="release %s: %s%s" % (release, status, " (was %s)" % previous if changed else ""),
    )
    if module._diff:
        result["diff"] = {"before": {"status": previous}, "after": {"status": status}}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
