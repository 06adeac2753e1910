"""The one answer builder (`routes/replies.py`) writes each endpoint's answer in the
provider's own shape: checked against the official SDKs' response models, walked field by
field (every required field present, no key the model does not declare), so a field the SDK
makes required next is caught here; and what it writes reads back through `routes/openai/wire.py` and `routes/anthropic/wire.py` as the
same usage and the same finish reason."""

from __future__ import annotations

import types
import typing

import anthropic
import openai
import pydantic
import pytest

from lowtide.core.endpoints import CHAT, COMPLETIONS, MESSAGES, RESPONSES
from lowtide.core.types import Request, Usage
from lowtide.routes.anthropic.wire import anthropic_usage
from lowtide.routes.openai.wire import openai_usage, responses_usage
from lowtide.routes.replies import Call, Ids, Reply, finish_of, in_shape, reply_body, text_body

MODELS = {CHAT: openai.types.chat.ChatCompletion, RESPONSES: openai.types.responses.Response,
          COMPLETIONS: openai.types.Completion, MESSAGES: anthropic.types.Message}  # fmt: skip
BODIES = {CHAT: {"messages": [{"role": "user", "content": "hi"}]}, RESPONSES: {"input": "hi", "instructions": "be brief"},
          COMPLETIONS: {"prompt": "hi"}, MESSAGES: {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}}  # fmt: skip
USAGE = Usage(input_tokens=7, cached_input_tokens=2, cache_write_tokens=1, output_tokens=3, reasoning_tokens=1)
CALL = Call("label", {"label": "bug", "n": [1]})
CASES = {
    "text": [Reply("hello", output_tokens=3)],
    "cut": [Reply("hel", "length", output_tokens=3)],
    "stop-sequence": [Reply("he", "stop_sequence", stop_sequence="###", output_tokens=3)],
    "tool-call": [Reply(finish="tool_calls", call=CALL, output_tokens=3)],
    "n-2": [Reply("a", output_tokens=1), Reply(finish="tool_calls", call=CALL, output_tokens=2)],
}
ONE_CHOICE = (RESPONSES, MESSAGES)  # no `n` there


def _keys(model: type[pydantic.BaseModel]) -> tuple[set[str], set[str]]:
    names = {f.alias or n for n, f in model.model_fields.items()}
    return names, {f.alias or n for n, f in model.model_fields.items() if f.is_required()}


def fits(annotation: typing.Any, value: typing.Any, at: str) -> list[str]:
    """Where `value` is not of `annotation` by the SDK's declared fields; [] when it is."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return fits(typing.get_args(annotation)[0], value, at)
    if origin in (typing.Union, types.UnionType):
        tries = [fits(a, value, at) for a in typing.get_args(annotation)]
        return [] if any(not t for t in tries) else min(tries, key=len)
    if value is None:
        return [] if annotation is type(None) else [f"{at}: None"]
    if origin is typing.Literal:
        return [] if value in typing.get_args(annotation) else [f"{at}: {value!r} not in {typing.get_args(annotation)}"]
    if origin in (list, typing.List):  # noqa: UP006
        (item,) = typing.get_args(annotation)
        return [p for i, v in enumerate(value) for p in fits(item, v, f"{at}[{i}]")]
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        if not isinstance(value, dict):
            return [f"{at}: not an object"]
        names, required = _keys(annotation)
        problems = [f"{at}.{k}: not declared" for k in set(value) - names]
        problems += [f"{at}.{k}: missing" for k in required - set(value)]
        for name, f in annotation.model_fields.items():
            key = f.alias or name
            if key in value:
                problems += fits(f.annotation, value[key], f"{at}.{key}")
        return problems
    return []  # a scalar, a dict of anything: pydantic's validation below judges it


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("endpoint", sorted(MODELS))
def test_each_answer_is_in_the_sdks_own_shape(endpoint, case):
    replies = CASES[case]
    if endpoint in ONE_CHOICE and len(replies) > 1:
        pytest.skip(f"{endpoint} has no n")
    if endpoint == COMPLETIONS and any(r.call for r in replies):
        pytest.skip("completions have no tools")
    request = Request("ticket-1", endpoint, {"model": "m-asked", **BODIES[endpoint]})
    body = reply_body(request, "echo", replies, USAGE, created=5)
    model = MODELS[endpoint]
    assert fits(model, body, "answer") == []
    assert fits(model, body | {"lowtide-probe": 1}, "answer") == ["answer.lowtide-probe: not declared"]  # it can fail
    answer = model.model_validate(body)
    assert answer.model == "m-asked" and in_shape(endpoint, body)
    assert not any(in_shape(other, body) for other in MODELS if other != endpoint)
    said = replies[0].finish
    assert finish_of(body) == ("stop" if said == "stop_sequence" and endpoint != MESSAGES else said)
    if endpoint == MESSAGES:  # Anthropic's input_tokens leave out cache reads
        assert anthropic_usage(body["usage"]) == Usage(5, 2, 1, 3, 0)
    else:
        read = responses_usage if endpoint == RESPONSES else openai_usage
        assert read(body["usage"]) == Usage(7, 2, 0, 3, 1)
    assert reply_body(request, "echo", replies, USAGE, created=5) == body  # a function of the request


def test_a_text_answer_takes_any_providers_finish_word():
    request = Request("r", MESSAGES, {"model": "m", **BODIES[MESSAGES]})
    ids = Ids("abc")
    for said, stop in (("length", "max_tokens"), ("max_tokens", "max_tokens"), ("end_turn", "end_turn"),
                       ("tool_use", "tool_use"), ("stop", "end_turn")):  # fmt: skip
        body = text_body(request, "x", said, USAGE, ids=ids, created=0)
        assert body["stop_reason"] == stop and body["id"] == "msg_abc"
    chat = text_body(Request("r", CHAT, {"model": "m", **BODIES[CHAT]}), "x", "max_tokens", USAGE, ids=ids, created=0)
    assert chat["choices"][0]["finish_reason"] == "length" and chat["id"] == "chatcmpl-abc"
