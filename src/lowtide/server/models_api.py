"""The models calls of OpenAI's and Anthropic's APIs (`GET /v1/models`, `GET /v1/models/{id}`)
and Anthropic's `POST /v1/messages/count_tokens`: the first calls a client makes (a health
check, a model picker, a token count before a batch), which the official SDKs' own suites
run (tests/server/test_sdk_suites.py).

Both APIs list models on the same path; the caller's SDK says which it is: Anthropic's always
sends `anthropic-version`, OpenAI's never does. The models are those the price catalog
(genai-prices, core/genai_source.py) knows for the provider: what serve can stand in for.
The catalog has no release dates, so `created` is 0 and `created_at` the epoch. Tokens are
counted as `lowtide estimate` counts them (core/tokens.py): the approximation for Claude, as
no Anthropic tokenizer runs offline.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from lowtide.core.endpoints import MESSAGES
from lowtide.core.genai_source import context_window, model_ids
from lowtide.core.tokens import counter_for
from lowtide.server.bodies import parse_object, read_body
from lowtide.server.errors import ApiError
from lowtide.server.schemas import json_body

router = APIRouter()
EPOCH = "1970-01-01T00:00:00Z"
ANTHROPIC_PAGE = 20  # Anthropic's default `limit`
ANTHROPIC_MAX_PAGE = 1000


def _anthropic(request: Request) -> bool:
    return "anthropic-version" in request.headers


def _openai_model(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "openai"}


def _anthropic_model(model: str) -> dict[str, Any]:
    """A ModelInfo: `lifecycle` active (the catalog lists models one can price), the context
    window where the catalog has it."""
    return {"id": model, "type": "model", "display_name": model, "created_at": EPOCH, "lifecycle": "active",
            "max_input_tokens": context_window("anthropic", model)}  # fmt: skip


@router.get("/v1/models")
def list_models(
    request: Request, limit: int | None = Query(None), after_id: str | None = Query(None), before_id: str | None = Query(None)
):
    if not _anthropic(request):
        return {"object": "list", "data": [_openai_model(m) for m in model_ids("openai")]}
    size = ANTHROPIC_PAGE if limit is None else limit
    if not 1 <= size <= ANTHROPIC_MAX_PAGE:
        return ApiError(400, f"limit: must be between 1 and {ANTHROPIC_MAX_PAGE}; got {size}").response("anthropic")
    if after_id is not None and before_id is not None:
        return ApiError(400, "give at most one of after_id and before_id").response("anthropic")
    ids = model_ids("anthropic")
    if after_id is not None:
        ids = ids[ids.index(after_id) + 1 :] if after_id in ids else []
        page = ids[:size]
    elif before_id is not None:
        ids = ids[: ids.index(before_id)] if before_id in ids else []
        page = ids[-size:]
    else:
        page = ids[:size]
    return {
        "data": [_anthropic_model(m) for m in page], "has_more": len(ids) > len(page),
        "first_id": page[0] if page else None, "last_id": page[-1] if page else None,
    }  # fmt: skip


@router.get("/v1/models/{model_id}")
def retrieve_model(model_id: str, request: Request):
    if _anthropic(request):
        if model_id in model_ids("anthropic"):
            return _anthropic_model(model_id)
        return ApiError(404, f"model: {model_id}").response("anthropic")
    if model_id in model_ids("openai"):
        return _openai_model(model_id)
    return _no_openai_model(model_id)


@router.delete("/v1/models/{model_id}")
def delete_model(model_id: str, request: Request):
    """Deleting a fine-tuned model: serve has none, so every id is unknown (as OpenAI answers
    a base model's id it does not own)."""
    return _no_openai_model(model_id)


def _no_openai_model(model_id: str) -> JSONResponse:
    return ApiError(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model").response("openai")


COUNT_TOKENS = {
    "type": "object", "required": ["model", "messages"],
    "properties": {"model": {"type": "string"}, "messages": {"type": "array"}, "system": {}, "tools": {"type": "array"}},
}  # fmt: skip


@router.post("/v1/messages/count_tokens", openapi_extra=json_body(COUNT_TOKENS))
async def count_tokens(request: Request):
    config = request.app.state.server.config
    body = parse_object(await read_body(request, config.max_request_bytes, config.body_timeout), config.max_json_depth)
    problem = _count_problem(body)
    if problem is not None:
        raise ApiError(400, problem)
    return {"input_tokens": counter_for(body["model"], "anthropic").count_request(MESSAGES, body)}


def _count_problem(body: dict[str, Any]) -> str | None:
    """What Anthropic's count_tokens would refuse in the fields it counts, or None."""
    for key in ("model", "messages"):
        if key not in body:
            return f"{key}: Field required"
    if not isinstance(body["model"], str):
        return "model: Input should be a valid string"
    if not isinstance(body["messages"], list):
        return "messages: Input should be a valid list"
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return f"messages.{i}: expected an object with role user or assistant"
        if not isinstance(m.get("content"), str | list) or not _blocks_ok(m["content"]):
            return f"messages.{i}.content: expected text or a list of content blocks"
    if "system" in body and not (isinstance(body["system"], str | list) and _blocks_ok(body["system"])):
        return "system: expected text or a list of text blocks"
    if "tools" in body and not (isinstance(body["tools"], list) and all(isinstance(t, dict) for t in body["tools"])):
        return "tools: expected a list of tool objects"
    return None


def _blocks_ok(content: str | list) -> bool:
    return isinstance(content, str) or all(isinstance(b, dict) for b in content)
