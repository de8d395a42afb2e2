# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Mappings: where each change of an iteration comes from and where it lands in the vendor's base.

A mapping has `source` (the design a change ports, or the idea behind it), `place` (where in the
base: a file and symbol, or the platform run file's env or parameters) and `change` (its kind),
and may name the checks that prove it (`proven_by`: probe names, or `guard` for the model-layer
guard every deploy runs). A payload entry carries one in the manifest (`idea` is the older name
of `source`, and still read); engine settings get theirs from serving_mappings in the inventory,
or serving_tune_mappings in the proposal tune.yml writes, each declaration naming the settings it
covers by variable (`engine_args.max_num_seqs`, `engine_env.NAME`, `engine_allocator` for all of
that section). The manifest also declares the failure points the team fixed, each with the
checks that prove it, and the mappings it plans but has not built.

Every function here checks a declaration and returns it normalized, or raises MappingError
naming what is wrong and where; mapping_problems says the same, one sentence a declaration, for
a playbook to refuse before any host changes.

Controller side only.
"""

from __future__ import annotations

import re

FIELDS = ("source", "place", "change")
OLD_SOURCE = "idea"
# The check every deploy runs besides the probes: the model layer's guard.
GUARD = "guard"
CHECK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
SETTING = re.compile(r"^(engine_args|engine_env|engine_allocator)(\.[A-Za-z_][A-Za-z0-9_]*)?$")
SETTING_VARIABLES = ("serving_mappings", "serving_tune_mappings")
FAILURE_POINT_KEYS = {"name", "failure", "fixed_by", "proven_by"}


class MappingError(ValueError):
    """A mapping that cannot be recorded; the message names where it was declared."""


def entry_mapping(raw, where: str) -> dict:
    """A payload entry's mapping: {source, place, change, proven_by}; {} when it has none."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MappingError(f"{where}: mapping must be a mapping of {', '.join(FIELDS)}")
    known = set(FIELDS) | {OLD_SOURCE, "proven_by"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise MappingError(f"{where}: mapping has unknown keys {', '.join(map(str, unknown))} "
                           f"(known: {', '.join(sorted(known))})")
    if OLD_SOURCE in raw and "source" in raw:
        raise MappingError(f"{where}: mapping gives both source and idea, its older name: keep source")
    fields = {key: _text(raw.get(key), f"{where}: mapping {key}") for key in FIELDS if key in raw}
    if OLD_SOURCE in raw:
        fields["source"] = _text(raw[OLD_SOURCE], f"{where}: mapping idea")
    fields["proven_by"] = checks(raw.get("proven_by"), f"{where}: mapping proven_by")
    return fields


def setting_mappings(raw, variable: str) -> list[dict]:
    """serving_mappings (or serving_tune_mappings): a list of {settings (a name or a list),
    source, place, change, proven_by}; place and change may be left to the setting's section."""
    declared, seen = [], {}
    for where, item in _declarations(raw, variable, f"{variable}[", first=0, close="]"):
        known = {"settings", "source", "place", "change", "proven_by"}
        unknown = sorted(set(item) - known)
        if unknown:
            raise MappingError(f"{where}: unknown keys {', '.join(map(str, unknown))} (known: {', '.join(sorted(known))})")
        names = item.get("settings")
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names:
            raise MappingError(f"{where}: settings must name one setting or a list, such as engine_args.dtype")
        for name in names:
            if not isinstance(name, str) or not SETTING.match(name):
                raise MappingError(f"{where}: {name!r} is not a setting: engine_args.<argument>, engine_env.<NAME>, "
                                   "engine_allocator.<option>, or one of those three whole")
            if name in seen:
                raise MappingError(f"{where}: {name} is mapped by {seen[name]} already")
            seen[name] = where
        if "source" not in item:
            raise MappingError(f"{where}: source is required (what the change ports, or the idea behind it)")
        mapping = {"settings": names, "source": _text(item["source"], f"{where}: source"),
                   "proven_by": checks(item.get("proven_by"), f"{where}: proven_by")}
        mapping.update({key: _text(item[key], f"{where}: {key}") for key in ("place", "change") if key in item})
        declared.append(mapping)
    return declared


def declared_settings(inventory, proposal=None) -> list[dict]:
    """The settings' mappings of a deploy: the proposal's first, so that they win for a setting
    both name, then the inventory's."""
    return setting_mappings(proposal, SETTING_VARIABLES[1]) + setting_mappings(inventory, SETTING_VARIABLES[0])


def mapping_problems(inventory, proposal=None) -> list[str]:
    """Why the settings' mappings cannot be recorded, one sentence each; none when they can."""
    problems = []
    for raw, variable in ((inventory, SETTING_VARIABLES[0]), (proposal, SETTING_VARIABLES[1])):
        try:
            setting_mappings(raw, variable)
        except MappingError as error:
            problems.append(str(error))
    return problems


def failure_points(raw, where: str) -> list[dict]:
    """The manifest's failure_points: {name, failure, fixed_by, proven_by (at least one check)}."""
    points, names = [], set()
    for label, item in _declarations(raw, f"{where}: failure_points", f"{where}: failure point ", first=1):
        unknown = sorted(set(item) - FAILURE_POINT_KEYS)
        missing = sorted(FAILURE_POINT_KEYS - set(item))
        if unknown or missing:
            raise MappingError(f"{label}: " + "; ".join(
                part for part in (unknown and f"unknown keys {', '.join(map(str, unknown))}",
                                  missing and f"missing {', '.join(missing)}") if part))
        name = item["name"]
        if not isinstance(name, str) or not CHECK_NAME.match(name) or name in names:
            raise MappingError(f"{label}: name must be unique lowercase letters, digits and '-', got {name!r}")
        names.add(name)
        proven_by = checks(item["proven_by"], f"{label} ({name}): proven_by")
        if not proven_by:
            raise MappingError(f"{label} ({name}): proven_by names no check; a fix is recorded with what proves it")
        points.append({"name": name, "failure": _text(item["failure"], f"{label} ({name}): failure"),
                       "fixed_by": _text(item["fixed_by"], f"{label} ({name}): fixed_by"), "proven_by": proven_by})
    return points


def planned(raw, where: str) -> list[dict]:
    """The manifest's planned mappings: {source, place, change} of changes not built yet."""
    rows = []
    for label, item in _declarations(raw, f"{where}: planned", f"{where}: planned mapping ", first=1):
        if set(item) != set(FIELDS):
            raise MappingError(f"{label} must be a mapping of exactly {', '.join(FIELDS)}")
        rows.append({key: _text(item[key], f"{label} {key}") for key in FIELDS})
    return rows


def _declarations(raw, what: str, label: str, first: int, close: str = "") -> list[tuple[str, dict]]:
    """(where, item) of each declaration of a list, where being label, its number (counted from
    `first`) and close; none for an empty value. A value that is not a list, or an item that is
    not a mapping, is an error naming it."""
    if raw in (None, "", []):
        return []
    if not isinstance(raw, list):
        raise MappingError(f"{what} must be a list of mappings, got {type(raw).__name__}")
    found = []
    for number, item in enumerate(raw, first):
        where = f"{label}{number}{close}"
        if not isinstance(item, dict):
            raise MappingError(f"{where} must be a mapping, got {type(item).__name__}")
        found.append((where, item))
    return found


def checks(raw, where: str) -> list[str]:
    """Probe names (or `guard`), as a list; [] when none."""
    if raw is None:
        return []
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(name, str) and CHECK_NAME.match(name) for name in names):
        raise MappingError(f"{where} must name probes (or {GUARD}): lowercase letters, digits and '-'")
    return list(dict.fromkeys(names))


def _text(value, where: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
        raise MappingError(f"{where} must be a non-empty text")
    return " ".join(str(value).split())
