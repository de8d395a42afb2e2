# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""JSON Schema validation for the functional probes and the quality gate, with the standard
library alone (the collection depends on ansible-core and jmespath, nothing more).

    schema_errors(instance, schema) -> list[str]     # empty: the instance is valid

It covers the keywords of draft 2020-12 and draft 7 that structured-output and tool-call cases
use:

    type (a name or a list; "integer" is a number without a fraction, booleans are never
         numbers), enum, const
    numbers   minimum, maximum, exclusiveMinimum, exclusiveMaximum (draft 6+ numbers, and the
              draft 4 booleans), multipleOf (exact for decimals: 0.3 is a multiple of 0.1)
    strings   minLength, maxLength (in code points), pattern (Python's re.search)
    arrays    items (a schema; in draft 7 also a list, with additionalItems), prefixItems,
              minItems, maxItems, uniqueItems, contains, minContains, maxContains
    objects   properties, required, additionalProperties (boolean or schema),
              patternProperties, propertyNames, minProperties, maxProperties,
              dependentRequired, dependentSchemas, dependencies (draft 7)
    logic     allOf, anyOf, oneOf, not, if / then / else
    $ref      local JSON pointers: "#", "#/$defs/...", "#/definitions/..." (and any other
              "#/..." path into the root schema); keywords beside a $ref apply as well

Other keywords (format, title, $schema, $id, ...) are ignored, as annotations are. Values are
compared the JSON way: 1 and 1.0 are equal, true and 1 are not.

Each error starts with the JSON pointer (RFC 6901) of the failing value, written after "#"
("#" is the instance itself, "#/items/0/name" a member of an element), then says what is wrong.
A schema that cannot be applied (something other than an object or a boolean where a schema
belongs, a $ref that does not resolve or loops without descending into the instance, a pattern
that is not a regular expression, a keyword of the wrong type) raises SchemaError: that is a
fault of the schema, not of the instance.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from urllib.parse import unquote

SHOWN_CHARS = 60  # how much of a value an error quotes


class SchemaError(ValueError):
    """A schema that cannot be applied to any instance."""


def schema_errors(instance, schema) -> list[str]:
    """What makes the instance invalid against the schema; empty when it is valid."""
    return _Validator(schema).errors(instance, schema, ())


def pointer(path) -> str:
    """The JSON pointer of a path of keys and indexes, after "#"."""
    return "#" + "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def json_equal(first, second) -> bool:
    """Equality of JSON values: numbers by value, booleans apart from numbers, deep."""
    if isinstance(first, bool) or isinstance(second, bool):
        return isinstance(first, bool) and isinstance(second, bool) and first == second
    if _is_number(first) and _is_number(second):
        return first == second
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(json_equal(first[key], second[key])
                                                     for key in first)
    if isinstance(first, (list, tuple)) and isinstance(second, (list, tuple)):
        return len(first) == len(second) and all(map(json_equal, first, second))
    return type(first) is type(second) and first == second


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value) -> bool:
    return _is_number(value) and (isinstance(value, int)
                                  or (math.isfinite(value) and value.is_integer()))


TYPES = {
    "null": lambda value: value is None,
    "boolean": lambda value: isinstance(value, bool),
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, (list, tuple)),
    "string": lambda value: isinstance(value, str),
    "number": _is_number,
    "integer": _is_integer,
}


def _type_name(value) -> str:
    """The narrowest JSON type of a value (3 is an integer, 3.5 a number)."""
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if TYPES[name](value):
            return name
    return type(value).__name__


def _show(value) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


class _Validator:
    """One validation: the root schema (for $ref) and the $refs being followed."""

    def __init__(self, root):
        self.root = root
        self.following = set()  # (ref, instance path) pairs on the stack: a repeat is a loop

    def errors(self, instance, schema, path) -> list[str]:
        if schema is True:
            return []
        if schema is False:
            return [f"{pointer(path)}: no value is allowed here (the schema is false)"]
        if not isinstance(schema, dict):
            raise SchemaError(f"{_show(schema)} is not a schema (an object or a boolean)")
        found = []
        for keyword, check in KEYWORDS:
            if keyword in schema:
                found += check(self, instance, schema[keyword], schema, path)
        return found

    def valid(self, instance, schema, path) -> bool:
        return not self.errors(instance, schema, path)

    def first_error(self, instance, schema, path) -> str | None:
        found = self.errors(instance, schema, path)
        return found[0] if found else None


# ---- the keywords: each returns the errors it finds, and applies only to its own types;
# a keyword's value is checked before the instance's type is, so that a broken schema fails
# whatever it is applied to.

def _ref(validator, instance, ref, schema, path):
    if not isinstance(ref, str):
        raise SchemaError(f"$ref {_show(ref)} is not a string")
    key = (ref, tuple(path))
    if key in validator.following:
        raise SchemaError(f"$ref {ref!r} loops without descending into the instance")
    validator.following.add(key)
    try:
        return validator.errors(instance, _resolve(validator.root, ref), path)
    finally:
        validator.following.discard(key)


def _resolve(root, ref):
    if ref != "#" and not ref.startswith("#/"):
        raise SchemaError(f"$ref {ref!r} is not a local JSON pointer (\"#/$defs/...\")")
    target = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise SchemaError(f"$ref {ref!r} does not resolve in the schema")
    return target


def _type(validator, instance, expected, schema, path):
    names = [expected] if isinstance(expected, str) else expected
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise SchemaError(f"type {_show(expected)} is not a type name or a list of them")
    unknown = [name for name in names if name not in TYPES]
    if unknown:
        raise SchemaError(f"type {_show(unknown[0])} is none of {', '.join(TYPES)}")
    if any(TYPES[name](instance) for name in names):
        return []
    wanted = names[0] if len(names) == 1 else " or ".join(names)
    return [f"{pointer(path)}: {_show(instance)} is {_type_name(instance)}, not {wanted}"]


def _enum(validator, instance, options, schema, path):
    if not isinstance(options, list):
        raise SchemaError(f"enum {_show(options)} is not a list")
    if any(json_equal(instance, option) for option in options):
        return []
    return [f"{pointer(path)}: {_show(instance)} is none of {_show(options)}"]


def _const(validator, instance, value, schema, path):
    if json_equal(instance, value):
        return []
    return [f"{pointer(path)}: {_show(instance)} is not the constant {_show(value)}"]


def _number(keyword, value):
    if not _is_number(value):
        raise SchemaError(f"{keyword} {_show(value)} is not a number")
    return value


def _count(keyword, value):
    if not _is_integer(value) or value < 0:
        raise SchemaError(f"{keyword} {_show(value)} is not a non-negative integer")
    return value


def _multiple_of(validator, instance, divisor, schema, path):
    if _number("multipleOf", divisor) <= 0:
        raise SchemaError(f"multipleOf {_show(divisor)} is not above 0")
    if not _is_number(instance):
        return []
    try:
        # Decimal text, so that 0.3 is a multiple of 0.1 as a reader of the schema means it.
        multiple = (Fraction(repr(instance)) / Fraction(repr(divisor))).denominator == 1
    except (ValueError, OverflowError):  # inf, nan
        multiple = False
    return [] if multiple else [f"{pointer(path)}: {_show(instance)} is not a multiple of "
                                f"{_show(divisor)}"]


def _minimum(validator, instance, bound, schema, path):
    _number("minimum", bound)
    exclusive = schema.get("exclusiveMinimum") is True  # draft 4's boolean form
    if _is_number(instance) and (instance < bound or (exclusive and instance == bound)):
        relation = "above" if exclusive else "at least"
        return [f"{pointer(path)}: {_show(instance)} is not {relation} {_show(bound)}"]
    return []


def _maximum(validator, instance, bound, schema, path):
    _number("maximum", bound)
    exclusive = schema.get("exclusiveMaximum") is True
    if _is_number(instance) and (instance > bound or (exclusive and instance == bound)):
        relation = "below" if exclusive else "at most"
        return [f"{pointer(path)}: {_show(instance)} is not {relation} {_show(bound)}"]
    return []


def _exclusive_minimum(validator, instance, bound, schema, path):
    if isinstance(bound, bool):
        return []  # draft 4's boolean form, read by _minimum
    _number("exclusiveMinimum", bound)
    if _is_number(instance) and instance <= bound:
        return [f"{pointer(path)}: {_show(instance)} is not above {_show(bound)}"]
    return []


def _exclusive_maximum(validator, instance, bound, schema, path):
    if isinstance(bound, bool):
        return []
    _number("exclusiveMaximum", bound)
    if _is_number(instance) and instance >= bound:
        return [f"{pointer(path)}: {_show(instance)} is not below {_show(bound)}"]
    return []


def _min_length(validator, instance, bound, schema, path):
    _count("minLength", bound)
    if isinstance(instance, str) and len(instance) < bound:
        return [f"{pointer(path)}: {_show(instance)} is shorter than {bound} characters"]
    return []


def _max_length(validator, instance, bound, schema, path):
    _count("maxLength", bound)
    if isinstance(instance, str) and len(instance) > bound:
        return [f"{pointer(path)}: {_show(instance)} is longer than {bound} characters"]
    return []


def _compiled(pattern, keyword):
    if not isinstance(pattern, str):
        raise SchemaError(f"{keyword} {_show(pattern)} is not a string")
    try:
        return re.compile(pattern)
    except re.error as error:
        raise SchemaError(f"{keyword} {pattern!r} is not a regular expression: {error}") from None


def _pattern(validator, instance, pattern, schema, path):
    compiled = _compiled(pattern, "pattern")
    if isinstance(instance, str) and not compiled.search(instance):
        return [f"{pointer(path)}: {_show(instance)} does not match {pattern!r}"]
    return []


def _schemas(keyword, value):
    if not isinstance(value, list):
        raise SchemaError(f"{keyword} {_show(value)} is not a list of schemas")
    return value


def _prefix_items(validator, instance, prefix, schema, path):
    if not isinstance(instance, (list, tuple)):
        return []
    pairs = enumerate(zip(instance, _schemas("prefixItems", prefix)))
    return [error for index, (item, sub) in pairs
            for error in validator.errors(item, sub, path + (index,))]


def _items(validator, instance, items, schema, path):
    if not isinstance(instance, (list, tuple)):
        return []
    if isinstance(items, list):  # draft 7's tuple form
        return _prefix_items(validator, instance, items, schema, path)
    start = len(schema.get("prefixItems") or [])
    return [error for index in range(start, len(instance))
            for error in validator.errors(instance[index], items, path + (index,))]


def _additional_items(validator, instance, additional, schema, path):
    if not isinstance(instance, (list, tuple)) or not isinstance(schema.get("items"), list):
        return []  # without the tuple form of items, additionalItems means nothing
    start = len(schema["items"])
    return [error for index in range(start, len(instance))
            for error in validator.errors(instance[index], additional, path + (index,))]


def _min_items(validator, instance, bound, schema, path):
    _count("minItems", bound)
    if isinstance(instance, (list, tuple)) and len(instance) < bound:
        return [f"{pointer(path)}: {len(instance)} items, fewer than {bound}"]
    return []


def _max_items(validator, instance, bound, schema, path):
    _count("maxItems", bound)
    if isinstance(instance, (list, tuple)) and len(instance) > bound:
        return [f"{pointer(path)}: {len(instance)} items, more than {bound}"]
    return []


def _unique_items(validator, instance, unique, schema, path):
    if unique is not True or not isinstance(instance, (list, tuple)):
        return []
    for later in range(len(instance)):
        for earlier in range(later):
            if json_equal(instance[earlier], instance[later]):
                return [f"{pointer(path)}: items {earlier} and {later} are equal "
                        f"({_show(instance[later])}), and uniqueItems is true"]
    return []


def _contains(validator, instance, contained, schema, path):
    if not isinstance(instance, (list, tuple)):
        return []
    matches = sum(1 for index, item in enumerate(instance)
                  if validator.valid(item, contained, path + (index,)))
    least = _count("minContains", schema.get("minContains", 1))
    most = schema.get("maxContains")
    if matches < least:
        return [f"{pointer(path)}: {matches} items match contains, fewer than {least}"]
    if most is not None and matches > _count("maxContains", most):
        return [f"{pointer(path)}: {matches} items match contains, more than {most}"]
    return []


def _names(keyword, value):
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise SchemaError(f"{keyword} {_show(value)} is not a list of property names")
    return value


def _required(validator, instance, names, schema, path):
    _names("required", names)
    if not isinstance(instance, dict):
        return []
    return [f"{pointer(path)}: required property {name!r} is missing"
            for name in names if name not in instance]


def _mapping(keyword, value):
    if not isinstance(value, dict):
        raise SchemaError(f"{keyword} {_show(value)} is not an object")
    return value


def _properties(validator, instance, properties, schema, path):
    _mapping("properties", properties)
    if not isinstance(instance, dict):
        return []
    return [error for name, sub in properties.items() if name in instance
            for error in validator.errors(instance[name], sub, path + (name,))]


def _pattern_properties(validator, instance, patterns, schema, path):
    if not isinstance(instance, dict):
        return []
    return [error for pattern, sub in _mapping("patternProperties", patterns).items()
            for name in instance if _compiled(pattern, "patternProperties").search(name)
            for error in validator.errors(instance[name], sub, path + (name,))]


def _additional_properties(validator, instance, additional, schema, path):
    if not isinstance(instance, dict):
        return []
    declared = _mapping("properties", schema.get("properties") or {})
    patterns = [_compiled(pattern, "patternProperties")
                for pattern in _mapping("patternProperties", schema.get("patternProperties") or {})]
    extra = [name for name in instance
             if name not in declared and not any(pattern.search(name) for pattern in patterns)]
    if additional is False:
        return [f"{pointer(path + (name,))}: property {name!r} is not allowed "
                "(additionalProperties is false)" for name in extra]
    return [error for name in extra
            for error in validator.errors(instance[name], additional, path + (name,))]


def _property_names(validator, instance, names_schema, schema, path):
    if not isinstance(instance, dict):
        return []
    return [error for name in instance
            for error in validator.errors(name, names_schema, path + (name,))]


def _min_properties(validator, instance, bound, schema, path):
    _count("minProperties", bound)
    if isinstance(instance, dict) and len(instance) < bound:
        return [f"{pointer(path)}: {len(instance)} properties, fewer than {bound}"]
    return []


def _max_properties(validator, instance, bound, schema, path):
    _count("maxProperties", bound)
    if isinstance(instance, dict) and len(instance) > bound:
        return [f"{pointer(path)}: {len(instance)} properties, more than {bound}"]
    return []


def _dependent_required(validator, instance, dependencies, schema, path):
    if not isinstance(instance, dict):
        return []
    return [f"{pointer(path)}: property {name!r} is required when {trigger!r} is present"
            for trigger, names in _mapping("dependentRequired", dependencies).items()
            if trigger in instance
            for name in _names("dependentRequired", names) if name not in instance]


def _dependent_schemas(validator, instance, dependencies, schema, path):
    if not isinstance(instance, dict):
        return []
    return [error for trigger, sub in _mapping("dependentSchemas", dependencies).items()
            if trigger in instance for error in validator.errors(instance, sub, path)]


def _dependencies(validator, instance, dependencies, schema, path):
    """Draft 7: a list of names is dependentRequired, a schema is dependentSchemas."""
    if not isinstance(instance, dict):
        return []
    found = []
    for trigger, dependency in _mapping("dependencies", dependencies).items():
        if isinstance(dependency, list):
            found += _dependent_required(validator, instance, {trigger: dependency}, schema, path)
        else:
            found += _dependent_schemas(validator, instance, {trigger: dependency}, schema, path)
    return found


def _all_of(validator, instance, schemas, schema, path):
    return [error for sub in _schemas("allOf", schemas)
            for error in validator.errors(instance, sub, path)]


def _branch_errors(validator, instance, schemas, path):
    return "; ".join(f"{index}: {validator.first_error(instance, sub, path)}"
                     for index, sub in enumerate(schemas))


def _any_of(validator, instance, schemas, schema, path):
    if any(validator.valid(instance, sub, path) for sub in _schemas("anyOf", schemas)):
        return []
    return [f"{pointer(path)}: {_show(instance)} matches none of anyOf "
            f"({_branch_errors(validator, instance, schemas, path)})"]


def _one_of(validator, instance, schemas, schema, path):
    matching = [index for index, sub in enumerate(_schemas("oneOf", schemas))
                if validator.valid(instance, sub, path)]
    if len(matching) == 1:
        return []
    if not matching:
        return [f"{pointer(path)}: {_show(instance)} matches none of oneOf "
                f"({_branch_errors(validator, instance, schemas, path)})"]
    return [f"{pointer(path)}: {_show(instance)} matches oneOf {matching}, not exactly one"]


def _not(validator, instance, negated, schema, path):
    if validator.valid(instance, negated, path):
        return [f"{pointer(path)}: {_show(instance)} matches the schema under not"]
    return []


def _if(validator, instance, condition, schema, path):
    branch = "then" if validator.valid(instance, condition, path) else "else"
    return validator.errors(instance, schema[branch], path) if branch in schema else []


KEYWORDS = (
    ("$ref", _ref),
    ("type", _type),
    ("enum", _enum),
    ("const", _const),
    ("multipleOf", _multiple_of),
    ("minimum", _minimum),
    ("maximum", _maximum),
    ("exclusiveMinimum", _exclusive_minimum),
    ("exclusiveMaximum", _exclusive_maximum),
    ("minLength", _min_length),
    ("maxLength", _max_length),
    ("pattern", _pattern),
    ("prefixItems", _prefix_items),
    ("items", _items),
    ("additionalItems", _additional_items),
    ("minItems", _min_items),
    ("maxItems", _max_items),
    ("uniqueItems", _unique_items),
    ("contains", _contains),
    ("required", _required),
    ("properties", _properties),
    ("patternProperties", _pattern_properties),
    ("additionalProperties", _additional_properties),
    ("propertyNames", _property_names),
    ("minProperties", _min_properties),
    ("maxProperties", _max_properties),
    ("dependentRequired", _dependent_required),
    ("dependentSchemas", _dependent_schemas),
    ("dependencies", _dependencies),
    ("allOf", _all_of),
    ("anyOf", _any_of),
    ("oneOf", _one_of),
    ("not", _not),
    ("if", _if),
)
