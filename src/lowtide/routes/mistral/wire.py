"""What Mistral's batch takes of a request, read from the `mistralai` SDK's own request types:
no network, so it is tested without a server (routes/mistral/batch.py talks to Mistral).

A request keeps its OpenAI-shaped body (Mistral's chat and embeddings APIs are OpenAI-like)
and travels verbatim as a line's `body`. Mistral refuses a field its API does not declare,
so one the SDK's `ChatCompletionRequest` / `EmbeddingRequest` (or a message's, or a content
chunk's type) lacks is refused here, before anything is stored or sent, naming the field
and Mistral's own word for it where it has one (`seed` is `random_seed` there).
"""

from __future__ import annotations

import functools
from typing import Any

from lowtide.core.endpoints import CHAT, EMBEDDINGS
from lowtide.core.types import Refusal, Request

ENDPOINTS = (CHAT, EMBEDDINGS)  # lowtide's endpoints that Mistral's batch takes (its APIEndpoint)
# OpenAI's name for something Mistral's API calls otherwise: the fix a refusal names.
MISTRAL_NAMES = {"seed": "random_seed", "max_completion_tokens": "max_tokens", "dimensions": "output_dimension"}


def _aliases(model: Any) -> frozenset[str]:
    return frozenset(f.alias or name for name, f in model.model_fields.items())


@functools.cache
def body_keys(endpoint: str) -> frozenset[str]:
    """The keys Mistral's request type for `endpoint` declares (by their wire names)."""
    from mistralai.client import models

    return _aliases(models.ChatCompletionRequest if endpoint == CHAT else models.EmbeddingRequest)


@functools.cache
def message_keys() -> dict[str, frozenset[str]]:
    """Each role Mistral's chat takes, and the keys its message declares."""
    from mistralai.client import models

    kinds = {"system": models.SystemMessage, "user": models.UserMessage, "assistant": models.AssistantMessage,
             "tool": models.ToolMessage}  # fmt: skip
    return {role: _aliases(kind) for role, kind in kinds.items()}


@functools.cache
def part_types() -> frozenset[str]:
    """The content chunk types Mistral's messages take (`text`, `image_url`, `input_audio`, …)."""
    from mistralai.client.models import contentchunk

    return frozenset(contentchunk._CONTENT_CHUNK_VARIANTS)


def refusal(request: Request, route: str) -> Refusal | None:
    """Why Mistral's batch cannot take `request` as it is, or None."""
    if request.endpoint not in ENDPOINTS:
        return Refusal("endpoint", f"Mistral's batch takes {', '.join(ENDPOINTS)} here ({route}), not {request.endpoint}; "
                                   "use another route for this endpoint")  # fmt: skip
    body = request.body
    for key in body:
        if key not in body_keys(request.endpoint):
            return Refusal(key, _not_declared(f"Mistral's {request.endpoint} request", key))
    if request.endpoint == CHAT:
        return _messages_refusal(body.get("messages"))
    return None


def _not_declared(where: str, key: str) -> str:
    fix = f"use `{MISTRAL_NAMES[key]}`" if key in MISTRAL_NAMES else "remove it"
    return f"{where} has no `{key}` (the mistralai SDK does not declare it, and Mistral refuses what it does not know); {fix}"


def _messages_refusal(messages: Any) -> Refusal | None:
    if not isinstance(messages, list):
        return None  # the provider's to judge: sent as it is, its error kept
    roles = message_keys()
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role not in roles:
            return Refusal(f"messages[{i}].role", f"Mistral's chat takes the roles {', '.join(roles)}, not {role!r}; "
                                                  "send its content as a system or user message")  # fmt: skip
        for key in message:
            if key not in roles[role]:
                return Refusal(f"messages[{i}].{key}", _not_declared(f"Mistral's {role} message", key))
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in part_types():
                return Refusal(f"messages[{i}].content[{j}]", f"Mistral's messages take the content parts "
                                                              f"{', '.join(sorted(part_types()))}, not {kind!r}")  # fmt: skip
    return None
