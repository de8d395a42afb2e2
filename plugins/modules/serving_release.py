#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_release
short_description: Read a release of the on-host store, record its verdict, or export it
version_added: 0.1.0
description:
  - Works on the release records M(biv100.serving.serving_overlay) writes, one job per O(state) -
    read a release (V(query)), record its verdict (V(good), V(failed)), record what the
    competition platform said of it (V(platform)), or hand over what the submission bundle is
    built from (V(exported)). Each state takes only its own options; an option of another state
    is an error naming it.
  - A verdict of the team's (V(good), V(failed)) also records what the release changed against
    the last good release before it (the vendor's base when there is none) - the payload
    entries whose files differ, each with its mapping, and the engine settings that differ,
    each with the mapping O(mappings) declares for it - as RV(changes).
  - A release's files are compared with what is installed now, by sha256; a file the release
    removed must be absent, and a file reached through a link is never the release's.
  - A verdict is appended to the record's history with the time and O(reason); the record is
    rewritten atomically, and recording what it already holds changes nothing.
  - Removing old releases without recording a verdict is M(biv100.serving.serving_retention)'s
    job; V(good) does the same with O(keep_good), once the release it marks is proven.
author:
  - biv100.serving maintainers (!UNKNOWN)
options:
  state:
    description: What to do with the release.
    type: str
    choices:
      query:
        - Read the release and change nothing - its status and the gates' figures its record holds,
          the drift of the installed files from it, the last good release before it with the
          figures it was proven with, and the quality baseline (see O(quality_baseline)) - so
          that one call gives the gates what they compare with, and an audit the drift.
      good:
        - Record that the release passed every gate, with O(reason), O(engine) (which a rollback
          to it brings back) and O(gates).
        - The first release marked V(good) with a quality score in O(gates) becomes the quality
          baseline (C(baseline/quality.json) in the store) when O(quality_baseline) is
          V(first_good), or V(base) on a host whose base was never scored, and the store has none
          yet, so that the baseline stays when old releases are pruned.
        - Then, with O(keep_good), old releases are removed as M(biv100.serving.serving_retention)
          removes them.
      failed:
        - Record that the release failed, with O(reason), and O(engine) and O(gates) as far as
          the run got, for the post-mortem. The release is kept.
      baseline:
        - Record the vendor's base's score on the quality set, O(quality) (what
          M(biv100.serving.engine_quality) returned for an engine serving the vendor's files), as
          the quality baseline V(base) (C(baseline/quality-base.json) in the store). Recorded
          once, the first time a host is deployed - a recorded score is never replaced (remove the
          file to score the base again).
      platform:
        - Record the competition platform's verdict on the release - O(verdict), O(reason) and
          O(figures) - beside the team's own, which it does not change. The record keeps every
          verdict the platform gave, the last one first in RV(platform). For a release this host
          lacks, RV(status) is null instead of a failure.
      exported:
        - Read what a submission bundle is built from (M(biv100.serving.serving_submission)) - the
          named O(release)'s whole record, the bytes of every file it installed, and the vendor's
          sha256 of every serving-layer file - and change nothing. For a release this host lacks,
          RV(status) and RV(record) are null instead of a failure.
    default: query
  release:
    description:
      - The release; with O(state=query), O(state=good) and O(state=failed) the one C(current)
        points at when not given.
      - Required with O(state=exported) - a bundle is of one named release on every host.
    type: str
  reason:
    description:
      - Why, recorded with the verdict in the release's history (the gates' summary, say, or the
        failed step).
      - Only with O(state=good) (an empty reason when not given), O(state=failed), where it is
        required, and O(state=platform), where it is required with O(verdict=failed).
    type: str
  quality:
    description:
      - The vendor's base's score on the quality set, as M(biv100.serving.engine_quality) returns
        it (C(score), C(cases), C(correct), C(simulated)); only with O(state=baseline), where it
        is required.
    type: dict
  verdict:
    description: The platform's verdict; only with O(state=platform), where it is required.
    type: str
    choices: [passed, failed]
  figures:
    description:
      - The figures the platform gave with its verdict (its throughput score, cases passed, quality
        deviation, as it names them); only with O(state=platform).
    type: dict
  mappings:
    description:
      - The mappings of the engine settings, each C({settings, source, place, change, proven_by})
        with C(settings) the variable names it covers (C(engine_args.dtype), C(engine_env.NAME),
        C(engine_allocator)), as P(biv100.serving.setting_mappings#filter) makes them. A changed
        setting none covers is recorded with an empty source.
      - Only with O(state=good) and O(state=failed).
    type: list
    elements: dict
  engine:
    description:
      - The engine settings the verdict was reached with (arguments, allocator, variables), which
        a rollback to the release brings back.
      - Only with O(state=good) and O(state=failed); the record's are kept when not given.
    type: dict
  gates:
    description:
      - The gates' figures to record with the verdict - C(bench) (the throughput figures of
        M(biv100.serving.engine_bench)) and C(quality) (the score of
        M(biv100.serving.engine_quality)) and the verdicts.
      - Only with O(state=good) and O(state=failed); the record's are kept when not given.
    type: dict
  quality_baseline:
    description:
      - The release whose quality score the gate holds others to - V(base), the vendor's files
        as O(state=baseline) recorded their score (on a host whose base was never scored, the
        first good release's instead), V(first_good), the first release marked good with a
        quality score, or a release id, whose record must hold one. V(first_good) when not given.
      - Only with O(state=query), which reports it, and O(state=good), which reports it and sets
        the store's baseline only when it is V(first_good).
    type: str
  keep_good:
    description:
      - Only with O(state=good) - after marking, remove old releases as
        M(biv100.serving.serving_retention) does, keeping this many proven ones (at least 1);
        nothing is removed when not given.
    type: int
  keep_failed_days:
    description:
      - Only with O(state=good) and O(keep_good) - failed releases younger than this many days
        are kept. V(14) when not given.
    type: int
extends_documentation_fragment:
  - biv100.serving.posix_host
  - ansible.builtin.action_common_attributes
  - biv100.serving.run_lock
  - biv100.serving.vllm_package
attributes:
  check_mode:
    support: full
    details:
      - With O(state=good) or O(state=failed), reports the status it would record and the
        releases it would remove; a release that is not staged yet (a check run of a deploy) is
        reported as it would be marked. With O(state=platform) and O(state=baseline), reports
        whether the verdict or the score is new. The other states only read.
  diff_mode:
    support: full
    details:
      - With O(state=good) or O(state=failed), the release's status before and after; with
        O(state=platform), the platform's last verdict before and after; with O(state=baseline),
        the base's score recorded.
seealso:
  - module: biv100.serving.serving_overlay
  - module: biv100.serving.serving_retention
  - module: biv100.serving.serving_submission
"""

EXAMPLES = r"""
- name: Check that the installed serving files are the current release's
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
  register: release
  failed_when: release.drift | length > 0

- name: Read what the gates compare with, holding the quality gate to sub168's score
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    state: query
    quality_baseline: sub168
  register: history

- name: Mark the release good and keep the five newest proven ones
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    release: sub510
    state: good
    reason: 75/75 probes passed; quality 0.969; score 8437
    gates: "{{ gates_result.record }}"
    keep_good: 5

- name: Keep the release for post-mortem, marked failed
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    release: sub511
    state: failed
    reason: "functional gate: 2 of 75 probes failed, first n-two"

- name: Record that the platform failed the release
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    release: sub509
    state: platform
    verdict: failed
    reason: n=3 cascaded into out-of-memory failures

- name: Read what a submission bundle is built from
  biv100.serving.serving_release:
    package_root: "{{ ansible_facts.vllm_facts.package_root }}"
    release: sub510
    state: exported
  register: exported
"""

RETURN = r"""
release:
  description: The release id; null when the host has no release yet.
  returned: always
  type: str
  sample: sub510
status:
  description:
    - Its status after the task (pending, good, failed or rolled_back).
    - With O(state=exported), null for a release this host lacks.
  returned: always
  type: str
  sample: good
previous_status:
  description: Its status before the task.
  returned: with O(state=good) or O(state=failed)
  type: str
  sample: pending
drift:
  description: One sentence per installed file that is not the release's.
  returned: with O(state=query), O(state=good) or O(state=failed)
  type: list
  elements: str
  sample: ["entrypoints/openai/serving_chat.py: installed 3f2a..., release 9b1c..."]
removed:
  description: The old releases removed (with O(keep_good)), or that would be in check mode.
  returned: with O(state=good)
  type: list
  elements: str
  sample: [sub101]
files:
  description: The number of files the release installed or removed.
  returned: with O(state=query), O(state=good) or O(state=failed)
  type: int
  sample: 3
gates:
  description: The gates' figures the release's record holds after the task, or null.
  returned: with O(state=query), O(state=good) or O(state=failed)
  type: dict
engine:
  description:
    - The engine settings the release's record holds after the task (what a rollback to it
      brings back, and what C(tune.yml) restores), or null.
  returned: with O(state=query), O(state=good) or O(state=failed)
  type: dict
  sample: {args: {max_num_seqs: 2, max_num_batched_tokens: 4096}, allocator: {max_split_size_mb: 512}, env: {}}
last_good:
  description:
    - The last good release before this one (along the records' predecessors) and the gates'
      figures it was proven with, or null.
  returned: with O(state=query), O(state=good) or O(state=failed)
  type: dict
  sample: {release: sub509, gates: {bench: {score: 8437.1}, quality: {score: 0.969}}}
changes:
  description:
    - What the release changed against the last good release before it (the vendor's base when
      there is none), one row per change - C(kind) (file or setting), C(source), C(place),
      C(change), C(what) (the files, or each setting's old and new value), C(proven_by), and the
      C(entry) or C(settings) it comes from. An empty C(source) is a change nothing maps.
    - With O(state=good) and O(state=failed) as recorded now; with the other states as the
      record holds them (null before a verdict of the team's).
  returned: with O(state=query), O(state=good), O(state=failed) or O(state=platform)
  type: list
  elements: dict
  sample: [{kind: setting, source: buddy_allocator.cu, place: computility-run.yaml env PYTORCH_CUDA_ALLOC_CONF,
            change: PYTORCH_CUDA_ALLOC_CONF, what: max_split_size_mb = 512, proven_by: [two-long-prompts-at-once],
            settings: [engine_allocator.max_split_size_mb]}]
failure_points:
  description:
    - The failure points the release's manifest declared fixed, each with what fixed it and the checks
      that prove it (C(name), C(failure), C(fixed_by), C(proven_by)), as the record holds them.
  returned: with O(state=query), O(state=good), O(state=failed) or O(state=platform)
  type: list
  elements: dict
platform:
  description: The platform's verdicts on the release, the last one first, each with its time, reason and figures.
  returned: with O(state=query) or O(state=platform)
  type: list
  elements: dict
  sample: [{verdict: failed, at: "20261204T101500Z", reason: n=3 cascaded into out-of-memory failures, figures: {}}]
quality_baseline:
  description:
    - The release and score the quality gate compares with (as O(quality_baseline) names it;
      with O(state=failed), the store's first good one; with O(state=baseline), the base's as
      the store holds it, with its cases, correct answers and time), or null before there is one.
  returned: with O(state=query), O(state=good), O(state=failed) or O(state=baseline)
  type: dict
  sample: {release: base, score: 0.969}
record:
  description: The release's record as the store holds it; null when the host lacks the release.
  returned: with O(state=exported)
  type: dict
  sample: {id: sub510, status: good, digests: {entrypoints/openai/serving_chat.py: 9b1c...}}
contents:
  description: The base64 bytes of every file the release installed, by package path.
  returned: with O(state=exported)
  type: dict
  sample: {entrypoints/openai/serving_chat.py: "IyBTUERYLUxpY2Vuc2UtSWRlbnRpZmllcjog..."}
vendor:
  description:
    - The sha256 of the vendor's own file (its kept pristine copy where the collection overlaid
      it) at every path of the serving layer and of the release, null where the vendor has none.
    - A path that leads through a link or is not a regular file is left out and named in RV(unsafe).
  returned: with O(state=exported)
  type: dict
  sample: {model_executor/models/registry.py: 4e07..., entrypoints/openai/protocol.py: 77d1...}
unsafe:
  description: Why each serving-layer path left out of RV(vendor) was.
  returned: with O(state=exported)
  type: dict
  sample: {entrypoints/openai/extra.py: "entrypoints/openai/extra.py is a symlink"}
"""

import base64
import contextlib
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.biv100.serving.plugins.module_utils._no_follow import Tree, UnsafePath
from ansible_collections.biv100.serving.plugins.module_utils._release_changes import release_changes
from ansible_collections.biv100.serving.plugins.module_utils._release_retention import prune
from ansible_collections.biv100.serving.plugins.module_utils._run_lock import NotHeld, fenced
from ansible_collections.biv100.serving.plugins.module_utils._serving_layer import REGISTRY, SERVING_TREES
from ansible_collections.biv100.serving.plugins.module_utils._state_store import (
    DEFAULT_STATE_DIR,
    StateDir,
    first_good,
    mark_status,
    read_json,
    utc_timestamp,
    write_json,
)

# What each state that writes does, for the message of a write the host's lock refused.
WRITING = {"good": "marking %s good", "failed": "marking %s failed",
           "platform": "recording the platform's verdict on %s", "baseline": "recording the base's quality score (%s)"}

# The options each state takes besides package_root, state_dir and release. They have no default
# in the argument spec, so that an option given to a state it does not belong to can be told
# from one left out; their defaults are applied where they are used.
STATE_OPTIONS = {
    "query": ("quality_baseline",),
    "good": ("reason", "engine", "gates", "mappings", "quality_baseline", "keep_good", "keep_failed_days"),
    "failed": ("reason", "engine", "gates", "mappings"),
    "platform": ("verdict", "reason", "figures"),
    "baseline": ("quality",),
    "exported": (),
}
DEFAULT_KEEP_FAILED_DAYS = 14


def foreign_options(params):
    """One sentence for each option given that the chosen state does not take, naming the states
    it belongs to."""
    state = params["state"]
    sentences = []
    for option in sorted(set(name for names in STATE_OPTIONS.values() for name in names)):
        if params[option] is not None and option not in STATE_OPTIONS[state]:
            owners = [name for name in STATE_OPTIONS if option in STATE_OPTIONS[name]]
            sentences.append("%s belongs to state=%s, not state=%s" % (option, " or ".join(owners), state))
    return sentences


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
    instances = ((record or {}).get("gates") or {}).get("instances") or {}
    for entry in (instances[name] or {} for name in sorted(instances)):
        score = (entry.get("quality") or {}).get("score")
        if isinstance(score, (int, float)) and not isinstance(score, bool):
            return score
    return None


def quality_baseline(module, store, wanted):
    """{release, score} the quality gate compares with: the vendor's base as it was scored (the
    first good release's on a host whose base never was), the store's first good one, or a named
    release's own score."""
    if wanted == "base":
        base = read_json(store.base_quality)
        # What the gate compares with: the release and its score, as for the others.
        return {"release": "base", "score": base["score"]} if base else read_json(store.quality_baseline)
    if wanted == "first_good":
        return read_json(store.quality_baseline)
    score = quality_score(read_json(store.release_record(wanted)))
    if score is None:
        module.fail_json(msg="quality_baseline %s: %s holds no release with a quality score of that name"
                         % (wanted, store.root))
    return {"release": wanted, "score": score}


def last_good_record(store, record):
    """(id, record) of the last good release before this record's, along the predecessors, or
    (None, None)."""
    release = first_good(record.get("previous"), lambda name: read_json(store.release_record(name)))
    return (None, None) if release is None else (release, read_json(store.release_record(release)))


def last_good(store, record):
    """The last good release before this record's, with the figures it was proven with."""
    release, found = last_good_record(store, record)
    return None if release is None else {"release": release, "gates": found.get("gates")}


def changes_against_last_good(store, record, declarations):
    """What the record's release changed against the last good release before it, or the base."""
    _release, found = last_good_record(store, record)
    return release_changes(record, found, declarations, read_json(store.base_index) or {})


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


def release_read(module, store, release, record, baseline):
    """What state=query reports of a release, and the marking states after their write."""
    digests = record.get("digests") or {}
    return dict(
        release=release,
        status=record.get("status"),
        drift=file_drift(module.params["package_root"], digests),
        files=len(digests),
        gates=record.get("gates"),
        engine=record.get("engine"),
        last_good=last_good(store, record),
        quality_baseline=baseline,
        changes=record.get("changes"),
        failure_points=record.get("failure_points"),
        platform=list(reversed(record.get("platform") or [])),
    )


def query(module, store):
    params = module.params
    baseline = quality_baseline(module, store, params["quality_baseline"] or "first_good")
    release = params["release"] or store.current_release()
    if release is None:
        module.exit_json(changed=False, release=None, status=None, drift=[], files=0, gates=None, engine=None,
                         last_good=None, quality_baseline=baseline, msg="no release in %s" % store.root)
    record = read_json(store.release_record(release))
    if record is None:
        module.fail_json(msg="release %s has no record in %s" % (release, store.root))
    module.exit_json(changed=False, msg="release %s: %s" % (release, record.get("status")),
                     **release_read(module, store, release, record, baseline))


def mark(module, store):
    """state=good or state=failed: the verdict, the engine and the gates' figures into the record;
    for good, the first quality baseline and the pruning of old releases."""
    params = module.params
    status = params["state"]
    release = params["release"] or store.current_release()
    if release is None:
        module.fail_json(msg="no release in %s to mark %s" % (store.root, status))
    wanted_baseline = params["quality_baseline"] or "first_good"
    # A named baseline that does not exist fails before the record is touched.
    baseline = quality_baseline(module, store, wanted_baseline)
    pruning = status == "good" and params["keep_good"] is not None
    if pruning and params["keep_good"] < 1:
        module.fail_json(msg="keep_good must be at least 1, got %d" % params["keep_good"])
    record_path = store.release_record(release)
    record = read_json(record_path)
    if record is None:
        if not module.check_mode:
            module.fail_json(msg="release %s has no record in %s" % (release, store.root))
        # A check run of a deploy: the staging that would write the record did not.
        result = dict(changed=True, release=release, status=status, previous_status=None, drift=[],
                      files=0, gates=params["gates"], last_good=None, quality_baseline=baseline, changes=[],
                      msg="release %s would be staged and marked %s" % (release, status))
        if status == "good":
            result["removed"] = []
        module.exit_json(**result)

    previous = record.get("status")
    changed = status != previous
    engine_changed = params["engine"] is not None and record.get("engine") != params["engine"]
    gates_changed = params["gates"] is not None and record.get("gates") != params["gates"]
    changes = changes_against_last_good(store, dict(record, engine=params["engine"] or record.get("engine")),
                                        params["mappings"] or [])
    changes_changed = record.get("changes") != changes
    if (changed or engine_changed or gates_changed or changes_changed) and not module.check_mode:
        if changed:
            mark_status(record, status, params["reason"] or "")
        if engine_changed:
            record["engine"] = params["engine"]
        if gates_changed:
            record["gates"] = params["gates"]
        record["changes"] = changes
        write_json(record_path, record)
    baseline_changed = False
    first_score = quality_score({"gates": params["gates"]})
    if status == "good" and baseline is None and wanted_baseline in ("first_good", "base") and first_score is not None:
        baseline = {"release": release, "score": first_score}
        baseline_changed = True
        if not module.check_mode:
            write_json(store.quality_baseline, baseline)
    result = release_read(module, store, release, record, baseline)
    result.update(
        status=status,
        previous_status=previous,
        changes=changes,
        gates=params["gates"] if gates_changed else record.get("gates"),
        msg="release %s: %s%s" % (release, status, " (was %s)" % previous if changed else ""),
    )
    pruned = False
    if status == "good":
        result["removed"] = []
        if pruning:
            keep_failed_days = params["keep_failed_days"]
            if keep_failed_days is None:
                keep_failed_days = DEFAULT_KEEP_FAILED_DAYS
            _kept, result["removed"], pruned = prune(store, params["keep_good"], keep_failed_days,
                                                     module.check_mode)
    result["changed"] = changed or engine_changed or gates_changed or changes_changed or baseline_changed or pruned
    if module._diff:
        result["diff"] = {"before": {"status": previous}, "after": {"status": status}}
    module.exit_json(**result)


# What the base's quality record keeps of engine_quality's result.
BASE_QUALITY_KEYS = ("score", "cases", "correct", "simulated")


def base_baseline(module, store):
    """state=baseline: the vendor's base's quality score, recorded once."""
    quality = module.params["quality"]
    score = quality.get("score")
    if not isinstance(score, (int, float)) or isinstance(score, bool):
        module.fail_json(msg="quality has no score: give the result of engine_quality for the engine serving the base")
    recorded = read_json(store.base_quality)
    if recorded is not None:
        module.exit_json(changed=False, quality_baseline=recorded,
                         msg="the base's quality score %s was recorded at %s; it is kept" % (recorded.get("score"),
                                                                                             recorded.get("at")))
    baseline = dict(release="base", at=utc_timestamp(),
                    **dict((key, quality[key]) for key in BASE_QUALITY_KEYS if key in quality))
    if not module.check_mode:
        write_json(store.base_quality, baseline)
    result = dict(changed=True, quality_baseline=baseline, msg="the base's quality score %s recorded" % score)
    if module._diff:
        result["diff"] = {"before": {"quality_baseline": None}, "after": {"quality_baseline": baseline}}
    module.exit_json(**result)


def platform(module, store):
    """state=platform: the platform's verdict appended to the record, unless it is the last one."""
    params = module.params
    release = params["release"] or store.current_release()
    if params["verdict"] == "failed" and not params["reason"]:
        module.fail_json(msg="verdict=failed needs a reason: what the platform said (reason=...)")
    record_path = store.release_record(release) if release else None
    record = read_json(record_path) if record_path else None
    if record is None:
        module.exit_json(changed=False, release=release, status=None, changes=None, platform=[],
                         msg="release %s has no record in %s" % (release, store.root))
    verdicts = list(record.get("platform") or [])
    said = {"verdict": params["verdict"], "reason": params["reason"] or "", "figures": params["figures"] or {}}
    last = dict(verdicts[-1]) if verdicts else None
    if last is not None:
        last.pop("at", None)
    changed = last != said
    if changed:
        verdicts.append(dict(said, at=utc_timestamp()))
        if not module.check_mode:
            record["platform"] = verdicts
            write_json(record_path, record)
    again = "" if changed else " (recorded already)"
    result = dict(changed=changed, release=release, status=record.get("status"), changes=record.get("changes"),
                  failure_points=record.get("failure_points"), platform=list(reversed(verdicts)),
                  msg="release %s: the platform's verdict %s%s" % (release, params["verdict"], again))
    if module._diff:
        result["diff"] = {"before": {"platform": last}, "after": {"platform": said}}
    module.exit_json(**result)


def exported(module, store):
    release = module.params["release"]
    record = read_json(store.release_record(release))
    if record is None:
        module.exit_json(changed=False, release=release, status=None, record=None, contents={},
                         vendor={}, unsafe={}, msg="release %s has no record in %s" % (release, store.root))
    try:
        found = export(store, module.params["package_root"], release, record)
    except UnsafePath as error:
        module.fail_json(msg="release %s cannot be exported: %s" % (release, error))
    module.exit_json(changed=False, release=release, status=record.get("status"),
                     msg="release %s: %s" % (release, record.get("status")), **found)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", default=DEFAULT_STATE_DIR),
            package_root=dict(type="path", required=True),
            state=dict(type="str", default="query", choices=list(STATE_OPTIONS)),
            release=dict(type="str"),
            reason=dict(type="str"),
            engine=dict(type="dict"),
            gates=dict(type="dict"),
            quality_baseline=dict(type="str"),
            keep_good=dict(type="int"),
            keep_failed_days=dict(type="int"),
            verdict=dict(type="str", choices=["passed", "failed"]),
            quality=dict(type="dict"),
            figures=dict(type="dict"),
            mappings=dict(type="list", elements="dict"),
        ),
        required_if=[
            ("state", "failed", ("reason",)),
            ("state", "exported", ("release",)),
            ("state", "platform", ("verdict",)),
            ("state", "baseline", ("quality",)),
        ],
        supports_check_mode=True,
    )
    # Which state an option belongs to is told first: an option of another state is the mistake
    # to name, not what that option would need.
    foreign = foreign_options(module.params)
    if foreign:
        module.fail_json(msg="; ".join(foreign))
    if module.params["keep_failed_days"] is not None and module.params["keep_good"] is None:
        module.fail_json(msg="keep_failed_days is given without keep_good: nothing is pruned without it")
    store = StateDir(module.params["state_dir"])
    state = module.params["state"]
    if state == "query":
        query(module, store)
    elif state == "exported":
        exported(module, store)
    else:
        write_verdict = {"platform": platform, "baseline": base_baseline}.get(state, mark)
        # Only while the run holds the host's lock, checked under its flock (no take-over between).
        try:
            with fenced(store.root, writing=WRITING[state] % (module.params["release"] or "the current release")) \
                    if not module.check_mode else contextlib.nullcontext():
                write_verdict(module, store)
        except NotHeld as error:
            module.fail_json(msg=str(error))


if __name__ == "__main__":
    main()
