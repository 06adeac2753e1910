"""fastjson reads what `json` reads, to the same values, and writes what `json` writes
(up to spacing), falling back to `json` wherever orjson refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.core import fastjson

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_a_round_trip_gives_what_json_gives(value):
    assert fastjson.loads(fastjson.dumps(value)) == json.loads(json.dumps(value))
    assert fastjson.loads(fastjson.dumpb(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize(
    "text",
    ['{"a": NaN}', "[123456789012345678901234567890]", '"\\udc80"', '{"a": 1, "a": 2}', "[Infinity]"],
)
def test_what_orjson_refuses_is_read_by_json(text):
    assert repr(fastjson.loads(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["{", '{"a": }', "", "[1,]"])
def test_bad_json_raises_the_standard_error_with_its_position(text):
    with pytest.raises(json.JSONDecodeError) as caught:
        fastjson.loads(text)
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    assert (caught.value.msg, caught.value.colno) == (expected.value.msg, expected.value.colno)


@pytest.mark.parametrize("value", [2**70, {1: "a"}, "lone \udc80 surrogate"])
def test_what_orjson_cannot_write_is_written_by_json(value):
    assert fastjson.dumps(value) == json.dumps(value, ensure_ascii=False)


def test_non_ascii_is_kept_and_spacing_is_compact():
    assert fastjson.dumps({"é": ["ü", 1]}) == '{"é":["ü",1]}'
    assert fastjson.dumpb({"é": 1}) == '{"é":1}'.encode()


def test_nan_and_infinity_are_written_as_null_not_as_tokens_that_are_not_json():
    assert fastjson.dumps([float("nan"), float("inf")]) == "[null,null]"
