"""Nothing a batch line or a real-time body says is lost (DESIGN invariant 8): every field
reaches an upstream of the same protocol exactly as sent (only `--model` changes the model),
the upstream's whole answer comes back, and lowtide's own engines refuse what they cannot
honour per line, naming the field and the route, in the provider's error shape."""

from __future__ import annotations

import copy
import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import (
    chat_line,
    create_batch,
    file_lines,
    message_request,
    upload,
    wait_anthropic,
    wait_openai,
)

TOOL = {"type": "function", "function": {"name": "label", "description": "the ticket's label",
        "parameters": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}}}  # fmt: skip
SCHEMA = {"type": "json_schema", "json_schema": {"name": "out", "strict": True,
          "schema": {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"], "additionalProperties": False}}}  # fmt: skip
# One line per field a user moving a real batch file would send; each must arrive exactly.
RICH = {
    "response_format": {"response_format": SCHEMA},
    "tools": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "label"}}},
    "seed": {"seed": 7, "top_p": 0.9},
    "logprobs": {"logprobs": True, "top_logprobs": 2},
    "max_completion_tokens": {"max_completion_tokens": 33},
    "reasoning_effort": {"reasoning_effort": "low", "max_completion_tokens": 500},
    "penalties": {"frequency_penalty": 0.5, "presence_penalty": -0.5, "stop": ["###"], "n": 2},
    "multimodal": {"messages": [{"role": "developer", "content": "label it"}, {"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
    "vllm": {"guided_json": {"type": "object"}, "top_k": 5, "min_p": 0.1},
}  # fmt: skip


def canonical(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def rich_lines(model: str = "gpt-asked") -> list[dict]:
    return [chat_line(name, f"ticket {name}", model=model) | {"body": {"model": model, "messages": [
        {"role": "user", "content": f"ticket {name}"}]} | fields} for name, fields in RICH.items()]  # fmt: skip


@pytest.mark.parametrize("model", [None, "served-model"], ids=["as-asked", "model-option"])
def test_every_field_of_a_batch_line_reaches_an_openai_compatible_upstream_exactly(serve, capture, model):
    options = {"base_url": capture.url, "concurrency": 4}
    with serve(backend="openai-compatible", route_options=options, model=model) as s:
        client = s.openai()
        lines = rich_lines()
        done = wait_openai(client, create_batch(client, copy.deepcopy(lines)).id)
        out = {line["custom_id"]: line["response"]["body"] for line in file_lines(client, done.output_file_id)}
        errors = file_lines(client, done.error_file_id)
    arrived = {canonical(b["messages"]): b for b in capture.bodies}
    for line in lines:  # each body arrived exactly as sent: nothing dropped, rewritten or invented
        body = line["body"]
        assert arrived.get(canonical(body["messages"])) == body | {"model": model or "gpt-asked"}, line["custom_id"]
    assert len(capture.bodies) == len(lines) and not errors
    assert all("max_tokens" not in b for b in capture.bodies)  # no limit is invented
    # The output line is the upstream's whole answer, naming the model the line asked for.
    answer = out["tools"]
    assert answer["model"] == "gpt-asked" and answer["system_fingerprint"] == "fp_up" and answer["service_tier"] == "default"
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "label", "arguments": '{"label": "bug"}'}
    assert answer["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    assert openai.types.chat.ChatCompletion.model_validate(answer).choices[0].finish_reason == "tool_calls"


def test_max_completion_tokens_is_not_rewritten_and_no_limit_is_invented(serve, capture):
    with serve(backend="openai-compatible", route_options={"base_url": capture.url, "concurrency": 2}) as s:
        client = s.openai()
        wait_openai(client, create_batch(client, [chat_line("limited", "a", max_completion_tokens=9), chat_line("open", "b")]).id)
    arrived = {b["messages"][0]["content"]: b for b in capture.bodies}
    assert arrived["a"] == {"model": "gpt-test", "messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 9}
    assert arrived["b"] == {"model": "gpt-test", "messages": [{"role": "user", "content": "b"}]}


def test_echo_refuses_what_it_cannot_honour_line_by_line_naming_the_field(server):
    client = server.openai()
    lines = rich_lines() + [chat_line("plain", "just text", model="gpt-asked", max_completion_tokens=3),
                            chat_line("cut", "a ticket longer than the limit", model="gpt-asked", max_completion_tokens=2)]  # fmt: skip
    done = wait_openai(client, create_batch(client, lines).id)
    assert done.status == "completed"
    expected = {"logprobs": "logprobs", "reasoning_effort": "reasoning_effort", "penalties": "frequency_penalty",
                "multimodal": "messages[1].content[1]", "vllm": "guided_json"}  # fmt: skip
    # A token limit under its own name is honoured; so are a schema, a required tool, seed and top_p.
    ran = {"plain", "cut", "max_completion_tokens", "response_format", "tools", "seed"}
    assert done.request_counts.model_dump() == {"total": len(lines), "completed": len(ran), "failed": len(expected)}
    out = {x["custom_id"]: x["response"]["body"] for x in file_lines(client, done.output_file_id)}
    assert set(out) == ran
    answers = {k: openai.types.chat.ChatCompletion.model_validate(b) for k, b in out.items()}  # the SDK's own shape
    assert all(a.model == "gpt-asked" for a in answers.values())
    # Structure asked for is structure answered: an instance of the schema, a call of the named tool.
    schema = SCHEMA["json_schema"]["schema"]
    jsonschema.validate(json.loads(answers["response_format"].choices[0].message.content), schema)
    assert answers["response_format"].choices[0].finish_reason == "stop"
    (call,) = answers["tools"].choices[0].message.tool_calls
    assert call.function.name == "label" and answers["tools"].choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])
    assert answers["seed"].choices[0].message.content == "ticket seed"
    # The finish reason is echo's own: `length` where it cut the answer at the limit.
    assert (answers["cut"].choices[0].message.content, answers["cut"].choices[0].finish_reason) == ("a ticket", "length")
    assert (answers["plain"].choices[0].message.content, answers["plain"].choices[0].finish_reason) == ("just text", "stop")
    errors = {e["custom_id"]: e for e in file_lines(client, done.error_file_id)}
    assert set(errors) == set(expected)
    for custom_id, field in expected.items():
        line = errors[custom_id]
        assert line["error"] is None and line["response"]["status_code"] == 400
        error = line["response"]["body"]["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == field, (custom_id, error)
        assert error["message"].startswith(f"{field}:") and "(route echo)" in error["message"]


def test_a_line_of_the_wrong_type_fails_alone_in_openais_words(server):
    client = server.openai()
    lines = [chat_line("ok"), chat_line("bad", max_tokens="many"), chat_line("flag", temperature=True)]
    done = wait_openai(client, create_batch(client, lines).id)
    errors = {e["custom_id"]: e["response"]["body"]["error"] for e in file_lines(client, done.error_file_id)}
    assert errors["bad"]["param"] == "max_tokens" and errors["bad"]["message"].startswith("Invalid type for 'max_tokens'")
    assert errors["flag"]["param"] == "temperature"
    assert [x["custom_id"] for x in file_lines(client, done.output_file_id)] == ["ok"]


def test_a_messages_line_echo_cannot_honour_is_an_errored_result_naming_it(server):
    client = server.anthropic()
    cached = [{"type": "text", "text": "you label tickets", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    requests = [
        message_request("cached", "hi", system=cached),  # a caching hint changes nothing echo answers
        message_request("tools", "hi", tools=[{"name": "f", "input_schema": schema}], tool_choice={"type": "tool", "name": "f"}),
        message_request("unmakeable", "hi", tools=[{"name": "f", "input_schema": {"type": "string", "pattern": "^a$"}}],
                        tool_choice={"type": "any"}),  # fmt: skip
        message_request("thinking", "hi", thinking={"type": "enabled", "budget_tokens": 1024}),
        message_request("metadata", "hi", metadata={"user_id": "u1"}),
        {"custom_id": "no-max", "params": {"model": "claude-test", "messages": [{"role": "user", "content": "x"}]}},
    ]
    done = wait_anthropic(client, client.messages.batches.create(requests=requests).id)
    assert done.request_counts.succeeded == 2 and done.request_counts.errored == 4
    results = {r.custom_id: r.result for r in client.messages.batches.results(done.id)}
    assert results["cached"].message.content[0].text == "hi"
    called = results["tools"].message  # a required tool is called, with an instance of its input schema
    assert called.stop_reason == "tool_use" and [(b.type, b.name) for b in called.content] == [("tool_use", "f")]
    jsonschema.validate(called.content[0].input, schema)
    for custom_id, field in (("unmakeable", "tools[0].input_schema.pattern"), ("thinking", "thinking"),
                             ("metadata", "metadata"), ("no-max", "max_tokens")):  # fmt: skip
        error = results[custom_id].error.error
        assert error.type == "invalid_request_error" and error.message.startswith(f"{field}:"), (custom_id, error)
    assert "(route echo)" in results["unmakeable"].error.error.message


def test_responses_and_completions_batches_run_on_echo_in_their_own_shapes(server):
    client = server.openai()
    responses = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
                  "body": {"model": "gpt-asked", "input": f"hello {i}", "instructions": "be brief", "max_output_tokens": 50}}
                 for i in range(3)]  # fmt: skip
    file = upload(client, responses)
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/responses", completion_window="24h")
    done = wait_openai(client, batch.id)
    assert done.status == "completed" and done.endpoint == "/v1/responses" and done.request_counts.completed == 3
    for line in file_lines(client, done.output_file_id):
        answer = openai.types.responses.Response.model_validate(line["response"]["body"])
        assert answer.model == "gpt-asked" and answer.output_text == f"hello {line['custom_id'][1:]}"
        assert answer.status == "completed" and answer.usage.output_tokens > 0

    prompts = [{"custom_id": "c0", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "abcdefghijkl", "max_tokens": 1}},
               {"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": ["a", "b"]}}]  # fmt: skip
    file = upload(client, prompts)
    done = wait_openai(client, client.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h").id)
    (line,) = file_lines(client, done.output_file_id)
    answer = openai.types.Completion.model_validate(line["response"]["body"])
    assert (answer.object, answer.choices[0].text, answer.choices[0].finish_reason) == ("text_completion", "abcd", "length")
    (error,) = file_lines(client, done.error_file_id)
    assert error["custom_id"] == "c1" and error["response"]["body"]["error"]["param"] == "prompt"


def test_a_responses_batch_to_an_upstream_keeps_body_and_answer(serve, capture):
    body = {"model": "gpt-asked", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "reasoning": {"effort": "low"}, "text": {"format": {"type": "json_object"}}, "store": False}  # fmt: skip
    with serve(backend="openai-compatible", route_options={"base_url": capture.url, "concurrency": 2}) as s:
        client = s.openai()
        file = upload(client, [{"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": body}])
        done = wait_openai(client, client.batches.create(input_file_id=file.id, endpoint="/v1/responses", completion_window="24h").id)
        (line,) = file_lines(client, done.output_file_id)
    assert capture.bodies == [body]
    assert line["response"]["body"] == capture.answer("responses", body) | {"model": "gpt-asked"}


def test_a_batch_of_an_endpoint_serve_does_not_run_is_refused_clearly(server):
    # (/v1/moderations batches run since b28d2a8: tests/routes/test_moderations.py.)
    client = server.openai()
    file = upload(client, [chat_line("a")])
    with pytest.raises(openai.BadRequestError, match="not /v1/images/generations") as err:
        client.batches.create(input_file_id=file.id, endpoint="/v1/images/generations", completion_window="24h")
    assert err.value.body["param"] == "endpoint"


# Real time ----------------------------------------------------------------------------
def test_a_real_time_body_reaches_the_upstream_verbatim_and_its_answer_comes_back_whole(serve, capture):
    with serve(backend="openai-compatible", route_options={"base_url": capture.url, "concurrency": 2}, model="served") as s:
        client = s.openai()
        answer = client.chat.completions.create(model="gpt-asked", messages=[{"role": "user", "content": "hi"}],
                                                tools=[TOOL], tool_choice="required", seed=3, logprobs=True,
                                                max_completion_tokens=40, extra_body={"top_k": 4})  # fmt: skip
        completion = client.completions.create(model="gpt-asked", prompt="once upon", suffix="end", echo=False)
        response = client.responses.create(model="gpt-asked", input="hi", reasoning={"effort": "low"})
    assert capture.bodies[0] == {"model": "served", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
                                 "tool_choice": "required", "seed": 3, "logprobs": True, "max_completion_tokens": 40, "top_k": 4}  # fmt: skip
    assert capture.bodies[1] == {"model": "served", "prompt": "once upon", "suffix": "end", "echo": False}
    assert capture.bodies[2] == {"model": "served", "input": "hi", "reasoning": {"effort": "low"}}
    assert answer.model == "gpt-asked" and answer.system_fingerprint == "fp_up"
    assert answer.choices[0].message.tool_calls[0].function.name == "label"
    assert completion.id == "cmpl-up2" and completion.choices[0].text == "done"
    assert response.id == "resp_up3" and response.reasoning.effort == "low" and response.model == "gpt-asked"


def test_real_time_on_echo_refuses_by_name_and_answers_responses_and_completions(server):
    client = server.openai()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL], logprobs=True)
    assert err.value.body["param"] == "logprobs" and "(route echo)" in err.value.message
    called = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                            tool_choice="required")  # fmt: skip
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "label" and called.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), TOOL["function"]["parameters"])
    response = client.responses.create(model="m", input="hello there", max_output_tokens=1)
    assert response.output_text == "hell" and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    completion = client.completions.create(model="m", prompt="hello there")
    assert completion.object == "text_completion" and completion.choices[0].text == "hello there"
    answer = httpx.post(f"{server.url}/v1/responses", json={"model": "m", "input": "x", "stream": True})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "stream"
    with pytest.raises(anthropic.BadRequestError, match="metadata"):
        server.anthropic().messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                                           metadata={"user_id": "u"})  # fmt: skip


def test_across_protocols_a_chat_batch_is_translated_and_a_messages_batch_is_refused_by_name(serve, capture, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    with serve(backend="anthropic", route_options={"base_url": capture.url.removesuffix("/v1"), "concurrency": 2}) as s:
        client = s.openai()
        done = wait_openai(client, create_batch(client, [chat_line("a", "hi", max_completion_tokens=20)]).id)
        (line,) = file_lines(client, done.output_file_id)
    # The one chat -> messages mapping (routes/anthropic/translate.py): the limit under Anthropic's name.
    assert capture.bodies == [{"model": "gpt-test", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}]
    answer = openai.types.chat.ChatCompletion.model_validate(line["response"]["body"])  # built: the upstream's is a message
    assert answer.choices[0].message.content == "done" and answer.model == "gpt-test"

    with serve(backend="openai-compatible", route_options={"base_url": capture.url, "concurrency": 2}) as s:
        client = s.anthropic()
        batch = client.messages.batches.create(requests=[message_request("m")])
        (result,) = list(client.messages.batches.results(wait_anthropic(client, batch.id).id))
    assert result.result.type == "errored"
    assert result.result.error.error.message.startswith("endpoint: /v1/messages is not an OpenAI endpoint")
    assert "(route openai-compatible)" in result.result.error.error.message
