"""echo's short way through a plain chat body (`_plain_chat`) gives what the general way
gives: the same plan, the same refusal, and an answer byte for byte the same, over generated
bodies near and across the edge of "plain" (odd roles, content parts, stop values, extra
keys, lowtide's own choices and schema)."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, COMPLETIONS, GEMINI, MESSAGES, RESPONSES
from lowtide.core.types import Refusal, Request
from lowtide.routes import _replies, echo
from lowtide.routes._own import read_plain

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "User", ""])
CONTENT = st.one_of(
    TEXT,
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), min_size=1, max_size=2),
    st.none(),
    st.integers(),
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLES, "content": CONTENT}),
    st.fixed_dictionaries({"role": ROLES, "content": TEXT, "name": TEXT}),  # a third key
    st.fixed_dictionaries({"content": TEXT}),  # no role
    st.fixed_dictionaries({"role": st.lists(TEXT, max_size=1), "content": TEXT}),  # not a string
)
STOP = st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=3), st.integers(), st.lists(st.integers(), min_size=1, max_size=2))
LIMIT = st.one_of(st.none(), st.integers(0, 50))
OPTIONAL = {
    "max_tokens": LIMIT,
    "max_completion_tokens": LIMIT,
    "temperature": st.one_of(st.none(), st.floats(0, 2)),
    "stop": STOP,
    "n": st.integers(1, 3),
    "seed": st.integers(0, 9),
    "top_p": st.floats(0, 1),
    "logprobs": st.booleans(),
    "response_format": st.just({"type": "json_object"}),
    "tool_choice": st.just("auto"),
}
BODY = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-4o-mini", "m"]), "messages": st.lists(MESSAGE, max_size=4)},
    optional={k: v for k, v in OPTIONAL.items()},
)
# Mostly plain bodies: the short way taken often enough to be compared at all.
PLAIN_BODY = st.fixed_dictionaries(
    {"model": st.just("gpt-4o-mini"),
     "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                                 "content": TEXT}), min_size=1, max_size=4)},
    optional={"max_tokens": LIMIT, "max_completion_tokens": LIMIT, "temperature": st.floats(0, 2), "stop": STOP},
)  # fmt: skip
REQUEST = st.builds(
    Request,
    custom_id=TEXT,
    endpoint=st.sampled_from([CHAT] * 6 + [COMPLETIONS, MESSAGES]),
    body=st.one_of(PLAIN_BODY, BODY),
    choices=st.one_of(st.none(), st.lists(TEXT.filter(bool), min_size=1, max_size=3)),
    response_schema=st.one_of(st.none(), st.none(), st.none(), st.just({"type": "object", "properties": {"a": {"type": "integer"}}})),
)


class _Frozen:
    """Both ways build the answer at the same `created` second."""

    @staticmethod
    def time() -> float:
        return 1_700_000_000.0


def _general(what):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(echo, "_plain_chat", lambda request: None)
        return what()


def _said(outcome) -> str:
    return fastjson.dumps([outcome.custom_id, outcome.ok, outcome.text, outcome.finish_reason, outcome.error_code,
                           outcome.error_message, outcome.usage.input_tokens, outcome.usage.output_tokens, outcome.response])  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(request=REQUEST, answer=st.sampled_from(["instance", "message"]))
def test_the_short_way_plans_refuses_and_answers_as_the_general_way(request, answer):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        _compare(request, answer)


def _compare(request: Request, answer: str) -> None:
    route = echo.EchoRoute({"answer": answer})
    instances = answer == "instance"
    event("short way" if echo._plain_chat(request) is not None else "general way")
    assert _run(lambda: echo.plan(request, instances)) == _run(lambda: echo._plan(request, instances))
    assert _run(lambda: route.refusal(request)) == _general(lambda: _run(lambda: route.refusal(request)))
    assert _run(lambda: _said(route.outcome(request))) == _general(lambda: _run(lambda: _said(route.outcome(request))))


def _run(what):
    """What `what` gives, or the kind of error it raises (the general way's own, for bodies
    it cannot read: the short way must not answer those either)."""
    try:
        return "ok", what()
    except Exception as err:  # noqa: BLE001
        return "raised", type(err).__name__


def test_the_short_way_is_taken_for_plain_bodies_only():
    plain = {"model": "m", "messages": [{"role": "system", "content": "Classify."}, {"role": "user", "content": "hi"}],
             "max_tokens": 64, "stop": "\n"}  # fmt: skip
    assert echo._plain_chat(Request("a", CHAT, plain)) is not None
    for other in ({"n": 1}, {"tools": []}, {"seed": 1}, {"response_format": {"type": "text"}}, {"stop": 3}):
        assert echo._plain_chat(Request("a", CHAT, plain | other)) is None, other
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert echo._plain_chat(Request("a", CHAT, plain | {"messages": [parts]})) is None
    assert echo._plain_chat(Request("a", CHAT, plain, response_schema={"type": "object"})) is None
    assert echo._plain_chat(Request("a", MESSAGES, plain)) is None


@pytest.mark.parametrize(
    ("endpoint", "body", "field"),
    [
        (CHAT, {"model": "m", "messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
        (MESSAGES, {"model": "m", "max_tokens": 5, "messages": [{"role": {"a": 1}, "content": "hi"}]}, "messages[0].role"),
        (RESPONSES, {"model": "m", "input": [{"role": ["user"], "content": "hi"}]}, "[0].role"),
        (GEMINI, {"contents": [{"role": ["user"], "parts": [{"text": "hi"}]}]}, "contents[0].role"),
    ],
)
def test_a_role_that_is_not_text_is_refused_by_name(endpoint, body, field):
    """It was a TypeError (a list is no dict key), not the refusal naming the field."""
    refused = read_plain(Request("a", endpoint, body))
    assert isinstance(refused, Refusal) and refused.field.endswith(field), refused
    assert "is not taken by this route" in refused.reason
