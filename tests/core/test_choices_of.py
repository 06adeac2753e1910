"""`choices_of` reads back exactly what `choice_schema` writes: the choices of an object
schema whose one property, `choice`, is required and a non-empty enum of text."""

from __future__ import annotations

import pytest

from lowtide.core.native_schema import choice_schema, choices_of


class Text(str):
    pass


def test_a_choice_schema_gives_its_choices():
    assert choices_of(choice_schema(["a", "b"])) == ["a", "b"]
    assert choices_of(choice_schema([Text("a")])) == ["a"]  # text of a str subclass is text


def _with(enum=("a",), **changes):
    return choice_schema(list(enum)) | changes


@pytest.mark.parametrize("schema", [
    None, "x", {}, _with(type="array"), _with(required=["other"]), _with(required=("choice",)),
    _with(properties={"choice": {"enum": ["a"]}, "other": {}}), _with(properties={"other": {"enum": ["a"]}}),
    _with(properties={"choice": ["a"]}), _with(properties={"choice": {"enum": []}}),
    _with(properties={"choice": {"enum": ("a",)}}), _with(properties={"choice": {"enum": ["a", 1]}}),
    _with(properties={"choice": {"enum": ["a", None]}}), _with(properties={"choice": {"enum": [b"a"]}}),
])  # fmt: skip
def test_any_other_shape_gives_none(schema):
    assert choices_of(schema) is None
