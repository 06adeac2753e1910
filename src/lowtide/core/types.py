"""Provider-neutral request and outcome types: what routes consume and produce."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ChatRequest:
    """One unit of LLM work as a route sees it.

    `attempt` is 1 for the first try; routes may use it (echo's failure injection does).
    `choices`, when set, asks the route to answer with exactly one of them.
    """

    custom_id: str
    model: str
    messages: list[dict[str, str]]
    max_tokens: int = 256
    temperature: float = 0.0
    stop: list[str] | None = None
    response_schema: dict[str, Any] | None = None
    choices: list[str] | None = None
    attempt: int = 1
    row_id: int = 0  # the store's row, for paging; routes ignore it

    def to_payload(self) -> dict[str, Any]:
        """The JSON-able form stored with the request (everything but id and attempt)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.stop:
            body["stop"] = self.stop
        if self.response_schema is not None:
            body["response_schema"] = self.response_schema
        if self.choices:
            body["choices"] = self.choices
        return body

    @classmethod
    def from_payload(cls, custom_id: str, payload: dict[str, Any], attempt: int = 1) -> ChatRequest:
        return cls(
            custom_id=custom_id,
            model=payload["model"],
            messages=payload["messages"],
            max_tokens=payload.get("max_tokens", 256),
            temperature=payload.get("temperature", 0.0),
            stop=payload.get("stop"),
            response_schema=payload.get("response_schema"),
            choices=payload.get("choices"),
            attempt=attempt,
        )


@dataclass(slots=True)
class Usage:
    """Token counts exactly as the provider reported them (see DESIGN invariant 6)."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(slots=True)
class Outcome:
    """What one attempt of one request produced.

    `ok` False means the attempt failed; `retryable` says whether trying again may help
    (rate limits, server errors, timeouts, expiry) or not (an invalid request).
    """

    custom_id: str
    ok: bool
    text: str | None = None
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    retryable: bool = False
    # The tier the provider says it served the request at, in lowtide's words ("realtime",
    # "flex", "priority", "batch"); None when the response does not say. Routes translate
    # the provider's own field (OpenAI `service_tier`, Anthropic `usage.service_tier`).
    tier: str | None = None

    @classmethod
    def failure(cls, custom_id: str, code: str, message: str, retryable: bool) -> Outcome:
        return cls(custom_id, False, error_code=code, error_message=message, retryable=retryable)
