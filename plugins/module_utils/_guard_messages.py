# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What model_guard says of the differences it found: one line per kind of change, each file
named (the brief's protected names first), long lists cut to the first LISTED, digests shortened.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

from ansible_collections.biv100.serving.plugins.module_utils._model_layer import (
    MODEL_LAYER,
    NEWLY_GUARDED,
    NOW_IGNORED,
    OVERLAID,
    UNIGNORED,
    is_digest,
)


# Enough of a digest to tell two files apart in a message; the result has the full digests.
SHORT_DIGEST = 8
# How many paths a message names before "and K more": a vendor upgrade can change hundreds,
# and every one of them is in the result anyway.
LISTED = 10


def show(state):
    """A recorded state in a message: `sha256 1a2b3c4d…`, `symlink:<target>`, or the type."""
    return "sha256 %s\u2026" % state[:SHORT_DIGEST] if is_digest(state) else state


def describe(mismatch):
    """`path changed sha256 1a2b3c4d… → 9f8e7d6c…`, `path added`, `path removed`; a protected
    location is introduced by its name: `protected scheduler.py (core/scheduler.py) changed`."""
    where = mismatch["path"]
    if mismatch["protected"]:
        where = "protected %s (%s)" % (mismatch["protected"], where)
    before, after = mismatch["baseline"], mismatch["current"]
    if mismatch["kind"] == "changed" and is_digest(before) and is_digest(after):
        return "%s changed sha256 %s\u2026 \u2192 %s\u2026" % (
            where,
            before[:SHORT_DIGEST],
            after[:SHORT_DIGEST],
        )
    if mismatch["kind"] == "changed":
        return "%s changed %s \u2192 %s" % (where, show(before), show(after))
    if mismatch["kind"] == "added":
        # A regular file goes by its path alone; a link or a device says what it is.
        return "%s added" % where if is_digest(after) else "%s added (%s)" % (where, after)
    return "%s removed" % where


def plural(count, word):
    return "%d %s%s" % (count, word, "" if count == 1 else "s")


def listing(items, separator="; "):
    """The first LISTED items joined, and how many more there are."""
    shown = separator.join(items[:LISTED])
    if len(items) > LISTED:
        shown += "%sand %d more (all in the result)" % (separator, len(items) - LISTED)
    return shown


def files_in(states):
    """How many of the paths have a file: absent locations are guarded too, but are no file."""
    return len([state for state in states.values() if state is not None])


def kinds(mismatches):
    counts = {}
    for found in mismatches:
        counts[found["kind"]] = counts.get(found["kind"], 0) + 1
    return ", ".join("%d %s" % (counts[kind], kind) for kind in sorted(counts))


def describe_all(mismatches):
    """The protected locations first (the brief's headline), then the other files."""
    headline = [describe(found) for found in mismatches if found["protected"]]
    others = [found for found in mismatches if not found["protected"]]
    parts = list(headline)
    if others:
        counted = " (%s)" % kinds(others) if len(others) > LISTED else ""
        parts.append(
            "%s%s%s: %s"
            % (
                "and " if headline else "",
                plural(len(others), "more model-layer file" if headline else "model-layer file"),
                counted,
                listing([describe(found) for found in others]),
            )
        )
    return "; ".join(parts)


def summary(outcome, baseline, phase, rebaselined):
    if rebaselined:
        return "rebaselined (%s): recorded %s anew" % (
            phase,
            plural(files_in(outcome.current), "model-layer file"),
        )
    if baseline is None:
        return "first contact (%s): recorded %s in the baseline%s, %s" % (
            phase,
            plural(files_in(outcome.current), "model-layer file"),
            ", %d ignored" % outcome.ignored if outcome.ignored else "",
            "each as %s lists it" % outcome.record.path
            if outcome.record
            else "as found (no installer RECORD to hold them to)",
        )
    parts = []
    unchanged = files_in(
        dict(
            (path, state) for path, state in outcome.current.items() if path not in outcome.recorded
        )
    )
    if unchanged:
        parts.append(
            "%s unchanged since %s"
            % (plural(unchanged, "model-layer file"), outcome.document["recorded_at"])
        )
    parts.extend(scope_changes(outcome, baseline))
    return "%s (%s)" % ("; ".join(parts) or "no model-layer file to guard", phase)


def scope_changes(outcome, baseline):
    """Sentences for each way the baseline's scope moved in this run."""

    def paths_for(reasons, reason):
        return sorted(path for path, why in reasons.items() if why == reason)

    for verb, reasons, reason in (
        ("recorded", outcome.recorded, UNIGNORED),
        ("recorded", outcome.recorded, NEWLY_GUARDED),
        ("dropped", outcome.dropped, NOW_IGNORED),
        ("dropped", outcome.dropped, OVERLAID),
    ):
        paths = paths_for(reasons, reason)
        if paths:
            yield "%s %s %s: %s" % (verb, plural(len(paths), "path"), reason, listing(paths, ", "))
    before = baseline.get("ignore") if baseline.get("scope") == MODEL_LAYER else None
    if before is not None and before != outcome.document["ignore"]:
        yield "ignore patterns now %s (were %s)" % (
            ", ".join(outcome.document["ignore"]) or "none",
            ", ".join(before) or "none",
        )
