"""An output line takes a kept chat or text completion as its text (`outputs._KEPT_HEADS`),
without reading it: the line is the one the general way writes (read the answer, name the
batch's model in it, write the line), byte for byte, for any answer ingest keeps and any
model or custom_id; text it cannot tell so (written by the standard library, another shape,
too deep to write) is read as before."""

from __future__ import annotations

import json
import math

from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, COMPLETIONS, RESPONSES
from lowtide.server.outputs import _KEPT_HEADS, _result, openai_line, results
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
ODD_TEXT = st.one_of(TEXT, st.sampled_from(['"', "\\", 'a"b\\"', "\n\t\x00\x1f", "é中😀", "\ud800", "1234567890123456789012"]))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), ODD_TEXT),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ODD_TEXT, inner, max_size=3),
    max_leaves=12,
)


def _deep(levels: int):
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


HEAD = st.fixed_dictionaries({
    "id": st.one_of(st.just("chatcmpl-echo1"), st.just("cmpl-x"), ODD_TEXT),
    "object": st.sampled_from(["chat.completion"] * 4 + ["text_completion"] * 2 + ["response", "chat.completion.chunk"]),
    "created": st.one_of(st.integers(-5, 2**40), st.integers(-5, 2**40), st.floats(0, 9), st.just(None)),
    "model": st.one_of(st.just("gpt-4o-mini"), ODD_TEXT, ODD_TEXT, JSON),
})  # fmt: skip
ANSWER = st.one_of(
    st.builds(lambda head, rest: head | rest, HEAD, st.dictionaries(ODD_TEXT, JSON, max_size=4)),
    st.builds(lambda head, rest: head | rest, HEAD, st.dictionaries(ODD_TEXT, JSON, max_size=4)),
    st.builds(lambda head, rest: head | rest, HEAD, st.dictionaries(ODD_TEXT, JSON, max_size=4)),
    st.builds(lambda head, rest: rest | head, HEAD, st.dictionaries(ODD_TEXT, JSON, max_size=2)),  # other keys first
    st.builds(lambda head, levels: head | {"choices": _deep(levels)}, HEAD, st.integers(245, 253)),
    st.builds(lambda head, model: head | {"model": model, "model ": 1}, HEAD, ODD_TEXT),
    st.builds(lambda head: {k: v for k, v in head.items() if k != "model"}, HEAD),
)
# Answers the head is told on (nearly): orjson writes them, the model is text.
WRITABLE = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), TEXT),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
CLEAN = st.builds(
    lambda kind, created, model, rest: {"id": "chatcmpl-echo1", "object": kind, "created": created, "model": model} | rest,
    st.sampled_from(["chat.completion"] * 4 + ["text_completion"]), st.integers(-(2**63), 2**64 - 1),
    st.one_of(st.just("gpt-4o-mini"), TEXT, st.sampled_from(['"', "\\", 'a"b\\"', "\n\t\x00\x1f", "é中😀"])),
    st.dictionaries(TEXT, WRITABLE, max_size=4),
)  # fmt: skip
MODEL = st.one_of(st.just("gpt-4o-mini"), ODD_TEXT, st.integers(-(2**70), 2**70), st.none(), st.just(math.nan))


def _stored(answer) -> str:
    """The text ingest keeps (engine/ingest.py: `fastjson.dumps(outcome.response)`); half the
    time the standard library's, as `fastjson` writes what orjson refuses."""
    return fastjson.dumps(answer)


def _row(custom_id: str, response: str | None) -> tuple:
    # (id, source_key, state, output, response, error_code, error_message, tokens x5)
    return (1, custom_id, "succeeded", "the text", response, None, None, 3, 0, 0, 7, 0)


@settings(max_examples=1500, deadline=None)
@given(clean=CLEAN, odd=ANSWER, pick=st.integers(0, 3), model=MODEL, custom_id=ODD_TEXT, endpoint=st.sampled_from([CHAT] * 4 + [COMPLETIONS, RESPONSES]),
       standard=st.sampled_from([False, False, False, True]))  # fmt: skip
def test_a_kept_answer_taken_as_text_writes_the_line_the_general_way_writes(clean, odd, pick, model, custom_id, endpoint, standard):
    answer = odd if pick == 0 else clean
    if not custom_id.startswith("~"):  # a key so written is base64 (translate.decode_key)
        stored = json.dumps(answer, ensure_ascii=False) if standard else _stored(answer)
        row = _row(custom_id, stored)
        told = _result(row, model, "cancelled", _KEPT_HEADS.get(endpoint))
        general = _result(row, model, "cancelled")
        assert general.kept is None
        taken = told.kept is not None
        assert openai_line("batch_1", told, 1_700_000_000, endpoint) == openai_line("batch_1", general, 1_700_000_000, endpoint)
        event("read" if not taken else "taken as text" if told.kept is not None else "told, then read (orjson would not write the line)")


def test_a_plain_echo_answer_is_taken_as_text():
    stored = _stored({"id": "chatcmpl-echo1", "object": "chat.completion", "created": 1, "model": "m", "choices": []})
    assert _result(_row("a", stored), "m", "cancelled", _KEPT_HEADS[CHAT]).kept == (stored, stored.index('"m"'), stored.index('"m"') + 3)
    assert _result(_row("a", json.dumps(json.loads(stored))), "m", "cancelled", _KEPT_HEADS[CHAT]).kept is None


def test_lines_of_answers_the_engine_kept_are_the_general_ways(store, clock, tmp_path):
    """Through the real writer: echo's answers (text, JSON instances, tool calls, n > 1, a
    unicode model name) kept by the engine, then written taken as text and read."""
    rows = ticket_rows(12)
    for i, row in enumerate(rows):
        row["body"] += " é😀 \"quoted\" \\" * (i % 2)
    tool = {"type": "function", "function": {"name": "escalate", "parameters": {"type": "object", "properties": {"r": {"type": "string"}}, "required": ["r"]}}}
    cases = [
        ("plain", {"max_tokens": 4}),
        ("json", {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}),
        ("tools", {"tools": [tool], "tool_choice": "required", "n": 2}),
    ]  # fmt: skip
    for name, params in cases:
        spec = make_spec(write_csv(tmp_path / f"{name}.csv", rows), name=name, model="modèle \"x\"", params=params)
        assert drive_to_end(store, spec, clock).counts == {"succeeded": len(rows)}
        for model in ("modèle \"x\"", "another"):
            jobs = [{"name": name, "model": model}]
            told = list(results(store, tmp_path, None, jobs, "completed", CHAT))
            assert {r.kept is not None for r in told} == {True}
            general = list(results(store, tmp_path, None, jobs, "completed"))
            assert [openai_line("b", r, 5)[0] for r in told] == [openai_line("b", r, 5)[0] for r in general]


def test_an_answer_nested_near_orjsons_limit_writes_the_general_ways_line():
    """The line nests the answer two levels down: where orjson cannot write it, the general
    way writes it with the standard library, and so does a line of a kept answer."""
    head = {"id": "chatcmpl-echo1", "object": "chat.completion", "created": 1, "model": "m"}
    taken = set()
    for levels in range(240, 256):
        row = _row("a", _stored(head | {"choices": _deep(levels)}))
        told = _result(row, "m", "cancelled", _KEPT_HEADS[CHAT])
        taken.add(told.kept is not None)
        assert openai_line("b", told, 1) == openai_line("b", _result(row, "m", "cancelled"), 1)
    assert taken == {True, False}
