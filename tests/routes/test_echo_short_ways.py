"""echo's short ways give what the general ways give, over generated bodies near and across
the edge of what they take (odd roles, content parts, stop values, extra keys, lowtide's own
choices and schema, JSON asks, tools and tool choices on every endpoint):

- `plain._turns` reads a {role, content} message of text at once: the same turn, or the same
  refusal, as the general reader (`_turn`);
- echo reads a body's structure (JSON ask, tools, required call) once per distinct ask
  (`_structure`): the same plan, refusal and answer, byte for byte, as reading it afresh,
  and never one ask's plan for another that only JSON text cannot tell apart;
- echo tells a plain text chat (`text_chat`), and one asking lowtide's choice schema
  (`choice_chat`), in a few lookups: the same refusal and answer as the general way."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, COMPLETIONS, GEMINI, MESSAGES, RESPONSES
from lowtide.core.types import Refusal, Request
from lowtide.routes import replies as _replies
from lowtide.routes.own import echo
from lowtide.routes.own import plain as _own
from lowtide.routes.own.plain import read_plain

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


SCHEMA = st.sampled_from([
    {"type": "object", "additionalProperties": False, "required": ["label", "urgent"],
     "properties": {"label": {"type": "string", "enum": ["billing", "technical"]}, "urgent": {"type": "boolean"}}},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}},
    {"type": "object", "properties": {"a": {"pattern": "x"}}},  # echo cannot make it
    {"type": "object", "properties": {"a": {"enum": [1, 1.0, True, None]}}},
    {"type": "array", "items": {"type": "number"}, "minItems": 2},
    True, "not a schema",
])  # fmt: skip
NAMES = st.sampled_from(["a", "b", "escalate"])
FORMAT = st.one_of(
    st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x"}},
                     {"type": "weird"}, [1]]),
    st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "t", "strict": True, "schema": s}}, SCHEMA),
)  # fmt: skip
TOOL = st.one_of(
    st.builds(lambda n, s: {"type": "function", "function": {"name": n, "parameters": s}}, NAMES, SCHEMA),
    st.builds(lambda n: {"type": "function", "function": {"name": n}}, NAMES),
    st.builds(lambda n, s: {"type": "function", "name": n, "parameters": s}, NAMES, SCHEMA),  # responses' shape
    st.builds(lambda n, s: {"name": n, "input_schema": s}, NAMES, SCHEMA),  # Anthropic's
    st.just({"type": "custom", "custom": {"name": "c"}}), st.just("x"),
)  # fmt: skip
TOOL_CHOICE = st.one_of(
    st.sampled_from(["auto", "none", "required", "bogus", {"type": "any"}, {"type": "auto"}, {"type": "x"},
                     {"type": "allowed_tools", "mode": "auto", "tools": []}]),
    st.builds(lambda n: {"type": "function", "function": {"name": n}}, NAMES),
    st.builds(lambda n: {"type": "function", "name": n}, NAMES),
    st.builds(lambda n: {"type": "tool", "name": n}, NAMES),
    st.builds(lambda n: {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": n}}]}}, NAMES),
)  # fmt: skip
STRUCTURE = st.fixed_dictionaries({}, optional={
    "response_format": FORMAT,
    "tools": st.one_of(st.lists(TOOL, max_size=3), st.just("t")),
    "tool_choice": TOOL_CHOICE,
    "text": st.one_of(st.builds(lambda f: {"format": f}, FORMAT), st.just({"format": None, "verbosity": "low"}), st.just(3)),
    "output_config": st.one_of(st.builds(lambda s: {"format": {"type": "json_schema", "schema": s}}, SCHEMA),
                               st.just({"effort": "low"}), st.just({"format": {"type": "x"}})),
})  # fmt: skip
# Bodies each endpoint's plain reader takes, so the structure is what decides.
TURNS = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT}), min_size=1, max_size=2)
READABLE = {
    CHAT: st.fixed_dictionaries({"model": st.just("m"), "messages": TURNS}),
    MESSAGES: st.fixed_dictionaries({"model": st.just("m"), "max_tokens": st.integers(1, 9), "messages": TURNS}),
    RESPONSES: st.fixed_dictionaries({"model": st.just("m"), "input": TEXT}),
}
STRUCTURED = st.sampled_from([CHAT, CHAT, MESSAGES, RESPONSES]).flatmap(
    lambda endpoint: st.builds(
        Request,
        custom_id=TEXT,
        endpoint=st.just(endpoint),
        body=st.builds(lambda body, asked: body | asked, READABLE[endpoint], STRUCTURE),
        choices=st.one_of(st.none(), st.lists(TEXT.filter(bool), min_size=1, max_size=3)),
        response_schema=st.one_of(st.none(), st.none(), st.just({"type": "object", "properties": {"a": {"type": "integer"}}})),
    )
)


class _Frozen:
    """Both ways build the answer at the same `created` second."""

    @staticmethod
    def time() -> float:
        return 1_700_000_000.0


def _afresh(what):
    """`what` with the structure read afresh every time (no remembered asks)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(echo, "_structure", echo._read_structure)
        return what()


def _said(outcome) -> str:
    return fastjson.dumps([outcome.custom_id, outcome.ok, outcome.text, outcome.finish_reason, outcome.error_code,
                           outcome.error_message, outcome.usage.input_tokens, outcome.usage.output_tokens, outcome.response])  # fmt: skip


def _run(what):
    """What `what` gives, or the kind of error it raises (the general way's own, for bodies
    it cannot read: the short way must not answer those either)."""
    try:
        return "ok", what()
    except Exception as err:  # noqa: BLE001
        return "raised", type(err).__name__


@settings(max_examples=600, deadline=None)
@given(request=st.one_of(REQUEST, STRUCTURED), answer=st.sampled_from(["instance", "message"]))
def test_a_remembered_ask_plans_refuses_and_answers_as_reading_it_afresh(request, answer):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        route = echo.EchoRoute({"answer": answer})
        instances = answer == "instance"
        fresh = _afresh(lambda: (_run(lambda: echo.plan(request, instances)), _run(lambda: route.refusal(request)),
                                 _run(lambda: _said(route.outcome(request)))))  # fmt: skip
        for _ in range(2):  # told, then remembered
            assert _run(lambda: echo.plan(request, instances)) == fresh[0]
            assert _run(lambda: route.refusal(request)) == fresh[1]
            assert _run(lambda: _said(route.outcome(request))) == fresh[2]
        event("answered" if fresh[1] == ("ok", None) else "refused")


MESSAGE_PARTS = st.one_of(MESSAGE, st.fixed_dictionaries({"role": ROLES, "content": CONTENT, "type": st.just("message")}),
                          st.just(["user", "hi"]), st.none())  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(message=MESSAGE_PARTS, roles=st.sampled_from([_own.CHAT_ROLES, {"user": "user", "assistant": "assistant"}]))
def test_a_message_read_at_once_is_read_as_the_general_way_reads_it(message, roles):
    def general():
        try:
            return [_own._turn(message, 0, roles, ("text",), _own._ROLE_CONTENT)]
        except _own._Refused as refused:
            return refused.refusal

    def at_once():
        try:
            return _own._turns([message], roles, ("text",), _own._ROLE_CONTENT)
        except _own._Refused as refused:
            return refused.refusal

    assert _run(at_once) == _run(general)


def test_an_ask_json_text_cannot_tell_apart_is_not_mixed_up():
    """A tuple writes as a list: the list's remembered ask must not answer for it."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    listed = echo.plan(Request("x", CHAT, body | {"tools": [tool], "tool_choice": "required"}))
    assert not isinstance(listed, Refusal) and [t.name for t, _ in listed.calls] == ["a"]
    assert echo.plan(Request("x", CHAT, body | {"tools": (tool,), "tool_choice": "required"})) == Refusal("tools", "must be a list of tools")


def test_a_body_asking_nothing_is_read_without_remembering_it():
    echo._MEMO.clear()
    plain = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": None}
    assert echo._structure(Request("a", CHAT, plain)) == (None, None, ())
    assert echo._MEMO == {}


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


class _Text(str):
    """A str subclass: the short way leaves it to the general one."""


# Chat bodies at the edge of what `echo.text_chat` tells at once: a plain body (text turns,
# limits that cut a long text or not) with at most one thing changed: an odd limit, stop,
# role or message shape, a key more, lowtide's own choices or schema, another endpoint.
LONG_TEXT = st.text(st.characters(codec="utf-8"), max_size=80)
SMALL_LIMIT = st.one_of(st.none(), st.integers(0, 25))
PLAIN_TURN = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": LONG_TEXT})
PLAIN_CHAT = st.fixed_dictionaries(
    {"model": st.just("gpt-4o-mini"), "messages": st.lists(PLAIN_TURN, min_size=1, max_size=4)},
    optional={"max_tokens": SMALL_LIMIT, "max_completion_tokens": SMALL_LIMIT, "temperature": st.floats(0, 2),
              "stop": st.one_of(st.none(), TEXT, st.lists(TEXT, max_size=2))},
)  # fmt: skip
ODD_MESSAGE = st.one_of(
    MESSAGE,
    st.builds(lambda t: {"role": "user", "content": _Text(t)}, TEXT),
    st.builds(lambda t: {"role": _Text("user"), "content": t}, TEXT),
    st.just(["user", "hi"]),
)
CHANGES = st.one_of(
    st.builds(lambda v: ("max_tokens", v), st.one_of(st.booleans(), st.floats(0, 9), st.just("7"), st.integers(-5, -1))),
    st.builds(lambda v: ("max_completion_tokens", v), st.one_of(st.booleans(), st.floats(0, 9), st.just("7"))),
    st.builds(lambda v: ("stop", v), st.one_of(st.integers(), st.lists(st.integers(), min_size=1, max_size=2), st.just([_Text("x")]),
                                               st.just(_Text("x")), st.just(("a",)), st.just(["a", 1]))),
    st.builds(lambda v: ("n", v), st.sampled_from([1, 2, True, 1.0])),
    st.builds(lambda k, v: (k, v), st.sampled_from(["seed", "top_p", "logprobs", "user", "tools", "response_format", "tool_choice"]),
              st.sampled_from([None, 1, {"type": "json_object"}, "auto"])),
    st.builds(lambda m, at: ("message", (m, at)), ODD_MESSAGE, st.integers(0, 3)),
    st.builds(lambda v: ("messages", v), st.sampled_from([None, [], "hi", ({"role": "user", "content": "hi"},)])),
    st.just(("choices", [])), st.just(("choices", ["billing", "tech"])), st.just(("response_schema", {})),
    st.just(("response_schema", {"type": "object"})), st.just(("endpoint", COMPLETIONS)), st.just(("endpoint", RESPONSES)),
    st.just(("endpoint", MESSAGES)),
)  # fmt: skip


def _changed(custom_id: str, body: dict, change) -> Request:
    request = Request(custom_id, CHAT, body)
    if change is None:
        return request
    what, value = change
    if what in ("choices", "response_schema", "endpoint"):
        setattr(request, what, value)
    elif what == "message":
        message, at = value
        messages = list(body["messages"])
        messages.insert(at % (len(messages) + 1), message)
        request.body = body | {"messages": messages}
    else:
        request.body = body | {what: value}
    return request


TEXT_CHAT = st.builds(_changed, TEXT, PLAIN_CHAT, st.one_of(st.none(), CHANGES))


@settings(max_examples=1500, deadline=None)
@given(request=st.one_of(TEXT_CHAT, REQUEST, STRUCTURED), answer=st.sampled_from(["instance", "message"]))
def test_a_text_chat_told_at_once_is_refused_and_answered_as_the_general_way_does(request, answer):
    """`echo.text_chat` takes a request only where the general way answers it with the text
    echo, and the answer is the general way's byte for byte (the whole response too)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        route = echo.EchoRoute({"answer": answer})
        told = echo.text_chat(request)
        short = (_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request))))
        m.setattr(echo, "text_chat", lambda _request: None)  # the general way only
        general = (_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request))))
    assert short == general
    if told is not None:
        assert general[0] == ("ok", None) and general[1][0] == "ok"
        plan = echo.plan(request, answer == "instance")
        assert not isinstance(plan, Refusal) and plan.json is None and not plan.calls and plan.plain.n == 1
    event("told at once" if told is not None else "general")


# Chat bodies at the edge of what `echo.choice_chat` tells at once: a text chat (as above)
# asking lowtide's choice schema, or one a step from it (another shape of schema, format or
# enum), with at most one other thing changed; lowtide's own choices the schema's or others.
PICKS = ["billing", "technical", "account"]
CHOICE_SCHEMA = {"type": "object", "properties": {"choice": {"type": "string", "enum": PICKS}}, "required": ["choice"],
                 "additionalProperties": False}  # fmt: skip
NEAR_SCHEMA = st.sampled_from([
    CHOICE_SCHEMA,
    CHOICE_SCHEMA | {"additionalProperties": True},
    {k: v for k, v in CHOICE_SCHEMA.items() if k != "additionalProperties"},
    CHOICE_SCHEMA | {"properties": {"choice": {"type": "string", "enum": ["Billing", "tech", "billing"]}}},
    CHOICE_SCHEMA | {"properties": {"choice": {"type": "string", "enum": []}}},
    CHOICE_SCHEMA | {"properties": {"choice": {"type": "string", "enum": ["a", 1]}}},
    CHOICE_SCHEMA | {"properties": {"choice": {"type": "string", "enum": ("a", "b")}}},
    CHOICE_SCHEMA | {"properties": {"choice": {"type": "string", "enum": PICKS}, "why": {"type": "string"}}},
    CHOICE_SCHEMA | {"properties": {"choice": {"type": "string"}}},
    CHOICE_SCHEMA | {"properties": {"choice": True}},
    CHOICE_SCHEMA | {"required": ["choice", "why"]},
    CHOICE_SCHEMA | {"required": ("choice",)},
    CHOICE_SCHEMA | {"type": "array"},
    {"type": "object", "properties": {"a": {"pattern": "x"}}},  # echo cannot make it
    True, "not a schema",
])  # fmt: skip
NEAR_FORMAT = st.one_of(
    st.builds(lambda s, strict, name: {"type": "json_schema", "json_schema": {"name": name, "schema": s, "strict": strict}},
              NEAR_SCHEMA, st.one_of(st.booleans(), st.just(1)), st.sampled_from(["output", "x y"])),
    st.builds(lambda s: {"type": "json_schema", "json_schema": {"schema": s}, "extra": 1}, NEAR_SCHEMA),
    st.sampled_from([{"type": "json_schema", "json_schema": {"name": "output"}}, {"type": "json_schema", "json_schema": [CHOICE_SCHEMA]},
                     {"type": "json_object"}, {"type": "text"}, {"type": "weird"}, None, [1]]),
)  # fmt: skip
CHOICE_CHAT = st.builds(
    lambda cid, body, fmt, change, choices: _with_choices(_changed(cid, body | {"response_format": fmt}, change), choices),
    TEXT, PLAIN_CHAT, NEAR_FORMAT, st.one_of(st.none(), st.none(), CHANGES), st.sampled_from([None, PICKS, ["account"], []]),
)  # fmt: skip


def _with_choices(request: Request, choices) -> Request:
    if request.choices is None:  # (a change may have set its own)
        request.choices = choices
    return request


def _text(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Pick one: billing, technical."}, {"role": "user", "content": user}]


@settings(max_examples=1500, deadline=None)
@given(request=st.one_of(CHOICE_CHAT, CHOICE_CHAT, TEXT_CHAT, STRUCTURED), answer=st.sampled_from(["instance", "message"]))
def test_a_choice_chat_told_at_once_is_refused_and_answered_as_the_general_way_does(request, answer):
    """`echo.choice_chat` takes a request only where the general way answers it with a choice
    of the schema's enum, and the answer is the general way's byte for byte (the whole response
    too): the first time and when the general way's plan is remembered."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        route = echo.EchoRoute({"answer": answer})
        told = echo.choice_chat(request)
        short = (_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request))))
        m.setattr(echo, "choice_chat", lambda _request: None)  # the general way only
        remembered = (_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request))))
        m.setattr(echo, "chat_told", lambda _request, _instances=True: None)
        general = _afresh(lambda: (_run(lambda: route.refusal(request)), _run(lambda: _said(route.outcome(request)))))
    assert short == general == remembered
    if told is not None and answer == "instance":
        assert general[0] == ("ok", None) and general[1][0] == "ok"
        plan = echo.plan(request)
        assert not isinstance(plan, Refusal) and plan.picks == told[2] and not plan.calls and plan.plain.n == 1
    event("told at once" if told is not None and answer == "instance" else "general")


@pytest.mark.parametrize(("user", "picked"), [("my BILLING, then technical", "billing"), ("a technical fault", "technical"),
                                              ("nothing", None), ("", None)])  # fmt: skip
def test_a_choice_chat_answers_the_first_choice_named_else_one_by_its_custom_id(user, picked):
    body = {"model": "m", "messages": _text(user), "response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "schema": CHOICE_SCHEMA, "strict": True}}, "max_tokens": 1}  # fmt: skip
    request = Request("row-7", CHAT, body, ["other"])  # the schema's enum is answered, not the request's choices
    assert echo.choice_chat(request) is not None
    outcome = echo.EchoRoute({}).outcome(request)
    choice = fastjson.loads(outcome.text)["choice"]
    assert choice == (picked or PICKS[zlib.crc32(b"row-7") % len(PICKS)])
    assert outcome.finish_reason == "stop" and outcome.response["choices"][0]["message"]["content"] == outcome.text


def test_a_choice_chat_whose_choice_orjson_refuses_is_answered_as_the_general_way_does():
    """A choice holding a lone surrogate (orjson refuses it; json writes it) is answered, its
    body written the long way, as before a choice's JSON was made once per choice."""
    picks = ["a\ud800b", "other"]
    schema = {"type": "object", "properties": {"choice": {"type": "string", "enum": picks}}, "required": ["choice"],
              "additionalProperties": False}  # fmt: skip
    body = {"model": "m", "messages": _text("pick a\ud800b please"),
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}}  # fmt: skip
    request = Request("row-1", CHAT, body, picks)
    assert echo.choice_chat(request) is not None
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_replies, "time", _Frozen)
        route = echo.EchoRoute({})
        short = _run(lambda: _said(route.outcome(request)))
        m.setattr(echo, "choice_chat", lambda _request: None)
        m.setattr(echo, "chat_told", lambda _request, _instances=True: None)
        general = _afresh(lambda: _run(lambda: _said(route.outcome(request))))
    assert short == general and short[0] == "ok"
    assert route.outcome(request).text == '{"choice":"a\ud800b"}'
