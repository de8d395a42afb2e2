# Copyright: biv100.serving maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""JSON Schema checks of the probes' expectations and the quality set's json_schema scorer, by the
jsonschema package (a pinned controller requirement, in the execution environment too).

    check_schema(schema)              raises SchemaError when no instance could be checked with it
    schema_errors(instance, schema)   what makes the instance invalid; empty when it is valid
    json_equal(first, second)         JSON equality, as the schema keyword `const` has it

A schema is checked against the draft its `$schema` names, else draft 2020-12; `format` is an
annotation, as the specification has it by default. Each error starts with the JSON pointer
(RFC 6901) of the failing value after "#" ("#" is the instance itself, "#/items/0/name" a member
of an element), then jsonschema's own words. A schema that cannot be applied raises SchemaError,
naming the place in the schema: a fault of the schema, not of the instance. That is a schema the
draft's meta-schema refuses, a `$ref` that does not resolve (only refs inside the schema do:
nothing is fetched), or one that loops without descending into the instance.

Without jsonschema the plugins still load; a check raises SchemaError naming the package.
"""

from __future__ import annotations

try:
    from jsonschema.exceptions import SchemaError as MetaSchemaRefusal
    from jsonschema.validators import Draft202012Validator, validator_for
    from referencing.exceptions import Unresolvable
except ImportError as error:
    JSONSCHEMA_IMPORT_ERROR: ImportError | None = error
else:
    JSONSCHEMA_IMPORT_ERROR = None


class SchemaError(ValueError):
    """A schema that cannot be applied to any instance."""


def pointer(path) -> str:
    """The JSON pointer of a path of keys and indexes, after "#"."""
    return "#" + "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _validator(schema):
    """A validator of the schema's draft for the schema, once the draft's meta-schema accepts it."""
    if JSONSCHEMA_IMPORT_ERROR is not None:
        raise SchemaError("JSON Schema checks need the jsonschema Python package on the controller "
                          f"(requirements.txt): {JSONSCHEMA_IMPORT_ERROR}")
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"{pointer(())}: {schema!r} is not a schema (an object or a boolean)")
    draft = validator_for(schema, default=Draft202012Validator)
    try:
        draft.check_schema(schema)
    except MetaSchemaRefusal as refusal:
        raise SchemaError(f"{pointer(refusal.path)}: {refusal.message}") from None
    return draft(schema)


def check_schema(schema) -> None:
    """Refuse a schema that its draft's meta-schema refuses, naming the place in the schema."""
    _validator(schema)


def schema_errors(instance, schema) -> list[str]:
    """What makes the instance invalid against the schema, in the schema's order; empty when valid."""
    validator = _validator(schema)
    try:
        return [f"{pointer(error.absolute_path)}: {error.message}" for error in validator.iter_errors(instance)]
    except Unresolvable as error:
        raise SchemaError(f"$ref {getattr(error, 'ref', '')!r} does not resolve within the schema") from None
    except RecursionError:
        raise SchemaError("a $ref loops without descending into the instance") from None


def json_equal(first, second) -> bool:
    """Whether two JSON values are equal: numbers by value (1 equals 1.0), booleans apart from
    numbers (true is not 1), objects and arrays member by member."""
    return not schema_errors(first, {"const": second})
