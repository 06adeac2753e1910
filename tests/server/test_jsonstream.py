"""The message batch splitter: items come out whole and in order however the bytes are cut
(inside strings, escapes, brackets in text), and a body of the wrong shape is named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.server.jsonstream import ArraySplitter, StreamError

ITEMS = [{"custom_id": f"r{i}", "params": {"text": 'a"]}[{\\' * i + "é\u2028", "n": [1, {"b": [2, None]}], "e": {}}}
         for i in range(30)]  # fmt: skip
RAW = json.dumps({"requests": ITEMS}, ensure_ascii=False).encode()


def _split(raw: bytes, cuts: list[int]) -> list[tuple[int, bytes]]:
    splitter, out, last = ArraySplitter("requests", 64), [], 0
    for cut in [*sorted(cuts), len(raw)]:
        out += splitter.feed(raw[last:cut])
        last = cut
    splitter.close()
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(RAW)), max_size=40))
def test_items_come_out_whole_wherever_the_bytes_are_cut(cuts):
    out = _split(RAW, cuts)
    assert [i for i, _ in out] == list(range(len(ITEMS)))
    assert [json.loads(raw) for _, raw in out] == ITEMS


def test_one_byte_at_a_time():
    assert [json.loads(raw) for _, raw in _split(RAW, list(range(len(RAW))))] == ITEMS


@pytest.mark.parametrize(("raw", "said", "param"), [
    (b'{"requests": []}', "at least 1 item", "requests"),
    (b"{}", "requests: Field required", "requests"),
    (b'{"x": 1, "requests": [{}]}', "x: Extra inputs are not permitted", "x"),
    (b'{"requests": [{}, 2]}', "requests.1: Input should be an object", "requests.1"),
    (b'{"requests": {}}', "requests: Input should be a valid list", "requests"),
    (b'{"requests": [{}], "requests": [{}]}', "given twice", "requests"),
    (b'{"requests": [{}],}', "not valid JSON", None),
    (b'{"requests": [{}]} trailing', "not valid JSON", None),
    (b'{"requests": [{}]', "ended early", None),
    (b'{"requests": [{"a": "open', "ended early", None),
    (b'{"requests": [{}, {"a":' + b"[" * 100_000, "requests.1: nested deeper than 64 levels", "requests.1"),
])  # fmt: skip
def test_a_body_of_the_wrong_shape_is_named(raw, said, param):
    with pytest.raises(StreamError) as caught:
        _split(raw, [len(raw) // 3])
    assert said in caught.value.message and caught.value.param == param
