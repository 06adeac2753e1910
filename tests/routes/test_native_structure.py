"""What lowtide checks, it asks for (issue 33, items 1-2): a job's `response_schema` and
`choices` go in each endpoint's own structured-output field, in the shape the official SDKs'
request types declare; serve's echo honours those fields, so a choices job dry-runs through
serve on every batch route with no failure and no repair."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from pydantic import TypeAdapter

from lowtide.core.clock import SystemClock
from lowtide.core.endpoints import CHAT, GEMINI, MESSAGES, RESPONSES
from lowtide.core.errors import SpecError
from lowtide.core.outputs import InvalidOutput, parse_output
from lowtide.core.types import Request
from lowtide.engine.loader import check_job, load_job, request_base
from lowtide.routes.anthropic.translate import chat_to_messages
from lowtide.routes.own.echo import EchoRoute
from lowtide.store.db import Store
from lowtide.store.schema import attempts, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, _options, _run

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
LABELS = ["billing", "technical", "account", "shipping", "feedback"]
GEMINI_MODEL = "gemini-2.5-flash"


def choice_schema(choices):
    from lowtide.core.native_schema import choice_schema

    return choice_schema(choices)


def strict_problem(schema):
    from lowtide.core.native_schema import strict_problem

    return strict_problem(schema)


def _spec(tmp_path, **more):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    return make_spec(source, **more)


# The body's field, checked against the SDK's own request type for it -----------------------
def _openai_format():
    from openai.types.chat.completion_create_params import ResponseFormat

    return TypeAdapter(ResponseFormat)


def _responses_text():
    from openai.types.responses.response_text_config_param import ResponseTextConfigParam

    return TypeAdapter(ResponseTextConfigParam)


def _output_config():
    from anthropic.types.output_config_param import OutputConfigParam

    return TypeAdapter(OutputConfigParam)


@pytest.mark.parametrize("asked", [{"response_schema": SCHEMA}, {"choices": LABELS}], ids=["schema", "choices"])
def test_chat_asks_in_response_format_as_openais_type_declares(tmp_path, asked):
    base = request_base(_spec(tmp_path, route="openai-batch", route_options={"api_key_env": KEY_ENV}, **asked))
    fmt = base["response_format"]
    _openai_format().validate_python(fmt, strict=False)
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    want = SCHEMA if "response_schema" in asked else choice_schema(LABELS)
    assert fmt["json_schema"]["schema"] == want


@pytest.mark.parametrize("asked", [{"response_schema": SCHEMA}, {"choices": LABELS}], ids=["schema", "choices"])
def test_responses_asks_in_text_format_as_openais_type_declares(tmp_path, asked):
    base = request_base(_spec(tmp_path, route="openai-batch", route_options={"api_key_env": KEY_ENV}, endpoint=RESPONSES,
                              params={"max_output_tokens": 64}, **asked))  # fmt: skip
    _responses_text().validate_python(base["text"], strict=False)
    assert base["text"]["format"]["type"] == "json_schema" and base["text"]["format"]["strict"] is True


@pytest.mark.parametrize("asked", [{"response_schema": SCHEMA}, {"choices": LABELS}], ids=["schema", "choices"])
def test_messages_ask_in_output_config_as_anthropics_type_declares(tmp_path, monkeypatch, asked):
    monkeypatch.setenv(KEY_ENV, "k")
    spec = _spec(tmp_path, route="anthropic-batch", route_options={"api_key_env": KEY_ENV}, **asked)
    assert spec.request_endpoint == MESSAGES
    base = request_base(spec)
    _output_config().validate_python(base["output_config"], strict=False)
    fmt = base["output_config"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["type"] == "object"


def test_a_chat_body_for_anthropic_carries_its_format_as_output_config():
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA, "strict": True}}}  # fmt: skip
    out = chat_to_messages(body)
    _output_config().validate_python(out["output_config"], strict=False)
    assert out["output_config"]["format"]["schema"]["properties"].keys() == SCHEMA["properties"].keys()
    refused = chat_to_messages(body | {"response_format": {"type": "json_object"}})
    assert refused.field == "response_format.type"


def test_params_that_set_a_format_win(tmp_path):
    own = {"type": "json_schema", "json_schema": {"name": "mine", "schema": SCHEMA}}
    base = request_base(_spec(tmp_path, params={"max_tokens": 64, "response_format": own}, choices=LABELS))
    assert base["response_format"] == own


def test_gemini_bodies_ask_with_response_json_schema_or_an_enum(tmp_path):
    from google.genai import types

    from lowtide.core.native_schema import Ask, gemini_config, with_ask

    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 5}}
    for ask in (Ask(SCHEMA), Ask(choice_schema(LABELS), tuple(LABELS))):
        config = with_ask(body, GEMINI, ask)["generationConfig"]
        assert config["maxOutputTokens"] == 5 and config.items() >= gemini_config(ask).items()
        types.GenerationConfig.model_validate(config)  # the SDK's own type takes it (camelCase aliases)
    mine = body | {"generationConfig": {"responseMimeType": "text/plain"}}
    assert with_ask(mine, GEMINI, Ask(SCHEMA)) == mine


def test_strict_where_openais_rules_allow_it_else_not(tmp_path):
    assert strict_problem(SCHEMA) is None
    assert "additionalProperties" in strict_problem({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    assert "required" in strict_problem(SCHEMA | {"required": ["name"]})
    assert "minLength" in strict_problem(SCHEMA | {"properties": {"name": {"type": "string", "minLength": 2}, "age": {"type": "integer"}}})
    deep: dict = {"type": "string"}
    for _ in range(11):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"], "additionalProperties": False}
    assert "deeper" in strict_problem(deep)
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = request_base(_spec(tmp_path, response_schema=loose))["response_format"]
    assert fmt["json_schema"]["strict"] is False  # the relaxed form OpenAI documents, never a per-line 400


def test_a_schema_with_no_object_root_is_not_sent_natively(tmp_path):
    base = request_base(_spec(tmp_path, response_schema={"type": "array", "items": {"type": "string"}}))
    assert "response_format" not in base  # OpenAI takes an object root only: checked after, as before


def test_the_choice_is_read_unwrapped():
    assert parse_output('{"choice": "billing"}', None, LABELS) == "billing"
    assert parse_output("billing", None, LABELS) == "billing"
    with pytest.raises(InvalidOutput):  # only the wrapper alone is read as the choice
        parse_output('{"choice": "x", "more": 1}', None, ["x", "y"])


def test_choices_and_a_schema_together_are_refused_naming_both(tmp_path):
    spec = _spec(tmp_path, choices=LABELS, response_schema=SCHEMA)
    with pytest.raises(SpecError, match="choices and response_schema are both set"):
        check_job(spec)


def test_an_output_limit_too_short_for_the_choice_json_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    spec = _spec(tmp_path, choices=LABELS, params={"max_tokens": 4}, route="openai-batch", route_options={"api_key_env": KEY_ENV})
    with pytest.raises(SpecError, match=r"output limit of 4 .*route openai-batch.*Raise the limit to 9"):
        check_job(spec)
    check_job(_spec(tmp_path, choices=LABELS, params={"max_tokens": 4}))  # echo answers the choice itself


# Chat -> Anthropic translation (issue 33 item 7) ---------------------------------------------
def test_both_output_limits_are_refused_naming_both():
    body = {"model": "m", "max_tokens": 500, "max_completion_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    refused = chat_to_messages(body)
    assert refused.field == "max_completion_tokens" and "max_tokens" in refused.reason


def test_a_file_parts_filename_becomes_the_documents_title():
    part = {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQK", "filename": "q3.pdf"}}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [part]}]}
    block = chat_to_messages(body)["messages"][0]["content"][0]
    assert block["type"] == "document" and block["title"] == "q3.pdf"
    from anthropic.types.document_block_param import DocumentBlockParam

    TypeAdapter(DocumentBlockParam).validate_python(block, strict=False)


# echo honours each native form ---------------------------------------------------------------
def test_echo_answers_geminis_enum_and_schema_asks():
    echo = EchoRoute({})
    contents = [{"role": "user", "parts": [{"text": "my parcel: shipping is late"}]}]
    enum = {"responseMimeType": "text/x.enum", "responseSchema": {"type": "STRING", "enum": LABELS}}
    out = echo.outcome(Request("a", GEMINI, {"model": "g", "contents": contents, "generationConfig": enum}))
    assert out.ok and out.text == "shipping"
    obj = {"responseMimeType": "application/json",
           "responseSchema": {"type": "OBJECT", "properties": {"n": {"type": "INTEGER"}}, "required": ["n"]}}  # fmt: skip
    out = echo.outcome(Request("a", GEMINI, {"model": "g", "contents": contents, "generationConfig": obj}))
    assert out.ok and isinstance(parse_output(out.text, {"type": "object", "required": ["n"]}, None)["n"], int)


def test_echo_answers_the_choice_schema_with_the_choice_the_message_names():
    body = {"model": "m", "messages": [{"role": "user", "content": "about billing"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": choice_schema(LABELS), "strict": True}}}  # fmt: skip
    out = EchoRoute({}).outcome(Request("a", CHAT, body))
    assert out.text == '{"choice":"billing"}'


# A choices job through serve on every batch route: no failure, no repair ----------------------
@pytest.mark.parametrize("route", ["openai-batch", "anthropic-batch", "gemini-batch"])
def test_a_choices_job_dry_runs_through_serve_on_every_batch_route(route, serve, tmp_path):
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    options = _options(route, url) if route != "gemini-batch" else {"base_url": url, "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2]}
    model = {"gemini-batch": GEMINI_MODEL}.get(route, "test-model")
    spec = make_spec(source, route=route, route_options=options, model=model, choices=LABELS, params={"max_tokens": 16},
                     template={"system": "Answer with the category only.", "user": "Ticket: {{ body }}"})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 10}
    with store.begin() as conn:
        outputs = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.output)).all())
        repairs = conn.execute(sa.select(sa.func.count()).where(requests.c.repair.is_not(None))).scalar_one()
        tries = conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one()
    assert outputs["T1003"] == "shipping"  # the bare choice, whatever wrapper the route asked in
    assert repairs == 0 and tries == 10  # one paid attempt each


def test_local_scores_the_choices_its_body_asks_for_as_json(tmp_path):
    from lowtide.routes.own.local.honours import refusal

    messages = [{"role": "user", "content": "hi"}]
    body = request_base(_spec(tmp_path, route="local", model="smollm2-135m-instruct", choices=LABELS)) | {"messages": messages}
    assert refusal(Request("a", CHAT, body, LABELS)) is None  # lowtide's own ask: the scoring honours it
    other = body | {"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}}
    assert refusal(Request("a", CHAT, other, LABELS)).field == "response_format.json_schema.schema"
