"""The export reads the usual answer's columns from its stored text without parsing it
(answer_columns.text_answer_values). That shortcut may decline, never differ: for every
chat completion, whatever its text says, it gives what parsing gives, or None."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

from lowtide.core import fastjson
from lowtide.engine.answer_columns import answer_values, text_answer_values

# Text that looks like the keys the shortcut looks for, inside an answer's content.
TRICKY = st.sampled_from(['"tool_calls":[1]', '"finish_reason":"length"', '"logprobs":{"a":1}', '"refusal":"no"',
                          '"message":{', '"choices":[{', '"reasoning":"x"', "\\", '"', "é", "\ud800"])  # fmt: skip
TEXT = st.lists(st.one_of(st.text(max_size=8), TRICKY), max_size=4).map("".join)
SDK_FINISH = {"stop", "length", "tool_calls", "content_filter"}
FINISH = st.sampled_from(["stop", "length", "tool_calls", "content_filter", None, 'st"op'])
CALL = st.fixed_dictionaries({"id": st.just("call_1"), "type": st.just("function"),
                              "function": st.fixed_dictionaries({"name": st.just("f"), "arguments": TEXT})})  # fmt: skip
LOGPROBS = st.one_of(st.none(), st.just({"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}],
                                         "refusal": None}))  # fmt: skip


@st.composite
def completions(draw) -> dict:
    choices = []
    for i in range(draw(st.integers(1, 3))):
        message = {"role": "assistant", "content": draw(st.one_of(st.none(), TEXT))}
        for key, value in (("refusal", st.one_of(st.none(), TEXT)), ("tool_calls", st.one_of(st.none(), st.lists(CALL, max_size=2))),
                           ("reasoning_content", TEXT)):  # fmt: skip
            if draw(st.booleans()):
                message[key] = draw(value)
        choices.append({"index": i, "message": message, "finish_reason": draw(FINISH), "logprobs": draw(LOGPROBS)})
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": choices,
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
                      "completion_tokens_details": {"reasoning_tokens": 0}}}  # fmt: skip
    if draw(st.booleans()):
        body["system_fingerprint"] = draw(TEXT)
    return body


@settings(max_examples=400, deadline=None)
@given(completions(), st.booleans())
def test_the_shortcut_declines_or_agrees_with_the_parse(body, spaced):
    stored = json.dumps(body, ensure_ascii=False) if spaced else fastjson.dumps(body)
    response = fastjson.loads(stored)
    if all(c["finish_reason"] in SDK_FINISH for c in body["choices"]):  # a body the SDK's type takes
        ChatCompletion.model_validate(response)
    shortcut = text_answer_values(stored)
    assert shortcut is None or shortcut == answer_values(response)


def test_a_plain_answer_takes_the_shortcut():
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": 'say "tool_calls": no', "refusal": None},
                         "finish_reason": "length", "logprobs": None}]}  # fmt: skip
    assert text_answer_values(fastjson.dumps(body)) == answer_values(body)
    assert text_answer_values(fastjson.dumps(body))["finish_reason"] == "length"
