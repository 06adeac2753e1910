"""Gemini bodies in snake_case (issue 33, item 7): Google's proto3-JSON parser takes every
field's snake_case name, so lowtide does too, writing the top-level and `generationConfig`
keys in camelCase once (core/gemini.py `camel_body`, docs/gemini.md "Field names"). The
cases are every field the installed google-genai SDK writes, in its snake_case form."""

from __future__ import annotations

import re

import pytest

from lowtide.core.endpoints import GEMINI
from lowtide.core.gemini import camel, camel_body, rest_keys
from lowtide.core.spec import check_params
from lowtide.core.types import Request
from lowtide.routes import create_route
from lowtide.routes.gemini.batch import request_line
from lowtide.routes.gemini.names import named_body

TOP, GENERATION = rest_keys()
CONTENTS = [{"role": "user", "parts": [{"text": "hi"}]}]


def snake(name: str) -> str:
    return re.sub(r"([A-Z])", r"_\1", name).lower()


SNAKE_TOP = sorted(k for k in TOP if snake(k) != k)
SNAKE_GENERATION = sorted(k for k in GENERATION if snake(k) != k)


def test_the_sdk_gives_snake_case_cases_at_both_levels():
    assert {"systemInstruction", "generationConfig", "safetySettings"} <= set(SNAKE_TOP)
    assert {"maxOutputTokens", "responseMimeType", "topP"} <= set(SNAKE_GENERATION)
    assert all(camel(snake(k)) == k for k in TOP | GENERATION)


@pytest.fixture
def route(monkeypatch):
    monkeypatch.setenv("LOWTIDE_TEST_PROVIDER_KEY", "test-key")
    return create_route("gemini-batch", {"base_url": "http://127.0.0.1:9", "api_key_env": "LOWTIDE_TEST_PROVIDER_KEY"})


@pytest.mark.parametrize("key", SNAKE_TOP)
def test_every_top_level_field_is_taken_under_its_snake_case_name(route, key):
    value = {"temperature": 0.5} if key == "generationConfig" else {"x": 1}
    body = {"model": "gemini-2.5-flash", "contents": CONTENTS, snake(key): value}
    assert route.refusal(Request("r-1", GEMINI, body)) is None
    sent = named_body(Request("r-1", GEMINI, body), route.name)
    assert sent[key] == value and snake(key) not in sent
    assert request_line(Request("r-1", GEMINI, body), sent)["request"][key] == value


@pytest.mark.parametrize("key", SNAKE_GENERATION)
def test_every_generation_config_field_is_taken_under_its_snake_case_name(route, key):
    for config_key in ("generation_config", "generationConfig"):
        body = {"model": "gemini-2.5-flash", "contents": CONTENTS, config_key: {snake(key): 7}}
        assert route.refusal(Request("r-1", GEMINI, body)) is None
        assert named_body(Request("r-1", GEMINI, body), route.name)["generationConfig"] == {key: 7}


def test_what_lies_deeper_is_never_renamed_and_a_camel_case_body_is_kept_as_it_is():
    schema = {"type": "object", "properties": {"first_name": {"type": "string"}}}
    body = {"contents": CONTENTS, "generation_config": {"response_json_schema": schema, "max_output_tokens": 5}}
    named = camel_body(body)
    assert named == {"contents": CONTENTS, "generationConfig": {"responseJsonSchema": schema, "maxOutputTokens": 5}}
    camel_case = {"contents": CONTENTS, "generationConfig": {"maxOutputTokens": 5}}
    assert camel_body(camel_case) is camel_case


def test_a_field_under_both_names_is_refused_by_name(route):
    body = {"contents": CONTENTS, "systemInstruction": {"parts": [{"text": "a"}]}, "system_instruction": {"parts": [{"text": "b"}]}}
    refused = route.refusal(Request("r-1", GEMINI, body))
    assert refused is not None and refused.field == "system_instruction" and "systemInstruction a second time" in refused.reason
    config = {"contents": CONTENTS, "generationConfig": {"topP": 0.5, "top_p": 0.9}}
    assert route.refusal(Request("r-1", GEMINI, config)).field == "generationConfig.top_p"


def test_a_gemini_jobs_params_are_normalised_once_in_the_spec():
    assert check_params({"generation_config": {"max_output_tokens": 5}}, GEMINI, route="gemini-batch") == {
        "generationConfig": {"maxOutputTokens": 5}
    }
