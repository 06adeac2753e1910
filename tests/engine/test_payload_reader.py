"""`dispatch.PayloadReader` reads a page's stored payloads as `fastjson.loads` reads each one
whole: the same values, the same key order and types, the same error for a payload that is
no JSON; over generated pages near and across the edge of a shared head (the loader's own
texts, other spacing, a key twice, a part that is not one value, another head, NaN, long
digit runs, lone surrogates, deep nesting, a head that ends in a number or a string)."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowtide.core import fastjson
from lowtide.engine.dispatch import OWN_BRACKETS, PayloadReader

TEXT = st.text(st.characters(codec="utf-8"), max_size=20)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), TEXT)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)
TURNS = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": TEXT}), min_size=1, max_size=3)
# The loader's head: `{"endpoint":…,"lowtide":…, "body": {…base…, "messages": ` (engine/loader.py).
HEADS = st.builds(
    lambda base, own: fastjson.dumps({"endpoint": "/v1/chat/completions"} | ({"lowtide": own} if own else {}))[:-1]
    + ', "body": ' + fastjson.dumps({"model": "m"} | base)[:-1] + ', "messages": ',
    st.dictionaries(st.sampled_from(["response_format", "temperature", "messages", "model", "stop"]), VALUE, max_size=3),
    st.one_of(st.none(), st.fixed_dictionaries({"choices": st.lists(TEXT, min_size=1, max_size=3)})),
)  # fmt: skip
ODD_HEADS = st.sampled_from([
    '{"endpoint": "e", "body": {"model": "m", "messages": ',  # other spacing
    '{"endpoint":"e","body":{"messages":',
    '{"body": {"a": 1}, "body": {"model": "m", "messages": ',  # a key twice
    '{"endpoint": "e", "body": {"messages": 5, "model": "m", "messages": ',  # the last key read is not the last written
    '{"endpoint": "e", "body": {"model": "m", "n": -',  # a number's sign
    '{"endpoint": "e", "body": {"model": "m", "n": 1',  # a number's digits
    '{"endpoint": "e", "body": {"model": "m", "t": "a:',  # in a string
    '{"endpoint": "e", "body": {"model": "m", "x": [',  # not an object's member
    '{"endpoint": NaN, "body": {"model": 12345678901234567890123, "messages": ',
    '{"endpoint": "\\ud800", "body": {"messages": ',
    '\ufeff{"endpoint": "e", "body": {"messages": ',
    '[{"body": {"messages": ',
    '{"endpoint": "e", "body": {"model": "m"}, "messages": ',
])  # fmt: skip
OWN = st.one_of(
    TURNS.map(fastjson.dumps),
    VALUE.map(fastjson.dumps),
    st.sampled_from(['[{"role": "user", "content": "hi"}]', ' [] ', '1, "extra": 2', '1}, "b": {"c": 2', '', 'NaN', '-Infinity',
                     '12345678901234567890', '"\\ud800"', '[1,]', '{"a": 1, "a": 2}', '0.1e400', '"m"',
                     "[" * (OWN_BRACKETS - 1) + "]" * (OWN_BRACKETS - 1), "[" * 1023 + "]" * 1023, "[" * 1024 + "]" * 1024]),
)  # fmt: skip
TAILS = st.sampled_from(["}}", "}}", "}}", "} }", "}}}", "}", "}}\n"])


@st.composite
def pages(draw):
    heads = draw(st.lists(st.one_of(HEADS, HEADS, ODD_HEADS), min_size=1, max_size=2))
    n = draw(st.integers(1, 6))
    return [draw(st.sampled_from(heads)) + draw(OWN) + draw(TAILS) for _ in range(n)]


def _read(read, text):
    try:
        return "ok", repr(read(text))  # repr: key order, 1 from 1.0 from True, NaN
    except Exception as err:  # noqa: BLE001
        return "raised", type(err).__name__, str(err)


@settings(max_examples=1500, deadline=None)
@given(page=pages())
def test_a_page_is_read_as_each_payload_read_whole(page):
    reader = PayloadReader()
    assert [_read(reader.read, t) for t in page] == [_read(fastjson.loads, t) for t in page]
    event("head learnt" if reader.head is not None else "read whole")


def test_rows_share_the_head_but_each_has_its_own_payload_and_body():
    head = '{"endpoint":"/v1/chat/completions","lowtide":{"choices":["a","b"]}, "body": {"model":"m","response_format":{"type":"json_object"}, "messages": '
    reader = PayloadReader()
    rows = [reader.read(head + fastjson.dumps([{"role": "user", "content": str(i)}]) + "}}") for i in range(3)]
    assert reader.head == head
    assert [r["body"]["messages"][0]["content"] for r in rows] == ["0", "1", "2"]
    assert list(rows[2]) == ["endpoint", "lowtide", "body"] and list(rows[2]["body"]) == ["model", "response_format", "messages"]
    rows[1]["body"]["model"] = "other"  # as a fallback lane sets it
    assert rows[2]["body"]["model"] == "m" and rows[1] is not rows[2] and rows[1]["body"] is not rows[2]["body"]


@pytest.mark.parametrize("depth", [OWN_BRACKETS - 1, OWN_BRACKETS, 1022, 1023, 1024, 1025])
def test_a_part_nested_near_the_readers_limits_is_read_as_the_whole_payload_is(depth):
    """Read apart, a part nests two levels less deep than in its payload: near orjson's limit
    (1,024) one would be read and the other refused, so a part with many brackets is read whole."""
    head = '{"endpoint": "e", "body": {"model": "m", "messages": '
    reader = PayloadReader()
    reader.read(head + "[]}}")
    assert reader.head == head
    text = head + "[" * depth + "]" * depth + "}}"
    assert _read(reader.read, text) == _read(fastjson.loads, text)


def test_a_head_whose_last_key_read_is_not_its_last_written_is_not_learnt():
    """`messages` twice: the body's last key read is `model`, whose value the text also ends
    with; taken for the part's place, the next row's messages would land on `model`."""
    head = '{"endpoint": "e", "body": {"messages": 5, "model": "m", "messages": '
    page = [head + '"m"}}', head + '[{"role": "user", "content": "hi"}]}}']
    reader = PayloadReader()
    assert [_read(reader.read, t) for t in page] == [_read(fastjson.loads, t) for t in page]
    assert reader.head is None
