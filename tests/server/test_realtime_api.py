"""Real-time endpoints: `/v1/chat/completions` and `/v1/messages` through the official SDKs,
answered by the backend route (echo: the last user message, cut to max_tokens x 4
characters; usage = characters / 4, rounded up)."""

from __future__ import annotations

import asyncio
import json
import threading

import anthropic
import httpx
import jsonschema
import openai
import pytest

from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Request
from lowtide.routes.own.echo import EchoRoute
from lowtide.server import backend as backend_module
from tests.server.conftest import chat_line, create_batch, file_lines, wait_openai

PROMPT = "  Summarise this ticket:\nthe printer on floor 3 is on fire again.  "


def tokens(text: str) -> int:
    return -(-len(text) // 4)


class Recording(EchoRoute):
    """echo that remembers each `execute` call: its size and the thread it ran on."""

    def __init__(self, dispatch_size: int = 5000) -> None:
        super().__init__({"dispatch_size": dispatch_size})
        self.groups: list[int] = []
        self.threads: set[int] = set()
        self.seen: list[Request] = []

    async def execute(self, requests):
        self.groups.append(len(requests))
        self.seen += requests
        self.threads.add(threading.get_ident())
        for request in requests:
            yield self.outcome(request)


class Picky(EchoRoute):
    """echo that runs one model only, as `local` does."""

    def __init__(self) -> None:
        super().__init__({})

    def check_model(self, model: str) -> None:
        if model != "tiny-1":
            raise RouteError(f'this route runs "tiny-1" only, not "{model}"')


class Moody(EchoRoute):
    """echo that fails as the last user message says: rate, slow, bad, or boom (raises)."""

    def __init__(self) -> None:
        super().__init__({})

    async def execute(self, requests: list[Request]):
        for r in requests:
            word = r.messages[-1]["content"]
            if word == "boom":
                raise RuntimeError("the model fell over")
            codes = {"rate": ("rate_limited", True), "slow": ("timeout", True), "bad": ("invalid_request", False)}
            if word in codes:
                code, retryable = codes[word]
                yield Outcome.failure(r.custom_id, code, f"{code} for {word}", retryable)
            else:
                yield self.outcome(r)


def ask(client: openai.OpenAI, content: str = PROMPT, model: str = "gpt-test", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **kw)


# Answers ------------------------------------------------------------------------------
def test_a_chat_completion_is_echos_answer_with_usage(server):
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    answer = server.openai().chat.completions.create(model="gpt-test", messages=messages, temperature=0, stop=["\n\n"])
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.model == "gpt-test" and isinstance(answer.created, int)
    assert len(answer.choices) == 1
    choice = answer.choices[0]
    assert (choice.index, choice.message.role, choice.message.content, choice.finish_reason) == (0, "assistant", PROMPT, "stop")
    usage = answer.usage
    assert usage.prompt_tokens == tokens("Be brief.") + tokens(PROMPT)
    assert usage.completion_tokens == tokens(PROMPT)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details.reasoning_tokens == 0


def test_max_tokens_cuts_the_answer_and_finishes_with_length(server):
    for kw in ({"max_tokens": 2}, {"max_completion_tokens": 2}):
        answer = ask(server.openai(), **kw)
        assert answer.choices[0].message.content == PROMPT[:8]
        assert answer.choices[0].finish_reason == "length"
    message = server.anthropic().messages.create(model="claude-test", max_tokens=2, messages=[{"role": "user", "content": PROMPT}])
    assert message.content[0].text == PROMPT[:8] and message.stop_reason == "max_tokens"


def test_a_streamed_chat_completion_reassembles_to_the_same_answer(server):
    client = server.openai()
    whole = ask(client)
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content == PROMPT
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])

    plain = list(ask(client, stream=True))  # without include_usage: no usage chunk
    assert all(c.choices and c.usage is None for c in plain)
    assert "".join(c.choices[0].delta.content or "" for c in plain) == PROMPT


def test_an_anthropic_message_is_echos_answer_with_usage(server):
    client = server.anthropic()
    for system in ("You sort tickets.", [{"type": "text", "text": "You sort tickets."}]):
        message = client.messages.create(
            model="claude-test", max_tokens=256, system=system, stop_sequences=["###"], extra_body={"temperature": 0.2},
            messages=[{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
        )  # fmt: skip
        assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
        assert message.model == "claude-test"
        assert [(b.type, b.text) for b in message.content] == [("text", PROMPT)]
        assert message.stop_reason == "end_turn" and message.stop_sequence is None
        u = message.usage
        assert u.input_tokens == sum(map(tokens, ("You sort tickets.", "first", "ok", PROMPT)))
        assert (u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (tokens(PROMPT), 0, 0)


def test_a_streamed_anthropic_message_follows_anthropics_event_sequence(server):
    client = server.anthropic()
    request = {"model": "claude-test", "max_tokens": 256, "messages": [{"role": "user", "content": PROMPT}]}
    raw = httpx.post(f"{server.url}/v1/messages", json=request | {"stream": True}, headers={"x-api-key": "k"})
    assert raw.headers["content-type"].startswith("text/event-stream")
    names = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]

    events = list(client.messages.create(stream=True, **request))  # the SDK leaves pings out
    assert [e.type for e in events if e.type != "content_block_delta"] == [n for n in names if n not in ("ping", "content_block_delta")]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert len(deltas) > 1 and "".join(deltas) == PROMPT
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == tokens(PROMPT)

    with client.messages.stream(**request) as stream:
        assert "".join(stream.text_stream) == PROMPT
        final = stream.get_final_message()
    whole = client.messages.create(**request)
    assert final.content[0].text == whole.content[0].text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens, whole.usage.output_tokens)


def test_echo_answers_structure_where_asked_whole_and_streamed(server):
    tool = {"type": "function", "function": {"name": "label", "parameters": {
        "type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}}}  # fmt: skip
    client = server.openai()
    two = ask(client, n=2)
    assert [c.message.content for c in two.choices] == [PROMPT, PROMPT] and [c.index for c in two.choices] == [0, 1]
    whole = ask(client, tools=[tool], tool_choice="required")
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "label" and whole.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    with client.chat.completions.stream(model="gpt-test", messages=[{"role": "user", "content": PROMPT}], tools=[tool],
                                        tool_choice="required") as stream:  # fmt: skip
        streamed = stream.get_final_completion()
    (again,) = streamed.choices[0].message.tool_calls
    assert again.id.startswith("call_") and again.function.name == "label"  # each call is a new request: its own instance
    jsonschema.validate(json.loads(again.function.arguments), tool["function"]["parameters"])
    assert streamed.choices[0].finish_reason == "tool_calls"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    request = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": "f", "input_schema": schema}], "tool_choice": {"type": "any"}}  # fmt: skip
    message = server.anthropic().messages.create(**request)
    assert message.stop_reason == "tool_use" and message.content[0].type == "tool_use"
    jsonschema.validate(message.content[0].input, schema)
    with server.anthropic().messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert (final.content[0].type, final.content[0].name, final.stop_reason) == ("tool_use", "f", "tool_use")
    jsonschema.validate(final.content[0].input, schema)


# Refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        pytest.param({"messages": None}, "messages", "'messages'", id="missing-messages"),
        pytest.param({"messages": []}, "messages", "non-empty", id="empty-messages"),
        pytest.param({"model": None}, "model", "'model'", id="missing-model"),
        pytest.param({"logprobs": True}, "logprobs", "(route echo)", id="logprobs"),
        pytest.param({"frequency_penalty": 0.5}, "frequency_penalty", "not honoured", id="penalty"),
        pytest.param({"max_completion_tokens": "many"}, "max_completion_tokens", "Invalid type for 'max_completion_tokens'", id="max-tokens-text"),
        pytest.param({"temperature": "hot"}, "temperature", "Invalid type for 'temperature'", id="temperature"),
        pytest.param({"stream_options": {"include_usage": True}}, "stream_options", "'stream'", id="stream-options-alone"),
        pytest.param({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
                     "tools[0].function.parameters", "(route echo)", id="tools"),  # fmt: skip
        pytest.param({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a$"}}}},
                     "response_format.json_schema.schema.pattern", "echo cannot answer it", id="response-format"),  # fmt: skip
        pytest.param({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
                     "messages[0].content[0]", "content part 'input_audio'", id="audio"),  # fmt: skip
        pytest.param({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                     "messages[0].content[0]", "content part 'image_url'", id="image"),  # fmt: skip
        pytest.param({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "role 'tool'", id="tool-role"),
    ],
)
def test_an_invalid_chat_request_is_a_400_naming_the_field(server, change, param, words):
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]} | change
    body = {k: v for k, v in body.items() if v is not None}  # None: leave the field out
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers={"authorization": "Bearer k"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]


def test_the_sdk_sees_bad_requests_as_bad_request_errors(server):
    client = server.openai()
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, logprobs=True)
    assert err.value.status_code == 400 and err.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, max_tokens=True)
    assert "max_tokens" in err.value.message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        pytest.param({"max_tokens": None}, "max_tokens: Field required", id="missing-max-tokens"),
        pytest.param({"max_tokens": "many"}, "Invalid type for 'max_tokens'", id="max-tokens-text"),
        pytest.param({"messages": None}, "messages: Field required", id="missing-messages"),
        pytest.param({"top_k": 5}, "top_k", id="top-k"),
        pytest.param({"tools": [{"name": "f", "input_schema": {"type": "string", "pattern": "^a$"}}], "tool_choice": {"type": "any"}},
                     "tools[0].input_schema.pattern", id="tools"),  # fmt: skip
        pytest.param({"stream": "yes"}, "stream", id="stream-not-a-flag"),
    ],
)
def test_an_invalid_message_request_is_anthropics_400(server, change, words):
    body = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]} | change
    body = {k: v for k, v in body.items() if v is not None}  # None: leave the field out
    answer = httpx.post(f"{server.url}/v1/messages", json=body, headers={"x-api-key": "k"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"
    assert words in answer.json()["error"]["message"]


def test_a_body_that_is_not_json_is_refused(server):
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]["message"]


def test_a_model_the_backend_does_not_run_is_a_404(serve):
    with serve(routes={"echo": Picky()}) as s:
        with pytest.raises(openai.NotFoundError) as err:
            ask(s.openai(), model="gpt-4o")
        assert err.value.body["code"] == "model_not_found" and '"tiny-1" only' in err.value.message
        with pytest.raises(anthropic.NotFoundError) as aerr:
            s.anthropic().messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert aerr.value.body["error"]["type"] == "not_found_error"
        assert ask(s.openai(), model="tiny-1").choices[0].message.content == PROMPT


def test_the_model_option_maps_every_request_onto_one_backend_model(serve):
    with serve(routes={"echo": Picky()}, model="tiny-1") as s:
        answer = ask(s.openai(), model="gpt-4o")
        assert answer.model == "gpt-4o" and answer.choices[0].message.content == PROMPT
        message = s.anthropic().messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        assert message.model == "claude-x" and message.content[0].text == "hi"


def test_the_request_reaches_the_route_verbatim(serve):
    route = Recording()
    with serve(routes={"echo": route}) as s:
        ask(s.openai(), max_completion_tokens=77, temperature=0.5, stop="END", stream=True)
        ask(s.openai())
        s.anthropic().messages.create(model="claude-test", max_tokens=9, system=[{"type": "text", "text": "sys"}],
                                      stop_sequences=["x", "y"], messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    first, second, third = route.seen
    assert first.endpoint == "/v1/chat/completions"  # stream is this server's own to do: not in the body
    assert first.body == {"model": "gpt-test", "messages": [{"role": "user", "content": PROMPT}],
                          "max_completion_tokens": 77, "temperature": 0.5, "stop": "END"}  # fmt: skip
    assert second.body == {"model": "gpt-test", "messages": [{"role": "user", "content": PROMPT}]}  # no limit invented
    assert third.endpoint == "/v1/messages"
    assert third.body == {"model": "claude-test", "max_tokens": 9, "system": [{"type": "text", "text": "sys"}],
                          "stop_sequences": ["x", "y"], "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    assert len({r.custom_id for r in route.seen}) == 3


def test_a_failed_outcome_is_the_matching_http_error(serve):
    with serve(routes={"echo": Moody()}) as s:
        client, messages = s.openai(), s.anthropic()
        with pytest.raises(openai.RateLimitError) as rate:
            ask(client, "rate")
        assert rate.value.body["code"] == "rate_limit_exceeded"
        with pytest.raises(openai.BadRequestError):
            ask(client, "bad")
        with pytest.raises(openai.InternalServerError) as slow:
            ask(client, "slow")
        assert slow.value.status_code == 504
        with pytest.raises(openai.InternalServerError) as boom:
            ask(client, "boom")
        assert boom.value.status_code == 500 and "the model fell over" in boom.value.message
        with pytest.raises(anthropic.RateLimitError):
            messages.messages.create(model="c", max_tokens=8, messages=[{"role": "user", "content": "rate"}])
        assert ask(client, "fine").choices[0].message.content == "fine"  # the server carries on


def test_a_batch_backend_says_real_time_needs_a_direct_one(serve):
    with serve(backend="echo-batch") as s:
        with pytest.raises(openai.APIStatusError) as err:
            ask(s.openai())
        assert err.value.status_code == 501 and err.value.response.headers["x-should-retry"] == "false"
        assert "needs a direct backend" in err.value.message and "echo-batch" in err.value.message
        with pytest.raises(anthropic.APIStatusError) as aerr:
            s.anthropic().messages.create(model="c", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert aerr.value.status_code == 501 and "needs a direct backend" in aerr.value.message
        batch = wait_openai(s.openai(), create_batch(s.openai(), [chat_line("a")]).id)  # batches still run
        assert batch.status == "completed"


# The server around them ---------------------------------------------------------------
def test_api_keys_are_enforced(serve):
    with serve(api_keys=("k1",)) as s:
        with pytest.raises(openai.AuthenticationError):
            ask(s.openai(key="wrong"))
        with pytest.raises(anthropic.AuthenticationError):
            s.anthropic(key="wrong").messages.create(model="c", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert ask(s.openai(key="k1")).choices[0].message.content == PROMPT
        message = s.anthropic(key="k1").messages.create(model="c", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "hi"


def test_faults_apply_to_the_real_time_endpoints(serve, fault_plan):
    plan = fault_plan({"http": [
        {"match": "POST /v1/chat/completions", "first": 1, "status": 429, "retry_after": 2},
        {"match": "POST /v1/chat/completions", "calls": [2], "status": 500},
        {"match": "POST /v1/messages", "calls": [1], "status": 529},
        {"match": "POST /v1/messages", "calls": [2], "delay": 1},
    ]})  # fmt: skip
    with serve(faults=plan) as s:
        client = s.openai()
        with pytest.raises(openai.RateLimitError) as err:
            ask(client)
        assert err.value.response.headers["retry-after"] == "2" and err.value.body["code"] == "rate_limit_exceeded"
        with pytest.raises(openai.InternalServerError):
            ask(client)
        assert ask(client).choices[0].message.content == PROMPT

        request = {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(anthropic.InternalServerError) as overloaded:
            s.anthropic().messages.create(**request)
        assert overloaded.value.status_code == 529 and overloaded.value.body["error"]["type"] == "overloaded_error"
        with pytest.raises(anthropic.APITimeoutError):
            s.anthropic(timeout=0.2).messages.create(**request)
        assert s.anthropic().messages.create(**request).content[0].text == "hi"


def test_many_concurrent_requests_run_as_one_group_each_answered_with_its_own(serve, monkeypatch):
    n = 200
    route = Recording(dispatch_size=n)
    # A window far longer than the test: the group is flushed by size, never by the clock.
    monkeypatch.setattr(backend_module, "WINDOW", 600.0)
    with serve(routes={"echo": route}) as s:

        async def main() -> list[tuple[str, str]]:
            async with openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key="k", max_retries=0) as client:

                async def one(i: int) -> tuple[str, str]:
                    prompt = f"request {i}: what is {i} x 7?"
                    answer = await client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": prompt}])
                    return prompt, answer.choices[0].message.content

                return await asyncio.gather(*(one(i) for i in range(n)))

        pairs = asyncio.run(main())
    assert len(pairs) == n and all(prompt == answer for prompt, answer in pairs)
    assert route.groups == [n]


def test_requests_from_threads_are_grouped_and_matched(serve):
    route = Recording()
    with serve(routes={"echo": route}) as s:
        client = s.openai()
        results: dict[int, str] = {}

        def one(i: int) -> None:
            results[i] = ask(client, f"thread question {i}").choices[0].message.content

        threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {i: f"thread question {i}" for i in range(40)}
    assert sum(route.groups) == 40


def test_batches_and_real_time_share_one_route_instance_on_one_thread(serve):
    route = Recording()
    with serve(routes={"echo": route}) as s:
        client = s.openai()
        batch = wait_openai(client, create_batch(client, [chat_line(f"r{i}", f"row {i}") for i in range(5)]).id)
        assert batch.status == "completed"
        assert sorted(x["response"]["body"]["choices"][0]["message"]["content"] for x in file_lines(client, batch.output_file_id)) == [f"row {i}" for i in range(5)]
        assert ask(client).choices[0].message.content == PROMPT
    assert len(route.groups) >= 2  # the batch's dispatch and the real-time call
    assert len(route.threads) == 1 and threading.get_ident() not in route.threads
