"""The message batch splitter: items come out whole and in order however the bytes are cut
(inside strings, escapes, brackets in text), and a body of the wrong shape is named."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.server.jsonstream import MAX_SPACE, ArraySplitter, StreamError

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


# Nothing but JSON is held (issue 34, N6): 400 MB of NULs were held up to the 256 MiB limit,
# and a batch behind 100 MB of spaces was taken. Each of these is refused in the chunk that
# brings the bytes, with far less than them held.
CHUNK = 64 * 1024
OPEN_ITEM = b'{"requests": [{"custom_id": "a", "params":'


@pytest.mark.parametrize(("before", "filler", "said", "param"), [
    (b"", b"\x00", "unexpected byte 0x00 at byte 0", None),
    (b'{"requests": [{"custom_id": "a", "params": {}}', b"\x00", "unexpected byte 0x00 at byte 46", None),
    (b'{"requests": ', b"\x00", "requests: Input should be a valid list", "requests"),
    (b'{"requests": [', b"\x00", "requests.0: Input should be an object", "requests.0"),
    (OPEN_ITEM, b"\x00", f"unexpected byte 0x00 at byte {len(OPEN_ITEM)}", "requests.0"),
    (OPEN_ITEM + b'"', b"\x00", "a raw control character (byte 0x00) in the string", None),
    (b'{"requests": [{"custom_id": "', b"\x1f", "a raw control character (byte 0x1f) in the string", None),
    (b'{"requests"', b" ", "more than 65,536 bytes of whitespace in a row at byte 11", None),
    (b"", b"\n", "more than 65,536 bytes of whitespace in a row at byte 0", None),
    (OPEN_ITEM, b"\t", f"more than 65,536 bytes of whitespace in a row at byte {len(OPEN_ITEM)}", "requests.0"),
    (OPEN_ITEM, b"z", "unexpected 'z'", "requests.0"),
])  # fmt: skip
def test_bytes_that_are_not_json_are_refused_as_they_arrive(before, filler, said, param):
    splitter = ArraySplitter("requests", 64)
    splitter.feed(before)
    with pytest.raises(StreamError) as caught:
        for _ in range(4096):  # 256 MiB, the body limit, if it were all taken
            splitter.feed(filler * CHUNK)
            assert len(splitter._buf) <= 2 * CHUNK + len(before)  # never more than this is held
    assert said in caught.value.message and caught.value.param == param, caught.value.message


@pytest.mark.parametrize("space", [b" ", b"\r\n", b"\t "])
def test_whitespace_up_to_the_bound_between_and_inside_items_is_taken(space):
    pad = space * (MAX_SPACE // len(space))
    raw = b"{" + pad + b'"requests"' + pad + b":" + pad + b"[" + pad + b'{"custom_id":' + pad + b'"a", "p": [1,' + pad + b"2]}" + pad + b"]" + pad + b"}" + pad
    for cut in (1000, 65536, len(raw)):
        out = _split(raw, list(range(0, len(raw), cut)))
        assert [json.loads(item) for _, item in out] == [{"custom_id": "a", "p": [1, 2]}]


def test_a_string_cut_after_its_backslash_is_finished_by_the_next_chunk():
    raw = b'{"requests": [{"custom_id": "a\\"b", "p": "\\\\"}]}'
    for cut in range(1, len(raw)):
        assert json.loads(_split(raw, [cut])[0][1]) == {"custom_id": 'a"b', "p": "\\"}
