"""JSON Schema validation without a dependency: every keyword passes what it allows and names
the JSON pointer of what it refuses; a schema that cannot be applied raises."""

from __future__ import annotations

import pytest

from ansible_collections.biv100.serving.plugins.plugin_utils._json_schema import (
    SchemaError,
    json_equal,
    pointer,
    schema_errors,
)

# (schema, a valid instance, an invalid instance, the start of the first error for it)
KEYWORDS = {
    "type": ({"type": "string"}, "a", 1, "#: 1 is integer, not string"),
    "type-list": ({"type": ["string", "null"]}, None, 1.5, "#: 1.5 is number, not string or null"),
    "type-integer-float": ({"type": "integer"}, 3.0, 3.5, "#: 3.5 is number, not integer"),
    "type-integer-not-bool": ({"type": "integer"}, -7, True, "#: true is boolean, not integer"),
    "type-number-not-bool": ({"type": "number"}, 0.5, False, "#: false is boolean, not number"),
    "type-boolean": ({"type": "boolean"}, False, 0, "#: 0 is integer, not boolean"),
    "type-object": ({"type": "object"}, {}, [], "#: [] is array, not object"),
    "type-array": ({"type": "array"}, [], {}, "#: {} is object, not array"),
    "type-null": ({"type": "null"}, None, "", "#: \"\" is string, not null"),
    "enum": ({"enum": ["a", 1, None]}, 1.0, "b", '#: "b" is none of ["a", 1, null]'),
    "enum-bool-is-not-1": ({"enum": [1]}, 1, True, "#: true is none of [1]"),
    "const": ({"const": {"a": [1]}}, {"a": [1.0]}, {"a": [2]}, '#: {"a": [2]} is not the constant'),
    "minimum": ({"minimum": 2}, 2, 1.5, "#: 1.5 is not at least 2"),
    "maximum": ({"maximum": 2}, 2, 3, "#: 3 is not at most 2"),
    "exclusiveMinimum": ({"exclusiveMinimum": 2}, 2.1, 2, "#: 2 is not above 2"),
    "exclusiveMaximum": ({"exclusiveMaximum": 2}, 1.9, 2, "#: 2 is not below 2"),
    "exclusiveMinimum-draft4": ({"minimum": 2, "exclusiveMinimum": True}, 3, 2,
                                "#: 2 is not above 2"),
    "exclusiveMaximum-draft4": ({"maximum": 2, "exclusiveMaximum": True}, 1, 2,
                                "#: 2 is not below 2"),
    "multipleOf": ({"multipleOf": 3}, 9, 10, "#: 10 is not a multiple of 3"),
    "multipleOf-decimal": ({"multipleOf": 0.1}, 0.3, 0.35, "#: 0.35 is not a multiple of 0.1"),
    "minLength": ({"minLength": 2}, "ab", "a", '#: "a" is shorter than 2 characters'),
    "maxLength": ({"maxLength": 2}, "长城", "长城长", '#: "长城长" is longer than 2 characters'),
    "pattern": ({"pattern": "^[a-z]+$"}, "abc", "aBc", "#: \"aBc\" does not match '^[a-z]+$'"),
    "pattern-is-a-search": ({"pattern": "b"}, "abc", "xyz", "#: \"xyz\" does not match 'b'"),
    "items": ({"items": {"type": "integer"}}, [1, 2], [1, "x"], '#/1: "x" is string, not integer'),
    "prefixItems": ({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
                    ["a", 1], ["a", "b"], '#/1: "b" is string, not integer'),
    "items-tuple-draft7": ({"items": [{"type": "string"}], "additionalItems": False},
                           ["a"], ["a", 1], "#/1: no value is allowed here"),
    "minItems": ({"minItems": 2}, [1, 2], [1], "#: 1 items, fewer than 2"),
    "maxItems": ({"maxItems": 1}, [1], [1, 2], "#: 2 items, more than 1"),
    "uniqueItems": ({"uniqueItems": True}, [1, True, "1"], [{"a": 1}, {"a": 1.0}],
                    "#: items 0 and 1 are equal"),
    "contains": ({"contains": {"type": "string"}}, [1, "a"], [1, 2],
                 "#: 0 items match contains, fewer than 1"),
    "maxContains": ({"contains": {"const": 1}, "maxContains": 1}, [1, 2], [1, 1],
                    "#: 2 items match contains, more than 1"),
    "required": ({"required": ["a", "b"]}, {"a": 1, "b": None}, {"a": 1},
                 "#: required property 'b' is missing"),
    "properties": ({"properties": {"a": {"type": "string"}}}, {"a": "x", "b": 1}, {"a": 1},
                   "#/a: 1 is integer, not string"),
    "additionalProperties-false": (
        {"properties": {"a": {}}, "patternProperties": {"^x-": {}}, "additionalProperties": False},
        {"a": 1, "x-b": 2}, {"a": 1, "b": 2},
        "#/b: property 'b' is not allowed (additionalProperties is false)"),
    "additionalProperties-schema": ({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
                                    {"a": "x", "b": 2}, {"b": "y"}, '#/b: "y" is string, not integer'),
    "patternProperties": ({"patternProperties": {"^n_": {"type": "number"}}}, {"n_a": 1, "s": "x"},
                          {"n_a": "1"}, '#/n_a: "1" is string, not number'),
    "propertyNames": ({"propertyNames": {"maxLength": 3}}, {"abc": 1}, {"abcd": 1},
                      '#/abcd: "abcd" is longer than 3 characters'),
    "minProperties": ({"minProperties": 1}, {"a": 1}, {}, "#: 0 properties, fewer than 1"),
    "maxProperties": ({"maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2},
                      "#: 2 properties, more than 1"),
    "dependentRequired": ({"dependentRequired": {"a": ["b"]}}, {"c": 1}, {"a": 1},
                          "#: property 'b' is required when 'a' is present"),
    "dependencies-draft7": ({"dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
                            {"a": 1, "b": 2}, {"c": 1}, "#: required property 'd' is missing"),
    "allOf": ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, 3, 2, "#: 2 is not at least 3"),
    "anyOf": ({"anyOf": [{"type": "string"}, {"maximum": 1}]}, 0, 5,
              "#: 5 matches none of anyOf (0: #: 5 is integer, not string; 1: #: 5 is not at most 1)"),
    "oneOf-none": ({"oneOf": [{"type": "string"}, {"type": "null"}]}, None, 1,
                   "#: 1 matches none of oneOf"),
    "oneOf-two": ({"oneOf": [{"type": "integer"}, {"minimum": 0}]}, -1, 1,
                  "#: 1 matches oneOf [0, 1], not exactly one"),
    "not": ({"not": {"type": "null"}}, 0, None, "#: null matches the schema under not"),
    "if-then": ({"if": {"minimum": 10}, "then": {"multipleOf": 10}, "else": {"maximum": 5}},
                20, 15, "#: 15 is not a multiple of 10"),
    "if-else": ({"if": {"minimum": 10}, "then": {"multipleOf": 10}, "else": {"maximum": 5}},
                4, 7, "#: 7 is not at most 5"),
    "ref-defs": ({"$defs": {"name": {"type": "string"}}, "properties": {"n": {"$ref": "#/$defs/name"}}},
                 {"n": "a"}, {"n": 1}, "#/n: 1 is integer, not string"),
    "ref-definitions": ({"definitions": {"n": {"minimum": 0}}, "items": {"$ref": "#/definitions/n"}},
                        [0, 1], [0, -1], "#/1: -1 is not at least 0"),
    "false-schema": ({"properties": {"a": False}}, {"b": 1}, {"a": 1},
                     "#/a: no value is allowed here (the schema is false)"),
}


@pytest.mark.parametrize("keyword", sorted(KEYWORDS))
def test_each_keyword_passes_what_it_allows_and_names_the_place_of_what_it_refuses(keyword):
    schema, valid, invalid, error = KEYWORDS[keyword]

    assert schema_errors(valid, schema) == []
    errors = schema_errors(invalid, schema)
    assert errors and errors[0].startswith(error), errors


def test_keywords_of_other_types_leave_an_instance_alone():
    # minLength says nothing about numbers, minimum nothing about strings, and so on.
    schema = {"minLength": 5, "minimum": 5, "minItems": 5, "required": ["a"], "pattern": "x"}
    assert [schema_errors(value, schema) for value in (True, None, 1, "xxxxx", {"a": 1})] == \
        [[], [], ["#: 1 is not at least 5"], [], []]


def test_a_nested_failure_is_named_by_its_json_pointer():
    schema = {
        "$defs": {"node": {"type": "object", "required": ["value"],
                           "properties": {"children": {"type": "array",
                                                       "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node",
    }
    tree = {"value": 1, "children": [{"value": 2}, {"value": 3, "children": [{}]}]}

    assert schema_errors(tree, schema) == ["#/children/1/children/0: required property 'value' "
                                           "is missing"]


def test_every_error_of_an_instance_is_listed():
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}

    assert schema_errors({"city": 1, "population": 2.5, "x": None}, schema) == [
        "#/city: 1 is integer, not string",
        "#/population: 2.5 is number, not integer",
        "#/x: property 'x' is not allowed (additionalProperties is false)",
    ]
    assert schema_errors({"population": 3}, schema) == ["#: required property 'city' is missing"]


def test_pointers_escape_slash_and_tilde():
    assert pointer(("a/b", "c~d", 0)) == "#/a~1b/c~0d/0"
    assert schema_errors({"a/b": 1}, {"additionalProperties": False})[0].startswith("#/a~1b:")
    assert schema_errors({"x": {"a/b": 1}},
                         {"properties": {"x": {"$ref": "#/$defs/a~1b"}},
                          "$defs": {"a/b": {"additionalProperties": False}}}) \
        == ["#/x/a~1b: property 'a/b' is not allowed (additionalProperties is false)"]


def test_unknown_keywords_and_annotations_are_ignored():
    schema = {"title": "t", "description": "d", "format": "email", "x-vendor": {"type": 1},
              "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string"}
    assert schema_errors("not an email", schema) == []
    assert schema_errors(1, True) == [] and schema_errors(1, {}) == []


def test_json_equality_tells_booleans_from_numbers():
    assert json_equal(1, 1.0) and json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})
    assert not json_equal(True, 1) and not json_equal(0, False) and not json_equal("1", 1)
    assert not json_equal({"a": 1}, {"a": 1, "b": 2}) and not json_equal([1], [1, 1])


@pytest.mark.parametrize("schema, message", [
    ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ({"$ref": "other.json#/a"}, "is not a local JSON pointer"),
    ({"$ref": "#"}, "loops without descending"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
     "loops without descending"),
    ({"pattern": "("}, "is not a regular expression"),
    ({"type": "text"}, "is none of"),
    ({"required": "a"}, "is not a list of property names"),
    ({"minLength": "2"}, "is not a non-negative integer"),
    ({"multipleOf": 0}, "is not above 0"),
    ({"properties": {"a": 1}}, "is not a schema"),
    ("a string", "is not a schema"),
])
def test_a_schema_that_cannot_be_applied_raises(schema, message):
    with pytest.raises(SchemaError, match=message):
        schema_errors({"a": "x"}, schema)


def test_a_recursive_ref_that_descends_is_no_loop():
    schema = {"type": "array", "items": {"$ref": "#"}}
    assert schema_errors([[[]], []], schema) == []
    assert schema_errors([[1]], schema) == ["#/0/0: 1 is integer, not array"]
