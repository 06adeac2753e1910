"""Jobs whose answers are provider bodies built with the SDKs' own types: a job is loaded
as `lowtide run` would (the real loader, a real store), its requests put in a dispatch as
if sent to a batch route, and `apply_outcomes` (the engine's own ingest) applies outcomes
carrying those bodies. No route is contacted; the answers are shaped exactly as the
SDK's models say a provider sends them."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types as at
import openai.types.chat as oc
import openai.types.responses as orsp
import sqlalchemy as sa
from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.completion_choice import Logprobs

from lowtide.core.spec import build_spec
from lowtide.core.states import RequestState
from lowtide.core.types import Outcome, Usage
from lowtide.engine.context import JobContext
from lowtide.engine.loader import load_job
from lowtide.store.schema import jobs, requests
from tests.conftest import whole_columns, write_csv
from tests.engine.ledger_helpers import dispatch, ingest

OFFLINE = {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "LOWTIDE_TEST_UNUSED_KEY"}  # never contacted
ROUTE_OF = {"/v1/messages": "anthropic-batch"}


def loaded_job(store, clock, tmp_path, monkeypatch, ids: list[str], endpoint: str = "/v1/chat/completions", **spec: Any) -> JobContext:
    """A job over rows `ids` (column body = "ticket <id>"), loaded by the real loader."""
    monkeypatch.setenv("LOWTIDE_TEST_UNUSED_KEY", "k")
    source = write_csv(tmp_path / "t.csv", [{"ticket_id": i, "body": f"ticket {i}"} for i in ids])
    route = ROUTE_OF.get(endpoint, "openai-batch")
    options = OFFLINE if route == "openai-batch" else {**OFFLINE, "base_url": "http://127.0.0.1:9"}
    made = build_spec({
        "name": "tickets", "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"}, "model": "test-model",
        "route": route, "route_options": options, "endpoint": endpoint,
        "params": {"max_output_tokens" if endpoint == "/v1/responses" else "max_tokens": 256}, **spec,
    })  # fmt: skip
    load_job(store, made, clock)
    return job_context(store, made.name)


def job_context(store, name: str) -> JobContext:
    with store.begin() as conn:
        return JobContext.from_row(conn.execute(sa.select(jobs).where(jobs.c.name == name)).one())


def answer_all(store, job: JobContext, bodies: dict[str, dict]) -> None:
    """Dispatch the pending requests among `bodies` and apply one outcome each."""
    route = job.spec.route
    dispatch_id = dispatch(store, job, route, list(bodies))
    ingest(store, job, dispatch_id, route, [outcome(cid, body) for cid, body in bodies.items()])


def outcome(cid: str, body: dict) -> Outcome:
    """What a route makes of a provider body: its text and usage, and the body itself."""
    usage = body.get("usage") or {}
    tokens = Usage(
        input_tokens=usage.get("prompt_tokens", usage.get("input_tokens", 0)),
        output_tokens=usage.get("completion_tokens", usage.get("output_tokens", 0)),
    )
    text = _text(body)
    return Outcome(cid, True, text=text, usage=tokens, response=body)


def _text(body: dict) -> str:
    if body.get("object") == "chat.completion":
        return body["choices"][0]["message"]["content"] or ""
    if body.get("object") == "text_completion":
        return body["choices"][0]["text"]
    if body.get("object") == "response":
        return "".join(p["text"] for i in body["output"] if i["type"] == "message" for p in i["content"] if p["type"] == "output_text")
    return "".join(b["text"] for b in body["content"] if b["type"] == "text")


def states(store) -> dict[str, Any]:
    with store.begin() as conn:
        return {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)))}


def pending(store) -> list[str]:
    return [cid for cid, r in states(store).items() if r.state == RequestState.PENDING.value]


# --- provider bodies, built with the SDKs' types -------------------------------------------

CHAT_USAGE = CompletionUsage(prompt_tokens=12, completion_tokens=5, total_tokens=17)


def chat(*choices: oc.chat_completion.Choice, usage: CompletionUsage = CHAT_USAGE) -> dict:
    return oc.ChatCompletion(
        id="chatcmpl-1", object="chat.completion", created=1_700_000_000, model="gpt-4o-mini",
        choices=list(choices), usage=usage, service_tier="default",
    ).model_dump(mode="json")  # fmt: skip


def choice(
    index: int = 0, content: str | None = None, *, finish: str = "stop", calls: list[tuple[str, str, str]] = (),
    refusal: str | None = None, logprobs: list[tuple[str, float, list[tuple[str, float]]]] | None = None,
) -> oc.chat_completion.Choice:  # fmt: skip
    tool_calls = [
        oc.ChatCompletionMessageFunctionToolCall(id=cid, type="function", function={"name": name, "arguments": args})
        for cid, name, args in calls
    ] or None
    lp = None
    if logprobs is not None:
        lp = oc.chat_completion.ChoiceLogprobs(
            content=[
                oc.ChatCompletionTokenLogprob(
                    token=t, logprob=v, bytes=list(t.encode()),
                    top_logprobs=[oc.chat_completion_token_logprob.TopLogprob(token=a, logprob=b, bytes=list(a.encode())) for a, b in top],
                )  # fmt: skip
                for t, v, top in logprobs
            ]
        )
    message = oc.ChatCompletionMessage(role="assistant", content=content, refusal=refusal, tool_calls=tool_calls)
    return oc.chat_completion.Choice(index=index, message=message, finish_reason=finish, logprobs=lp)


def completion(text: str, tokens: list[tuple[str, float]]) -> dict:
    logprobs = Logprobs(
        tokens=[t for t, _ in tokens], token_logprobs=[v for _, v in tokens],
        top_logprobs=[{t: v} for t, v in tokens], text_offset=list(range(len(tokens))),
    )  # fmt: skip
    return Completion(
        id="cmpl-1", object="text_completion", created=1_700_000_000, model="gpt-3.5-turbo-instruct",
        choices=[CompletionChoice(index=0, text=text, finish_reason="length", logprobs=logprobs)],
        usage=CompletionUsage(prompt_tokens=3, completion_tokens=len(tokens), total_tokens=3 + len(tokens)),
    ).model_dump(mode="json")  # fmt: skip


def response(*items: Any, status: str = "completed") -> dict:
    return orsp.Response(
        id="resp_1", object="response", created_at=1_700_000_000, model="gpt-4.1-mini", status=status,
        output=list(items), parallel_tool_calls=True, tool_choice="auto", tools=[],
        usage=orsp.ResponseUsage(
            input_tokens=9, output_tokens=4, total_tokens=13,
            input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0}, output_tokens_details={"reasoning_tokens": 2},
        ),
    ).model_dump(mode="json")  # fmt: skip


def response_message(text: str) -> orsp.ResponseOutputMessage:
    part = orsp.ResponseOutputText(type="output_text", text=text, annotations=[])
    return orsp.ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed", content=[part])


def response_call(call_id: str, name: str, arguments: str) -> orsp.ResponseFunctionToolCall:
    return orsp.ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=arguments)


def response_reasoning(summary: str) -> orsp.ResponseReasoningItem:
    return orsp.ResponseReasoningItem(id="rs_1", type="reasoning", summary=[{"type": "summary_text", "text": summary}])


def message(*blocks: Any, stop: str = "end_turn") -> dict:
    return at.Message(
        id="msg_01", type="message", role="assistant", model="claude-sonnet-4-5", content=list(blocks),
        stop_reason=stop, stop_sequence=None, usage=at.Usage(input_tokens=20, output_tokens=7),
    ).model_dump(mode="json")  # fmt: skip


def text_block(text: str) -> at.TextBlock:
    return at.TextBlock(type="text", text=text)


def thinking_block(thinking: str) -> at.ThinkingBlock:
    return at.ThinkingBlock(type="thinking", thinking=thinking, signature="sig")


def tool_use(tid: str, name: str, args: dict) -> at.ToolUseBlock:
    return at.ToolUseBlock(type="tool_use", id=tid, name=name, input=args)


def weather_tool(endpoint: str) -> dict:
    """One tool, `get_weather(city: str, days: int)`, in the endpoint's own shape."""
    params = {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"], "additionalProperties": False,
    }  # fmt: skip
    if endpoint == "/v1/messages":
        return {"name": "get_weather", "description": "Weather", "input_schema": params}
    if endpoint == "/v1/responses":
        return {"type": "function", "name": "get_weather", "parameters": params, "strict": False}
    return {"type": "function", "function": {"name": "get_weather", "parameters": params}}


def args(**kw: Any) -> str:
    return json.dumps(kw)


def ingest_again(store, job: JobContext, dispatch_id: int, bodies: dict[str, dict]) -> None:
    """Apply outcomes to requests already put in `dispatch_id`."""
    ingest(store, job, dispatch_id, job.spec.route, [outcome(cid, body) for cid, body in bodies.items()])
