"""Anthropic's structured outputs where a model has them, a forced tool where it has not, and
a schema they cannot take refused before anything is sent (issue 33, "What must be true" and
"Bad input")."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from pydantic import TypeAdapter

from lowtide.core.anthropic_schema import schema_problem, sent_schema
from lowtide.core.clock import SystemClock
from lowtide.core.endpoints import MESSAGES
from lowtide.core.errors import SpecError
from lowtide.core.native_schema import FORCED_TOOL, anthropic_structured
from lowtide.core.outputs import parse_output
from lowtide.core.types import Request
from lowtide.engine.loader import check_job, load_job, request_base
from lowtide.routes.anthropic.translate import chat_to_messages
from lowtide.routes.own.echo import EchoRoute
from lowtide.store.db import Store
from lowtide.store.schema import requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, _options, _run

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
NULLABLE = {"type": "object", "properties": {"name": {"type": ["string", "null"]}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "tags"]}  # fmt: skip
OLD_MODEL = "claude-3-5-haiku-20241022"


def _spec(tmp_path, **more):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    more.setdefault("route", "anthropic-batch")
    more.setdefault("route_options", {"api_key_env": KEY_ENV})
    return make_spec(source, **more)


@pytest.mark.parametrize(("model", "has"), [
    ("claude-3-5-haiku-20241022", False), ("claude-3-haiku-20240307", False), ("claude-3-7-sonnet-latest", False),
    ("claude-sonnet-4-20250514", False), ("claude-sonnet-4-0", False), ("claude-opus-4-1-20250805", False),
    ("claude-sonnet-4-5", True), ("claude-sonnet-4-5-20250929", True), ("claude-haiku-4-5", True), ("claude-opus-4-7", True),
    ("claude-sonnet-5", True), ("anthropic.claude-3-5-sonnet-20240620-v1:0", False), ("test-model", True),
])  # fmt: skip
def test_which_models_take_output_config(model, has):
    assert anthropic_structured(model) is has


def test_a_model_without_structured_output_is_asked_through_a_forced_tool(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

    base = request_base(_spec(tmp_path, model=OLD_MODEL, response_schema=SCHEMA))
    assert "output_config" not in base  # the model would refuse it line by line
    assert base["tool_choice"] == {"type": "tool", "name": FORCED_TOOL}
    assert base["tools"][0]["name"] == FORCED_TOOL and base["tools"][0]["input_schema"] == SCHEMA
    TypeAdapter(MessageCreateParamsNonStreaming).validate_python(base | {"messages": []}, strict=False)
    # A current model gets output_config.format, as before.
    current = request_base(_spec(tmp_path, model="claude-sonnet-4-5", response_schema=SCHEMA))
    assert "tools" not in current and current["output_config"]["format"]["type"] == "json_schema"


def test_a_body_with_its_own_tools_or_thinking_is_not_forced(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    tool = {"name": "lookup", "input_schema": {"type": "object", "properties": {}}}
    base = request_base(_spec(tmp_path, model=OLD_MODEL, response_schema=SCHEMA, params={"max_tokens": 64, "tools": [tool]}))
    assert base["tools"] == [tool] and "tool_choice" not in base and "output_config" not in base  # checked after
    thinking = {"type": "enabled", "budget_tokens": 1024}
    base = request_base(_spec(tmp_path, model=OLD_MODEL, response_schema=SCHEMA, params={"max_tokens": 2048, "thinking": thinking}))
    assert "tools" not in base and "output_config" not in base


def test_a_chat_body_for_an_older_claude_is_forced_through_the_tool():
    body = {"model": OLD_MODEL, "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}}  # fmt: skip
    out = chat_to_messages(body)
    assert out["tool_choice"] == {"type": "tool", "name": FORCED_TOOL} and "output_config" not in out
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    refused = chat_to_messages(body | {"tools": [tool]})
    assert refused.field == "response_format" and "Claude 4.5" in refused.reason


def test_the_forced_tools_input_is_the_answer_on_every_path(tmp_path, monkeypatch):
    """echo answers the forced tool with a call; its input is the answer's text (the outcome
    and the export's view), checked against the schema like any JSON answer."""
    from lowtide.core.answers import read_answer, tool_calls
    from lowtide.routes.anthropic.wire import anthropic_outcome

    monkeypatch.setenv(KEY_ENV, "k")
    body = request_base(_spec(tmp_path, model=OLD_MODEL, response_schema=SCHEMA)) | {"messages": [{"role": "user", "content": "Ann, 40"}]}
    out = EchoRoute({}).outcome(Request("a", MESSAGES, body, None, SCHEMA))
    assert out.ok and out.response["content"][0]["type"] == "tool_use"
    parse_output(out.text, SCHEMA, None)  # a valid instance, read from the call
    wire = anthropic_outcome("a", out.response, batch=True)
    assert json.loads(wire.text) == json.loads(out.text)
    assert tool_calls(out.response) == []  # not a tool call of the user's: the answer
    assert json.loads(read_answer(out.response).first.text) == json.loads(out.text)


def test_an_older_claude_with_response_schema_runs_through_serve(serve, tmp_path):
    """On today's parent the job sent `output_config.format` to a model that refuses it:
    every line failed at the provider (serve answers as Anthropic does)."""
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    spec = make_spec(source, route="anthropic-batch", route_options=_options("anthropic-batch", url), model=OLD_MODEL,
                     response_schema=SCHEMA, params={"max_tokens": 64})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 6}
    with store.begin() as conn:
        outputs = conn.execute(sa.select(requests.c.output, requests.c.repair)).all()
    for output, repair in outputs:
        assert repair is None
        assert set(json.loads(output)) == {"name", "age"}


def test_serve_refuses_output_config_for_an_older_claude_as_anthropic_does():
    body = {"model": OLD_MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}  # fmt: skip
    refused = EchoRoute({}).refusal(Request("a", MESSAGES, body))
    assert refused is not None and refused.field == "output_config.format"


# A schema Anthropic's structured outputs cannot take --------------------------------------
def test_a_nullable_type_list_is_sent_as_any_of_and_does_not_crash(tmp_path, monkeypatch):
    """The SDK's transform_schema raised AssertionError on `type: [string, null]`: rc 3
    ("unexpected error") for the commonest nullable field, at the parent."""
    monkeypatch.setenv(KEY_ENV, "k")
    spec = _spec(tmp_path, model="claude-sonnet-4-5", response_schema=NULLABLE)
    check_job(spec)
    sent = request_base(spec)["output_config"]["format"]["schema"]
    assert sent["properties"]["name"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert sent["additionalProperties"] is False
    assert schema_problem(sent) is None


def test_draft_07_definitions_travel_as_defs():
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}}, "required": ["a"],
              "definitions": {"A": {"type": "string"}}}  # fmt: skip
    sent = sent_schema(schema)
    assert sent["properties"]["a"] == {"$ref": "#/$defs/A"} and sent["$defs"] == {"A": {"type": "string"}}
    assert schema_problem(sent) is None


RECURSIVE = {"type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}, "required": ["root"],
             "$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}}  # fmt: skip
MANY_OPTIONAL = {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(25)}}
MANY_UNIONS = {"type": "object", "properties": {f"f{i}": {"type": ["string", "null"]} for i in range(17)},
               "required": [f"f{i}" for i in range(17)]}  # fmt: skip
UNTYPED = {"type": "object", "properties": {"x": {"description": "anything"}}, "required": ["x"]}


@pytest.mark.parametrize(("schema", "named"), [
    (RECURSIVE, "recursive"), (MANY_OPTIONAL, "optional properties"), (MANY_UNIONS, "unions"),
    (UNTYPED, "properties.x: has no type"),
], ids=["recursive", "optional", "unions", "untyped"])  # fmt: skip
def test_a_schema_anthropic_cannot_take_is_refused_at_load_naming_keyword_and_route(tmp_path, monkeypatch, schema, named):
    monkeypatch.setenv(KEY_ENV, "k")
    spec = _spec(tmp_path, model="claude-sonnet-4-5", response_schema=schema)
    with pytest.raises(SpecError) as err:
        check_job(spec, "job.yaml")
    said = str(err.value)
    assert "job.yaml" in said and "response_schema" in said and "anthropic-batch" in said and named in said
    # The same schema through a forced tool (an older model) is not limited: tools are not strict.
    check_job(_spec(tmp_path, model=OLD_MODEL, response_schema=schema))


def test_a_rows_own_output_config_past_the_limits_is_refused_per_row():
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": sent_schema(RECURSIVE)}}}  # fmt: skip
    from lowtide.routes.anthropic.wire import anthropic_refusal

    refused = anthropic_refusal(Request("a", MESSAGES, body))
    assert refused.field == "output_config.format.schema" and "recursive" in refused.reason


# Gemini's one documented refusal ------------------------------------------------------------
GEMINI_RECURSIVE = {"type": "object", "properties": {"root": {"$ref": "#/$defs/Node"}}, "required": ["root"],
                    "$defs": {"Node": {"type": "object", "properties": {"name": {"type": "string"}, "parent": {"$ref": "#/$defs/Node"}},
                                       "required": ["name", "parent"]}}}  # fmt: skip


def test_gemini_refuses_a_recursion_through_a_required_property_at_load(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    spec = _spec(tmp_path, route="gemini-batch", model="gemini-2.5-flash", response_schema=GEMINI_RECURSIVE)
    with pytest.raises(SpecError, match=r"\$defs\.Node\.properties\.parent: a required property.*gemini-batch"):
        check_job(spec, "job.yaml")
    optional = json.loads(json.dumps(GEMINI_RECURSIVE))
    optional["$defs"]["Node"]["required"] = ["name"]
    check_job(_spec(tmp_path, route="gemini-batch", model="gemini-2.5-flash", response_schema=optional))  # Gemini unrolls it
    check_job(_spec(tmp_path, route="gemini-batch", model="gemini-2.5-flash", response_schema=RECURSIVE))  # through an array
