"""echo tells a chat request whose turns are all {role, content} of text without reading it
whole (`echo.chat_told`): the rest of its body is read once per distinct rest. Over generated
bodies near and across that edge (odd turns, extra keys, limits, stops, n, JSON asks, tools,
lowtide's own choices and schema), its refusal and its answer are the general way's, byte
for byte, the first time and when remembered; and a remembered rest never answers for
another that only JSON text cannot tell apart."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, MESSAGES
from lowtide.core.types import Refusal, Request
from lowtide.routes import replies as _replies
from lowtide.routes.own import echo

TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
CHOICES = ["billing", "technical", "account"]
TURN = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": TEXT})
ODD_TURN = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["tool", "User", ""]), "content": TEXT}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), min_size=1, max_size=2)}),
    st.fixed_dictionaries({"role": st.just("user"), "content": TEXT, "name": TEXT}),
    st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(st.none(), st.integers())}),
    st.just(["user", "hi"]),
)  # fmt: skip
SCHEMA = st.sampled_from([
    {"type": "object", "properties": {"choice": {"type": "string", "enum": CHOICES}}, "required": ["choice"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}},
    {"type": "object", "properties": {"a": {"pattern": "x"}}},  # echo cannot make it
    True, "not a schema",
])  # fmt: skip
FORMAT = st.one_of(
    st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "weird"}, [1]]),
    st.builds(lambda s, strict: {"type": "json_schema", "json_schema": {"name": "output", "schema": s, "strict": strict}}, SCHEMA,
              st.one_of(st.booleans(), st.just(1))),
)  # fmt: skip
TOOL = st.builds(lambda n, s: {"type": "function", "function": {"name": n, "parameters": s}}, st.sampled_from(["a", "b"]), SCHEMA)
REST = {
    "max_tokens": st.one_of(st.none(), st.integers(0, 30), st.booleans(), st.just(2.0)),
    "max_completion_tokens": st.one_of(st.none(), st.integers(0, 30)),
    "temperature": st.one_of(st.none(), st.floats(0, 2), st.just(float("nan"))),
    "stop": st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=2), st.integers(), st.just(("a",))),
    "n": st.sampled_from([1, 2, True, 1.0, 0]),
    "seed": st.integers(0, 9),
    "logprobs": st.booleans(),
    "service_tier": st.sampled_from(["auto", "flex"]),
    "response_format": FORMAT,
    "tools": st.one_of(st.lists(TOOL, max_size=2), st.just("t"), st.builds(tuple, st.lists(TOOL, min_size=1, max_size=1))),
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "a"}}]),
}
BODY = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-4o-mini", "m"]),
     "messages": st.one_of(st.lists(TURN, min_size=1, max_size=3), st.lists(st.one_of(TURN, ODD_TURN), min_size=1, max_size=3),
                           st.just([]), st.just(None))},
    optional=REST,
)  # fmt: skip
REQUEST = st.builds(
    Request,
    custom_id=TEXT,
    endpoint=st.sampled_from([CHAT] * 8 + [MESSAGES]),
    body=BODY,
    choices=st.one_of(st.none(), st.just(CHOICES), st.lists(TEXT.filter(bool), min_size=1, max_size=3)),
    response_schema=st.one_of(st.none(), st.none(), st.just({"type": "object", "properties": {"a": {"type": "integer"}}})),
)


class _Frozen:
    """Both ways build the answer at the same `created` second."""

    @staticmethod
    def time() -> float:
        return 1_700_000_000.0


def _said(outcome) -> str:
    return fastjson.dumps([outcome.custom_id, outcome.ok, outcome.text, outcome.finish_reason, outcome.error_code,
                           outcome.error_message, outcome.usage.input_tokens, outcome.usage.output_tokens, outcome.response])  # fmt: skip


def _run(what):
    """What `what` gives, or the kind of error it raises (the general way's own, for bodies it
    cannot read: the short way must not answer those either)."""
    try:
        return "ok", what()
    except Exception as err:  # noqa: BLE001
        return "raised", type(err).__name__


@settings(max_examples=800, deadline=None)
@given(request=REQUEST)
def test_a_chat_told_at_once_is_refused_and_answered_as_the_general_way_does(request):
    for answer in ("instance", "message"):  # both, one after the other: neither's plan answers for the other
        _compare(request, answer)


def _compare(request: Request, answer: str) -> None:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        route = echo.EchoRoute({"answer": answer})
        instances = answer == "instance"
        told = _run(lambda: echo.chat_told(request, instances))
        short = [(_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request)))) for _ in range(2)]  # told, remembered
        m.setattr(echo, "chat_told", lambda _request, _instances=True: None)  # the general way only
        general = (_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request))))
        whole = _run(lambda: echo.plan(request, instances))
    assert short == [general, general]
    if told[0] != "ok" or told[1] is None:
        event("general")
        return
    made, last_user, _ = told[1]
    if isinstance(made, Refusal):
        assert whole == ("ok", made)
    else:  # the plan but for the turns, which stand in
        assert whole[0] == "ok" and not isinstance(whole[1], Refusal)
        plain = whole[1].plain
        assert (made.json, made.schema, made.calls, made.picks, made.plain.max_tokens, made.plain.n, made.plain.stop) == (
            whole[1].json, whole[1].schema, whole[1].calls, whole[1].picks, plain.max_tokens, plain.n, plain.stop)  # fmt: skip
        assert last_user == echo._last_user(plain)
    event("told: refused" if isinstance(made, Refusal) else "told: answered")


def _chat(**rest) -> Request:
    return Request("t1", CHAT, {"model": "m", "messages": [{"role": "user", "content": "a billing refund, please"}], **rest}, CHOICES)


def test_a_rest_json_text_cannot_tell_apart_is_not_mixed_up():
    """A tuple writes as a list, True == 1 and 1.0 == 1: each is told apart, not answered
    by the other's remembered plan."""
    route = echo.EchoRoute({})
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    assert route.refusal(_chat(tools=[tool], tool_choice="required")) is None
    assert route.refusal(_chat(tools=(tool,), tool_choice="required")) == Refusal("tools", "must be a list of tools")
    assert route.refusal(_chat(n=1)) is None
    assert route.refusal(_chat(n=True)) is not None  # a bool is no count of choices
    assert route.outcome(_chat(max_tokens=2)).finish_reason == "stop"  # a choice is never cut
    asked = _chat(response_format={"type": "json_object"})
    assert route.outcome(asked).text == '{"echo":"billing"}'
    assert echo.EchoRoute({"answer": "message"}).outcome(asked).text == "billing"  # the same rest, answered as plain choices


def test_a_job_of_choices_answers_each_row_from_its_own_turns():
    """Rows of one job share their rest: the plan is remembered, the answer is each row's."""
    route = echo.EchoRoute({})
    asked = {"model": "m", "response_format": {"type": "json_schema", "json_schema": {"name": "output", "strict": True, "schema": {
        "type": "object", "properties": {"choice": {"type": "string", "enum": CHOICES}}, "required": ["choice"], "additionalProperties": False}}}}
    texts = {"my account is locked": "account", "TECHNICAL fault, then billing": "technical", "nothing here": None}
    for text, picked in texts.items():
        request = Request(f"row-{text}", CHAT, asked | {"messages": [{"role": "system", "content": "billing"}, {"role": "user", "content": text}]}, CHOICES)
        outcome = route.outcome(request)
        assert outcome.ok and fastjson.loads(outcome.text)["choice"] == (picked or outcome.text[11:-2])
        assert outcome.response["choices"][0]["message"]["content"] == outcome.text
        assert outcome.usage.input_tokens == 2 + -(-len(text) // 4)
