"""What the probes and the quality set rely on from the JSON Schema checks (jsonschema does the
checking): every error of an instance, each led by the JSON pointer of its place; a schema that
cannot be applied refused as the schema's fault, naming why; the draft a schema names; JSON
equality that tells booleans from numbers."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._schema_errors import (
    SchemaError,
    check_schema,
    json_equal,
    pointer,
    schema_errors,
)

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"]}


def test_a_valid_instance_has_no_error_and_an_invalid_one_has_each_of_its_errors():
    assert schema_errors({"city": "Oslo", "population": 709037}, CITY) == []
    assert schema_errors({"city": 1, "population": 2.5}, CITY) == [
        "#/city: 1 is not of type 'string'",
        "#/population: 2.5 is not of type 'integer'",
    ]
    assert schema_errors({"population": 3}, CITY) == ["#: 'city' is a required property"]


def test_errors_name_their_place_by_json_pointer_with_slash_and_tilde_escaped():
    assert pointer(("a/b", "c~d", 0)) == "#/a~1b/c~0d/0"
    tree = {"$defs": {"node": {"type": "object", "required": ["value"],
                               "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    assert schema_errors({"value": 1, "children": [{"value": 2}, {"value": 3, "children": [{}]}]}, tree) == [
        "#/children/1/children/0: 'value' is a required property"]
    assert schema_errors({"a/b": {"c": 1}}, {"properties": {"a/b": {"properties": {"c": {"type": "string"}}}}}) == [
        "#/a~1b/c: 1 is not of type 'string'"]


@pytest.mark.parametrize("schema, message", [
    ({"type": "text"}, "#/type: 'text' is not valid under any of the given schemas"),
    ({"properties": {"a": {"minLength": "2"}}}, "#/properties/a/minLength: '2' is not of type 'integer'"),
    ({"pattern": "("}, "#/pattern: '(' is not a 'regex'"),
    ("a string", "#: 'a string' is not a schema (an object or a boolean)"),
], ids=["type", "nested", "pattern", "not-a-schema"])
def test_a_schema_its_draft_refuses_is_the_schemas_fault_named_by_its_place(schema, message):
    with pytest.raises(SchemaError) as refusal:
        check_schema(schema)
    assert str(refusal.value) == message
    with pytest.raises(SchemaError):
        schema_errors({}, schema)


@pytest.mark.parametrize("schema, message", [
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "does not resolve within the schema"),
    ({"properties": {"a": {"$ref": "other.json#/a"}}}, "'other.json#/a' does not resolve within the schema"),
    ({"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}},
     "loops without descending"),
], ids=["missing", "elsewhere", "loop"])
def test_a_ref_that_cannot_be_followed_is_the_schemas_fault(schema, message):
    check_schema(schema)  # the meta-schema cannot tell: only following the $ref does
    assert schema_errors({"b": 1}, schema) == []  # a value the $ref is not about
    with pytest.raises(SchemaError, match=message):
        schema_errors({"a": "x"}, schema)


def test_a_recursive_ref_that_descends_into_the_value_is_no_loop():
    schema = {"type": "array", "items": {"$ref": "#"}}
    assert schema_errors([[[]], []], schema) == []
    assert schema_errors([[1]], schema) == ["#/0/0: 1 is not of type 'array'"]


def test_a_schema_is_checked_by_the_draft_it_names_else_2020_12():
    tuple_items = {"items": [{"type": "string"}], "additionalItems": False}
    with pytest.raises(SchemaError, match="#/items: "):
        check_schema(tuple_items)  # draft 2020-12 spells this prefixItems
    draft_7 = {"$schema": "http://json-schema.org/draft-07/schema#", **tuple_items}
    assert schema_errors(["a"], draft_7) == []
    assert schema_errors(["a", 1], draft_7) == ["#: Additional items are not allowed (1 was unexpected)"]


def test_formats_and_unknown_keywords_are_annotations():
    assert schema_errors("not an email", {"type": "string", "format": "email", "x-vendor": {"type": 1}}) == []
    assert schema_errors(1, True) == [] and schema_errors(1, {}) == []
    assert schema_errors(1, False) == ["#: False schema does not allow 1"]


def test_json_equality_tells_booleans_from_numbers():
    assert json_equal(1, 1.0) and json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})
    assert not json_equal(True, 1) and not json_equal(0, False) and not json_equal("1", 1)
    assert not json_equal({"a": 1}, {"a": 1, "b": 2}) and not json_equal([1], [1, 1])
