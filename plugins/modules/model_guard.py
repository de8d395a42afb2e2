#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_guard
short_description: Prove that no byte of a host's vLLM model layer changed
version_added: 0.1.0
description:
  - The do-not-touch guard of the deployment. On first contact with a host it records the
    sha256 of every protected model-layer file in C(<state_dir>/baseline/protected.json); on
    every later run it computes them again and fails, naming each file, when one changed,
    vanished or appeared.
  - The files guarded are the protected files this layout has (O(protected), as
    M(biv100.serving.vllm_facts) resolves them), every place a protected name absent from this
    layout could appear (so that a deployment adding one is caught), the inventory's
    additions (O(extra)), and every file an earlier run recorded. A file newly protected, for
    instance an O(extra) path the inventory just added, is recorded without failing.
  - The baseline is never rewritten when a file differs from it. After a deliberate upgrade
    of the vendor base, O(rebaseline=true) records the current digests in its place.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  state_dir:
    description: The collection's state store on the host.
    type: path
    default: /var/lib/biv100-serving
  package_root:
    description: The C(vllm) package directory the protected paths are relative to.
    type: path
    required: true
  protected:
    description:
      - The protected files by name, each the path of the file relative to O(package_root),
        or null when this layout has no such file.
      - The shape of RV(biv100.serving.vllm_facts#module:vllm_facts.files.protected) reduced
        to paths; see the examples.
    type: dict
    default: {}
  extra:
    description:
      - More files to guard, relative to O(package_root); the inventory's additions to the
        protected list.
    type: list
    elements: str
    default: []
  phase:
    description: Where in the deployment the guard runs; messages name it.
    type: str
    default: check
  rebaseline:
    description:
      - Record the current digests as the new baseline instead of comparing with it, and
        accept a baseline recorded for another O(package_root).
      - Only after a deliberate upgrade of the vendor base. The result says so in a warning
        that lists every file whose recorded digest it replaced.
      - Paths the previous baseline held and no longer guarded are dropped.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Computes and compares every digest; never writes the baseline.
  diff_mode:
    support: full
    details:
      - The baseline document before and after, when the run records digests.
  platform:
    support: N/A
    platforms: posix
notes:
  - A guarded path must be relative to O(package_root) and must not contain C(..); a path
    naming a directory fails, name its files instead.
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
    checked:
      description: The number of paths compared or recorded.
      type: int
      sample: 20
    files:
      description: The current sha256 of every path checked; null for a path with no file.
      type: dict
      sample:
        model_executor/layers/sampler.py: 1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809
        model_executor/models/qwen3_5.py: null
    mismatches:
      description:
        - Each path whose current digest differs from the baseline's (null meaning no file);
          the task fails when there is one, unless O(rebaseline=true) accepted them.
      type: list
      elements: dict
      sample:
        - path: model_executor/layers/sampler.py
          baseline: 1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809
          current: 9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0
    recorded:
      description:
        - The paths whose digest this run wrote to the baseline (in check mode, would write).
      type: list
      elements: str
      sample: [model_executor/layers/quantization/awq.py]
    rebaselined:
      description: Whether this run replaced the baseline on O(rebaseline=true).
      type: bool
      sample: false
"""

import json
import os
import posixpath
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    StateDir,
    read_json,
    write_json,
)
from ansible_collections.biv100.serving.plugins.module_utils._vllm_layout import (
    PROTECTED_FILES,
    sha256_file,
)

# Enough of a digest to tell two files apart in a message; the result has the full digests.
SHORT_DIGEST = 8


class Outcome(object):
    """The baseline document a run leaves behind, and the comparison that led to it."""

    def __init__(self, document, current, mismatches=(), recorded=()):
        self.document = document
        self.current = current
        self.mismatches = list(mismatches)
        self.recorded = sorted(recorded)

    def report(self, rebaselined=False):
        return {
            "baseline_recorded_at": self.document["recorded_at"],
            "checked": len(self.current),
            "files": self.current,
            "mismatches": self.mismatches,
            "recorded": self.recorded,
            "rebaselined": rebaselined,
        }


def guarded_paths(protected, extra):
    """The package paths to guard for the protected names and the inventory's extra paths.

    A name absent from this layout stands for every location vllm_facts looks for it at: they
    are recorded as absent, so that a file appearing there later is a mismatch.
    """
    paths = set(posixpath.normpath(path) for path in extra)
    for name, path in protected.items():
        paths.update([posixpath.normpath(path)] if path else PROTECTED_FILES.get(name, ()))
    return paths


def misshapen(protected):
    """The names whose value is neither a path nor null (such as a whole vllm_facts entry)."""
    return sorted(
        name for name, path in protected.items() if path is not None and not isinstance(path, str)
    )


def escaping(protected, extra):
    """The paths, as given, that leave package_root."""
    given = list(extra) + [path for path in protected.values() if path]
    return sorted(path for path in given if posixpath.isabs(path) or ".." in path.split("/"))


def digests(package_root, paths):
    """The sha256 of each path's file, None where there is no file."""
    return dict((path, file_digest(os.path.join(package_root, path))) for path in sorted(paths))


def file_digest(path):
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


def differences(recorded, current):
    """Each recorded path whose current digest differs: changed, vanished or appeared."""
    return [
        {"path": path, "baseline": recorded[path], "current": current[path]}
        for path in sorted(recorded)
        if path in current and current[path] != recorded[path]
    ]


def describe(mismatch):
    """`path sha256 1a2b3c4d… → 9f8e7d6c…`, with `absent` for a side that has no file."""
    before, after = mismatch["baseline"], mismatch["current"]
    if before and after:
        return "%s sha256 %s\u2026 \u2192 %s\u2026" % (
            mismatch["path"],
            before[:SHORT_DIGEST],
            after[:SHORT_DIGEST],
        )
    return "%s %s \u2192 %s" % (mismatch["path"], _side(before), _side(after))


def _side(digest):
    return "sha256 %s\u2026" % digest[:SHORT_DIGEST] if digest else "absent"


def new_baseline(package_root, files):
    return {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "package_root": package_root,
        "files": files,
    }


def load_baseline(module, path):
    try:
        return read_json(path)
    except ValueError as error:
        if module.params["rebaseline"]:
            return None  # being replaced anyway
        module.fail_json(
            msg="the guard baseline %s is not valid JSON (%s): run with rebaseline=true to record "
            "it anew" % (path, error)
        )


def first_contact(package_root, wanted):
    current = digests(package_root, wanted)
    return Outcome(new_baseline(package_root, current), current, recorded=current)


def compare(module, baseline, package_root, wanted):
    """Check every recorded and wanted path; record the wanted paths the baseline lacks.

    Recorded paths are checked even when no longer wanted: a protected file that vanished
    changes where vllm_facts resolves its name, and must not drop out of the guard for that.
    """
    phase = module.params["phase"]
    if baseline["package_root"] != package_root:
        module.fail_json(
            msg="the guard baseline was recorded at %s for the vLLM at %s, not %s (%s): if the "
            "host's vLLM moved deliberately, run with rebaseline=true"
            % (baseline["recorded_at"], baseline["package_root"], package_root, phase)
        )
    recorded = baseline["files"]
    current = digests(package_root, wanted.union(recorded))
    mismatches = differences(recorded, current)
    if mismatches:
        module.fail_json(
            msg="model layer changed since first contact (%s): %s"
            % (phase, "; ".join(describe(mismatch) for mismatch in mismatches)),
            guard=Outcome(baseline, current, mismatches).report(),
        )
    added = dict((path, current[path]) for path in wanted if path not in recorded)
    if not added:
        return Outcome(baseline, current)
    files = dict(recorded)
    files.update(added)
    return Outcome(dict(baseline, files=files), current, recorded=added)


def rebaseline(module, baseline, package_root, wanted):
    """Record the current digests in place of the baseline, saying loudly what that accepts."""
    current = digests(package_root, wanted)
    if baseline and baseline["package_root"] == package_root and baseline["files"] == current:
        return Outcome(baseline, current)
    accepted = differences(baseline["files"] if baseline else {}, current)
    module.warn(
        "model_guard rebaseline (%s): the sha256 of %d protected files under %s recorded anew%s"
        % (
            module.params["phase"],
            len(current),
            package_root,
            (
                "; accepted " + "; ".join(describe(mismatch) for mismatch in accepted)
                if accepted
                else ""
            ),
        )
    )
    return Outcome(new_baseline(package_root, current), current, accepted, recorded=current)


def summary(outcome, phase, rebaselined):
    if rebaselined:
        return "rebaselined (%s): recorded %d protected files anew" % (phase, len(outcome.recorded))
    parts = []
    unchanged = len(outcome.current) - len(outcome.recorded)
    if unchanged:
        parts.append(
            "%d protected files unchanged since %s" % (unchanged, outcome.document["recorded_at"])
        )
    if outcome.recorded:
        parts.append(
            "recorded %d in the baseline: %s" % (len(outcome.recorded), ", ".join(outcome.recorded))
        )
    return "%s (%s)" % ("; ".join(parts) or "no protected file to guard", phase)


def as_text(document):
    # Laid out as write_json lays out the file, so that the diff reads like the file.
    return json.dumps(document, indent=1, sort_keys=True) + "\n" if document else ""


def guard(module, baseline_path, package_root, wanted):
    """Compare or record; write the baseline when it changed. Returns (outcome, baseline before)."""
    baseline = load_baseline(module, baseline_path)
    if module.params["rebaseline"]:
        outcome = rebaseline(module, baseline, package_root, wanted)
    elif baseline is None:
        outcome = first_contact(package_root, wanted)
    else:
        outcome = compare(module, baseline, package_root, wanted)
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
    wanted = guarded_paths(params["protected"], params["extra"])

    baseline_path = StateDir(params["state_dir"]).baseline
    try:
        outcome, baseline = guard(module, baseline_path, package_root, wanted)
    except OSError as error:
        module.fail_json(
            msg="model_guard (%s): %s: %s" % (params["phase"], error.filename, error.strerror)
        )

    changed = outcome.document != baseline
    rebaselined = params["rebaseline"] and changed
    result = dict(
        changed=changed,
        guard=outcome.report(rebaselined),
        msg=summary(outcome, params["phase"], rebaselined),
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
