# -*- coding: utf-8 -*-
# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a release changed against the last good release, each change with its mapping.

A mapping says where a change comes from and where it lands: `source` (the design it ports or
the idea behind it), `place` (where in the base: a file and symbol, or the run file's env or
parameters) and `change` (its kind). Payload entries carry theirs in the release record
(`mappings`, with the files each entry installs); engine settings get theirs from the
declarations the deploy passes (serving_mappings), keyed by the setting's variable name:
`engine_args.max_num_seqs`, `engine_env.NAME`, `engine_allocator.max_split_size_mb`, or a
whole section (`engine_allocator`).

release_changes compares a release record with the last good one (none: the vendor's base,
where no file is overlaid and no setting is the collection's) and returns one row per change:
a payload entry whose files differ, an entry the release dropped, files no entry claims, and,
per declaration, the settings it covers that differ. Settings no declaration covers are kept
too, one row per section with an empty source, so that an unexplained change stands out.

Runs on the host: standard library only, Python 3.8.
"""

from __future__ import annotations

# The record's sections of an instance's settings, by the variable that sets them, with the
# place in the platform's run file a change of each lands in.
SECTIONS = (
    ("args", "engine_args", "computility-run.yaml parameters"),
    ("env", "engine_env", "computility-run.yaml env"),
    ("allocator", "engine_allocator", "computility-run.yaml env PYTORCH_CUDA_ALLOC_CONF"),
)
# A setting's kind of change when its declaration names none.
DEFAULT_CHANGE = {"args": "launch parameter", "env": "environment variable",
                  "allocator": "PYTORCH_CUDA_ALLOC_CONF"}


def release_changes(record, last_good, declarations, base=None):
    """The rows of what `record` changed against `last_good` (a release record, or None for the
    vendor's base); `declarations` are the settings' mappings, `base` the vendor's digest of
    each file ({path: sha256 or None})."""
    return file_changes(record, last_good, base or {}) + setting_changes(record, last_good, declarations)


def file_changes(record, last_good, base):
    before = _digests(last_good, base)
    after = _digests(record, base)
    changed = sorted(path for path in set(before) | set(after) if before.get(path) != after.get(path))
    rows, claimed = [], set()
    for mapping in record.get("mappings") or ():
        paths = mapping.get("paths")
        if paths is None:
            # A record made before mappings named their files: the entry is new when the last
            # good release did not carry it.
            hit = last_good is None or mapping.get("entry") not in (last_good.get("entries") or ())
            paths = []
        else:
            hit = any(path in changed for path in paths)
        claimed.update(paths)
        if hit:
            rows.append(_row("file", mapping, what=", ".join(paths) or mapping.get("entry", ""),
                             entry=mapping.get("entry")))
    for mapping in (last_good or {}).get("mappings") or ():
        paths = [path for path in mapping.get("paths") or () if path in changed and path not in claimed]
        if paths and mapping.get("entry") not in (record.get("entries") or ()):
            claimed.update(paths)
            rows.append(_row("file", mapping, change="removed: " + str(mapping.get("change") or "change"),
                             what=", ".join(paths), entry=mapping.get("entry")))
    loose = [path for path in changed if path not in claimed]
    if loose:
        rows.append(_row("file", {}, place=", ".join(loose), change="file", what=", ".join(loose)))
    return rows


def setting_changes(record, last_good, declarations):
    ours = ((record.get("engine") or {}).get("instances")) or {}
    theirs = (((last_good or {}).get("engine") or {}).get("instances")) or {}
    changed = {}  # setting name -> ["old -> new", ...], names in a stable order
    for name in sorted(ours):
        before = theirs.get(name) or (next(iter(theirs.values())) if len(theirs) == 1 else {})
        for section, variable, _place in SECTIONS:
            old, new = before.get(section) or {}, ours[name].get(section) or {}
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    shown = "%s %s" % (key, _transition(old.get(key), new.get(key), key in old, key in new))
                    values = changed.setdefault("%s.%s" % (variable, key), [])
                    if shown not in values:
                        values.append(shown)
    rows, covered = [], set()
    for declaration in declarations or ():
        names = [name for name in changed if name not in covered and _covers(declaration, name)]
        if names:
            covered.update(names)
            section = _section(names[0])
            rows.append(_row("setting", declaration, place=declaration.get("place") or section[2],
                             change=declaration.get("change") or DEFAULT_CHANGE[section[0]],
                             what="; ".join(shown for name in names for shown in changed[name]),
                             settings=names))
    for section, variable, place in SECTIONS:
        names = [name for name in changed if name not in covered and name.startswith(variable + ".")]
        if names:
            rows.append(_row("setting", {}, place=place, change=DEFAULT_CHANGE[section],
                             what="; ".join(shown for name in names for shown in changed[name]), settings=names))
    return rows


def _digests(record, base):
    """{path: sha256} of the files a release (None: the vendor's base) installs, over the base's."""
    if record is None:
        return dict(base)
    merged = dict(base)
    merged.update(record.get("digests") or {})
    return merged


def _covers(declaration, name):
    variable = name.split(".", 1)[0]
    return any(setting in (name, variable) for setting in declaration.get("settings") or ())


def _section(name):
    variable = name.split(".", 1)[0]
    return next(section for section in SECTIONS if section[1] == variable)


def _transition(old, new, had, has):
    if not had:
        return "= %s" % _shown(new)
    if not has:
        return "%s -> (unset)" % _shown(old)
    return "%s -> %s" % (_shown(old), _shown(new))


def _shown(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _row(kind, mapping, **fields):
    row = {"kind": kind, "source": str(mapping.get("source") or mapping.get("idea") or ""),
           "place": str(mapping.get("place") or ""), "change": str(mapping.get("change") or ""),
           "proven_by": list(mapping.get("proven_by") or ())}
    row.update((key, value) for key, value in fields.items() if value is not None)
    return row
