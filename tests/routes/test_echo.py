"""`echo` honours structure: a JSON answer valid against the asked schema, a tool call valid
against the tool's parameters when `tool_choice` requires one, `n` choices, and answer bodies
in each endpoint's own shape (checked with the official SDKs' own response models). What it
cannot satisfy is refused by name, before anything runs."""

from __future__ import annotations

import typing
import zlib

import jsonschema
import pytest
from anthropic.types import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, completion_create_params
from openai.types.chat.chat_completion_tool_choice_option_param import (
    ChatCompletionToolChoiceOptionParam,
)
from openai.types.responses import Response

from lowtide.core.types import Request
from lowtide.routes.own.echo import EchoRoute
from lowtide.routes.own.instances import Instances, Unsatisfiable

ECHO = EchoRoute({})
USER = [{"role": "user", "content": "Ticket: the printer is on fire"}]
IDS = [f"row-{i}" for i in range(40)]

SCHEMAS = [
    {"type": "object", "properties": {"label": {"enum": ["billing", "technical"]}, "urgent": {"type": "boolean"}},
     "required": ["label", "urgent"], "additionalProperties": False},
    {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": {"type": "string", "minLength": 3, "maxLength": 8},
                                                    "age": {"type": "integer", "minimum": 18, "maximum": 99}},
                   "required": ["name", "age"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 2, "maxItems": 3},
        "scores": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
    }, "required": ["person", "tags"]},
    {"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer", "multipleOf": 5},
                                                         "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                        "required": ["value"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"},
                                      "mail": {"type": "string", "format": "email"}, "site": {"type": "string", "format": "uri"}},
     "required": ["when", "id", "mail", "site"]},
    {"type": "object", "properties": {"maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                      "either": {"oneOf": [{"type": "integer", "minimum": 10}, {"type": "boolean"}]},
                                      "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                                         {"properties": {"b": {"const": "fixed"}}, "required": ["b"]}]}},
     "required": ["maybe", "either", "both"]},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False, "minItems": 2},
    {"type": "array", "items": {"enum": [1, 2, 3, 4]}, "uniqueItems": True, "minItems": 3},
    {"type": ["null", "number"], "minimum": -5.5, "maximum": -5.25},
    {"type": "number", "multipleOf": 0.25, "minimum": 1.1},
    {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
    {"definitions": {"code": {"type": "string", "enum": ["A1", "B2"]}}, "type": "object",
     "properties": {"codes": {"type": "array", "items": {"$ref": "#/definitions/code"}}}, "required": ["codes"]},
    {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]},
    {},
]  # fmt: skip


def chat(cid: str, **body) -> Request:
    return Request.chat(cid, "gpt-test", USER, **body)


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_a_schema_answer_is_valid_against_the_schema_for_every_row(schema):
    validator = jsonschema.Draft202012Validator(schema)
    seen = set()
    for cid in IDS:
        outcome = ECHO.outcome(chat(cid, response_format=json_schema_format(schema)))
        assert outcome.ok, outcome.error_message
        value = ChatCompletion.model_validate(outcome.response).choices[0].message.content
        assert value == outcome.text
        validator.validate(jsonschema_loads(value))
        seen.add(value)
    assert ECHO.outcome(chat(IDS[0], response_format=json_schema_format(schema))).text == chat_answer(IDS[0], schema)


def jsonschema_loads(text: str):
    import json

    return json.loads(text)


def chat_answer(cid: str, schema: dict) -> str:
    return ECHO.outcome(chat(cid, response_format=json_schema_format(schema))).text


def test_answers_differ_between_rows_and_repeat_for_one_row():
    schema = SCHEMAS[1]
    answers = {cid: chat_answer(cid, schema) for cid in IDS}
    assert len(set(answers.values())) > 5  # derived from custom_id
    assert all(chat_answer(cid, schema) == a for cid, a in answers.items())


# Schemas made of the keywords the generator knows, with consistent bounds: every one must
# get a valid instance.
def _schemas() -> st.SearchStrategy[dict]:
    names = st.text("abcdefgh", min_size=1, max_size=6)
    ints = st.integers(-1000, 1000)

    @st.composite
    def integer(draw):
        out: dict = {"type": "integer"}
        low = draw(st.none() | ints)
        if low is not None:
            out["minimum"] = low
        high = draw(st.none() | st.integers(0, 500))
        if high is not None:
            out["maximum"] = (low or 0) + high
        if draw(st.booleans()):
            out["multipleOf"] = draw(st.integers(1, 4))
            if "maximum" in out:
                out["maximum"] = out.get("minimum", 0) + high + 8
        return out

    @st.composite
    def number(draw):
        low = draw(st.floats(-100, 100, allow_nan=False))
        width = draw(st.floats(0.001, 50))
        key_low = draw(st.sampled_from(["minimum", "exclusiveMinimum"]))
        key_high = draw(st.sampled_from(["maximum", "exclusiveMaximum"]))
        return {"type": "number", key_low: low, key_high: low + width}

    @st.composite
    def string(draw):
        least = draw(st.integers(0, 10))
        out: dict = {"type": "string", "minLength": least, "maxLength": least + draw(st.integers(0, 10))}
        if draw(st.booleans()):
            out = {"type": "string", "format": draw(st.sampled_from(["date", "date-time", "email", "uuid", "ipv4"]))}
        return out

    leaves = (integer() | number() | string() | st.just({"type": "boolean"}) | st.just({"type": "null"})
              | st.lists(st.integers() | st.text(max_size=5), min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v})
              | st.integers().map(lambda v: {"const": v}))  # fmt: skip

    def extend(children):
        def obj(props, required_mask, closed):
            required = [k for k, keep in zip(props, required_mask, strict=False) if keep]
            return {"type": "object", "properties": props, "required": required, "additionalProperties": not closed}

        objects = st.builds(obj, st.dictionaries(names, children, max_size=4), st.lists(st.booleans(), max_size=4), st.booleans())
        arrays = st.builds(lambda item, least, more: {"type": "array", "items": item, "minItems": least, "maxItems": least + more},
                           children, st.integers(0, 3), st.integers(0, 3))  # fmt: skip
        unions = st.builds(lambda a, b: {"anyOf": [a, b]}, children, children)
        nullable = children.map(lambda c: {"anyOf": [c, {"type": "null"}]})
        return objects | arrays | unions | nullable

    tree = st.recursive(leaves, extend, max_leaves=12)
    # $defs at the root ("#/$defs/..." points there), used from a property and an array.
    defs = st.builds(lambda item, other: {"$defs": {"item": item}, "type": "object", "required": ["x"],
                                          "properties": {"x": {"$ref": "#/$defs/item"}, "y": {"type": "array", "items": {"$ref": "#/$defs/item"}},
                                                         "z": other}}, tree, tree)  # fmt: skip
    return tree | defs


@settings(max_examples=300, deadline=None)
@given(_schemas(), st.integers(0, 2**32 - 1))
def test_generated_schemas_get_valid_instances(schema, seed):
    instances = Instances(schema)
    jsonschema.Draft202012Validator(schema).validate(instances.make(seed))


@pytest.mark.parametrize(
    "schema, field",
    [
        ({"type": "string", "pattern": "^[A-Z]+$"}, "pattern"),
        ({"type": "object", "properties": {"code": {"type": "string", "pattern": "x"}}}, "properties.code.pattern"),
        ({"not": {"type": "string"}}, "not"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}, "properties.a.$ref"),
        ({"type": "strnig"}, "type"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "minimum"),
        ({"type": "string", "format": "credit-card"}, "format"),
        ({"type": "object", "required": ["next"], "properties": {"next": {"$ref": "#"}}}, "properties.next.$ref"),
        ({"const": 3, "type": "string"}, "type"),
    ],
)
def test_what_echo_cannot_satisfy_is_refused_naming_the_keyword(schema, field):
    with pytest.raises(Unsatisfiable) as err:
        Instances(schema)
    assert err.value.path == field
    refusal = ECHO.refusal(chat("r", response_format=json_schema_format(schema)))
    assert refusal is not None and refusal.field == f"response_format.json_schema.schema.{field}"
    assert "echo" in refusal.message("echo")


def test_response_schema_alone_is_honoured_on_every_endpoint():
    schema = SCHEMAS[0]
    for endpoint, body in [
        ("/v1/completions", {"model": "m", "prompt": "hello"}),
        ("/v1/messages", {"model": "m", "max_tokens": 10, "messages": USER}),
    ]:
        outcome = ECHO.outcome(Request("x", endpoint, body, response_schema=schema))
        assert outcome.ok, outcome.error_message
        jsonschema.validate(jsonschema_loads(outcome.text), schema)


def test_each_endpoint_names_its_schema_its_own_way():
    schema = SCHEMAS[0]
    responses = Request("x", "/v1/responses", {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "o", "schema": schema}}})
    body = Response.model_validate(ECHO.outcome(responses).response)
    jsonschema.validate(jsonschema_loads(body.output_text), schema)
    messages = Request("x", "/v1/messages", {"model": "m", "max_tokens": 9, "messages": USER,
                                             "output_config": {"format": {"type": "json_schema", "schema": schema}}})  # fmt: skip
    message = Message.model_validate(ECHO.outcome(messages).response)
    jsonschema.validate(jsonschema_loads(message.content[0].text), schema)
    assert message.stop_reason == "end_turn"
    anything = ECHO.outcome(chat("x", response_format={"type": "json_object"}))
    assert jsonschema_loads(anything.text) == {"echo": USER[0]["content"]}


def test_every_response_format_the_sdk_declares_is_honoured():
    # Generated from the SDK's own union: a format the SDK adds is caught here.
    for fmt in typing.get_args(completion_create_params.ResponseFormat):
        (kind,) = typing.get_args(typing.get_type_hints(fmt)["type"])
        body = {"type": kind}
        if kind == "json_schema":
            body["json_schema"] = {"name": "o", "schema": SCHEMAS[0]}
        assert ECHO.refusal(chat("f", response_format=body)) is None, kind


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 2},
                                            "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit"], "additionalProperties": False}  # fmt: skip
TIME = {"type": "object", "properties": {"zone": {"type": "string", "format": "date"}}, "required": ["zone"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "time", "parameters": TIME}}]  # fmt: skip


def _args(call) -> dict:
    return jsonschema_loads(call.function.arguments)


def test_a_required_tool_call_is_valid_against_the_tools_parameters():
    schemas = {"weather": WEATHER, "time": TIME}
    names = set()
    for cid in IDS:
        outcome = ECHO.outcome(chat(cid, tools=CHAT_TOOLS, tool_choice="required"))
        assert outcome.ok and outcome.finish_reason == "tool_calls" and outcome.text == ""
        choice = ChatCompletion.model_validate(outcome.response).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        jsonschema.validate(_args(call), schemas[call.function.name])
        expected = ["weather", "time"][zlib.crc32(cid.encode()) % 2]
        assert call.function.name == expected
        names.add(call.function.name)
    assert names == {"weather", "time"}


def test_a_named_or_allowed_tool_is_the_one_called():
    named = {"type": "function", "function": {"name": "time"}}
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "weather"}}]}}
    for choice, name in [(named, "time"), (allowed, "weather")]:
        for cid in IDS[:10]:
            (call,) = ChatCompletion.model_validate(ECHO.outcome(chat(cid, tools=CHAT_TOOLS, tool_choice=choice)).response).choices[0].message.tool_calls
            assert call.function.name == name


def test_tools_without_a_required_call_answer_text():
    for choice in [None, "auto", "none", {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}]:
        extra = {} if choice is None else {"tool_choice": choice}
        outcome = ECHO.outcome(chat("t", tools=CHAT_TOOLS, parallel_tool_calls=False, **extra))
        assert outcome.ok and outcome.text == USER[0]["content"] and outcome.finish_reason == "stop"
        assert "tool_calls" not in outcome.response["choices"][0]["message"]


def test_every_tool_choice_literal_the_sdk_declares_is_honoured():
    literals = [a for arm in typing.get_args(ChatCompletionToolChoiceOptionParam) for a in typing.get_args(arm) if isinstance(a, str)]
    assert set(literals) >= {"none", "auto", "required"}
    for literal in literals:
        assert ECHO.refusal(chat("t", tools=CHAT_TOOLS, tool_choice=literal)) is None, literal


def test_responses_and_messages_tool_calls_in_their_own_shapes():
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER, "strict": True}]
    for choice in ["required", {"type": "function", "name": "weather"}]:
        req = Request("r", "/v1/responses", {"model": "m", "input": "hi", "tools": tools, "tool_choice": choice})
        body = Response.model_validate(ECHO.outcome(req).response)
        (item,) = body.output
        assert item.type == "function_call" and item.name == "weather"
        jsonschema.validate(jsonschema_loads(item.arguments), WEATHER)
    tools = [{"name": "weather", "description": "d", "input_schema": WEATHER}]
    for choice in [{"type": "any"}, {"type": "tool", "name": "weather", "disable_parallel_tool_use": True}]:
        req = Request("r", "/v1/messages", {"model": "m", "max_tokens": 20, "messages": USER, "tools": tools, "tool_choice": choice})
        message = Message.model_validate(ECHO.outcome(req).response)
        (block,) = message.content
        assert block.type == "tool_use" and block.name == "weather" and message.stop_reason == "tool_use"
        jsonschema.validate(block.input, WEATHER)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}], "tool_choice": "auto"}, "tools[0].type"),
        ({"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "objct"}}}]}, "tools[0].function.parameters.type"),
        ({"tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "string", "pattern": "a"}}}],
          "tool_choice": "required"}, "tools[0].function.parameters.pattern"),
        ({"tools": CHAT_TOOLS + CHAT_TOOLS[:1]}, "tools"),
        ({"response_format": {"type": "grammar", "grammar": "x"}}, "response_format.type"),
        ({"logprobs": True}, "logprobs"),
        ({"n": 0}, "n"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)  # fmt: skip
def test_what_echo_cannot_honour_is_refused_by_name(body, field):
    refusal = ECHO.refusal(chat("r", **body))
    assert refusal is not None and refusal.field == field, refusal
    assert not ECHO.outcome(chat("r", **body)).ok


def test_endpoint_specific_refusals():
    responses = Request("r", "/v1/responses", {"model": "m", "input": "hi", "text": {"verbosity": "low"}})
    assert ECHO.refusal(responses).field == "text.verbosity"
    hosted = Request("r", "/v1/responses", {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert ECHO.refusal(hosted).field == "tools[0].type"
    effort = Request("r", "/v1/messages", {"model": "m", "max_tokens": 5, "messages": USER, "output_config": {"effort": "low"}})
    assert ECHO.refusal(effort).field == "output_config.effort"
    server_tool = Request("r", "/v1/messages", {"model": "m", "max_tokens": 5, "messages": USER,
                                                "tools": [{"type": "web_search_20250305", "name": "web_search"}]})  # fmt: skip
    assert ECHO.refusal(server_tool).field == "tools[0].type"


def test_n_choices_are_deterministic_and_each_valid():
    outcome = ECHO.outcome(chat("n", n=4, seed=3, top_p=0.5, response_format=json_schema_format(SCHEMAS[1])))
    body = ChatCompletion.model_validate(outcome.response)
    assert [c.index for c in body.choices] == [0, 1, 2, 3]
    for c in body.choices:
        jsonschema.validate(jsonschema_loads(c.message.content), SCHEMAS[1])
    assert body.choices[0].message.content == chat_answer("n", SCHEMAS[1])  # choice 0 is the n = 1 answer
    assert len({c.message.content for c in body.choices}) > 1
    assert outcome.usage.output_tokens == sum(-(-len(c.message.content) // 4) for c in body.choices)
    texts = Completion.model_validate(ECHO.outcome(Request("c", "/v1/completions", {"model": "m", "prompt": "hi", "n": 2})).response)
    assert [c.text for c in texts.choices] == ["hi", "hi"]


def test_plain_answers_have_their_endpoints_shape():
    assert ChatCompletion.model_validate(ECHO.outcome(chat("p")).response).choices[0].message.content == USER[0]["content"]
    message = Message.model_validate(ECHO.outcome(Request("p", "/v1/messages", {"model": "m", "max_tokens": 5, "messages": USER})).response)
    assert message.content[0].text == USER[0]["content"][:20] and message.usage.output_tokens == 5
    response = Response.model_validate(ECHO.outcome(Request("p", "/v1/responses", {"model": "m", "input": "hey"})).response)
    assert response.output_text == "hey" and response.status == "completed"


def test_answer_message_echoes_even_where_json_is_asked():
    route = EchoRoute({"answer": "message"})
    outcome = route.outcome(chat("m", response_format=json_schema_format({"type": "string", "pattern": "x"})))
    assert outcome.ok and outcome.text == USER[0]["content"]
    with pytest.raises(Exception, match="answer"):
        EchoRoute({"answer": "random"})
