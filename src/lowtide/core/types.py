"""Provider-neutral request and outcome types: what routes consume and produce."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lowtide.core import fastjson


@dataclass(slots=True)
class Request:
    """One unit of LLM work as a route sees it: an endpoint and its body, in that endpoint's
    own shape, kept verbatim (DESIGN invariant 8). The model is the body's `model`.

    lowtide's own asks ride beside the body, never in it: `choices` (answer with exactly
    one of them) and `response_schema` (the answer must be JSON valid against it) are what
    the engine checks an answer against; where the endpoint has a field for the schema the
    loader has already put it in the body. `attempt` is 1 for the first try; routes may use
    it (echo's failure injection does).
    """

    custom_id: str
    endpoint: str
    body: dict[str, Any]
    choices: list[str] | None = None
    response_schema: dict[str, Any] | None = None
    attempt: int = 1
    row_id: int = 0  # the store's row, for paging; routes ignore it

    @property
    def model(self) -> str:
        model = self.body.get("model")
        return model if isinstance(model, str) else ""

    @model.setter
    def model(self, model: str) -> None:
        """lowtide's model override (a fallback lane's model): the one change to a body."""
        self.body["model"] = model

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation of a chat or messages body ([] for other endpoints)."""
        messages = self.body.get("messages")
        return messages if isinstance(messages, list) else []

    @property
    def output_limit(self) -> int | None:
        """The most output tokens the body allows, under the endpoint's own name for it;
        None when it sets none (lowtide never invents one)."""
        for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            value = self.body.get(key)
            if type(value) is int:
                return value
        config = self.body.get("generationConfig")  # Gemini keeps it one level down
        value = config.get("maxOutputTokens") if isinstance(config, dict) else None
        return value if type(value) is int else None

    @property
    def answers_asked(self) -> int:
        """How many answers the body asks for, each billed up to the output limit: `n`
        (Gemini's generationConfig.candidateCount); 1 where it sets none."""
        value = self.body.get("n")
        if type(value) is not int:
            config = self.body.get("generationConfig")
            value = config.get("candidateCount") if isinstance(config, dict) else None
        return value if type(value) is int and value > 1 else 1

    @property
    def output_bound(self) -> int | None:
        """The most output tokens the request may be billed: its output limit for each
        answer asked; None when it sets no limit."""
        limit = self.output_limit
        return None if limit is None else limit * self.answers_asked

    def add_turns(self, turns: list[dict[str, str]]) -> None:
        """Append lowtide's own turns (the one retry of an invalid answer) to the
        conversation, in the endpoint's shape; recorded apart, as the request's `repair`."""
        if self.endpoint == "/v1/completions":
            self.body = self.body | {"prompt": "\n\n".join([str(self.body.get("prompt", ""))] + [t["content"] for t in turns])}
            return
        key = "input" if self.endpoint == "/v1/responses" else "messages"
        asked = self.body.get(key)
        asked = [{"role": "user", "content": asked}] if isinstance(asked, str) else list(asked or [])
        self.body = self.body | {key: asked + turns}

    def to_payload(self) -> dict[str, Any]:
        """The JSON-able form stored with the request (everything but id and attempt)."""
        own = {k: v for k, v in (("choices", self.choices), ("response_schema", self.response_schema)) if v}
        payload: dict[str, Any] = {"endpoint": self.endpoint}
        if own:
            payload["lowtide"] = own
        payload["body"] = self.body
        return payload

    @classmethod
    def from_payload(cls, custom_id: str, payload: dict[str, Any], attempt: int = 1) -> Request:
        if "endpoint" not in payload:
            return cls._from_legacy(custom_id, payload, attempt)
        own = payload.get("lowtide") or {}
        # Positionally, in the fields' order: keywords cost a dataclass __init__ a quarter microsecond.
        return cls(custom_id, payload["endpoint"], payload["body"], own.get("choices"), own.get("response_schema"), attempt)

    @classmethod
    def _from_legacy(cls, custom_id: str, payload: dict[str, Any], attempt: int) -> Request:
        """A request stored before bodies were kept verbatim (lowtide 0.x stores): the chat
        body it was always sent as."""
        body: dict[str, Any] = {"model": payload["model"], "messages": payload["messages"]}
        for key in ("max_tokens", "temperature", "stop"):
            if payload.get(key) is not None:
                body[key] = payload[key]
        schema = payload.get("response_schema")
        if schema is not None:
            body["response_format"] = schema_format(schema)
        return cls(custom_id, "/v1/chat/completions", body, payload.get("choices"), schema, attempt)

    @classmethod
    def chat(cls, custom_id: str, model: str, messages: list[dict[str, Any]], **params: Any) -> Request:
        """A chat completions request (tests, benchmarks and Python callers)."""
        choices = params.pop("choices", None)
        schema = params.pop("response_schema", None)
        body = {"model": model, "messages": messages, **params}
        if schema is not None and "response_format" not in body:
            body["response_format"] = schema_format(schema)
        return cls(custom_id, "/v1/chat/completions", body, choices, schema)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    """`response_schema` as chat completions' `response_format`: a strict json_schema."""
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a route cannot run a request as it is: the field (a path into the body, such as
    `messages[2].content[0]` or `tools`), and why. Said before anything is submitted."""

    field: str
    reason: str

    def message(self, route: str) -> str:
        return f"{self.field}: {self.reason} (route {route})"


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
    # The provider's whole answer body (a chat completion, a response, a message), as it
    # came: everything it returned is kept (DESIGN invariant 8).
    response: dict[str, Any] | None = None
    # `response` as the JSON text ingest stores, where the route wrote it so itself (a
    # `WrittenOutcome`); None for any other outcome, whose `response` ingest writes.
    written: ClassVar[str | None] = None

    @classmethod
    def failure(cls, custom_id: str, code: str, message: str, retryable: bool) -> Outcome:
        return cls(custom_id, False, error_code=code, error_message=message, retryable=retryable)


# The slot that holds an outcome's `response` dict (a `WrittenOutcome` reads it under its own name).
_RESPONSE_SLOT = Outcome.__dict__["response"]


class WrittenOutcome(Outcome):
    """A success whose answer is one chat completion choice of text alone (no tool call, no
    logprobs, no refusal), which the route wrote as JSON text itself (`written`, exactly what
    `fastjson.dumps(response)` writes) instead of building the dicts that ingest would then
    write: echo's commonest answer (routes/replies.py `chat_text_written`). Ingest stores the
    text as it is, and tells its plain record from `chat_finish` (the choice's finish_reason)
    and that it has no tool call; `response` is read from the text only where something asks
    for it (serve, a test), once. Assigning `response` replaces the written text."""

    __slots__ = ("written", "chat_finish")

    def __init__(self, custom_id: str, text: str, usage: Usage, finish_reason: str, written: str, chat_finish: str):
        Outcome.__init__(self, custom_id, True, text=text, usage=usage, finish_reason=finish_reason)
        self.written = written
        self.chat_finish = chat_finish

    @property  # type: ignore[override]
    def response(self) -> dict[str, Any] | None:
        value = _RESPONSE_SLOT.__get__(self)
        if value is None and self.written is not None:
            value = fastjson.loads(self.written)
            _RESPONSE_SLOT.__set__(self, value)
        return value

    @response.setter
    def response(self, value: dict[str, Any] | None) -> None:
        _RESPONSE_SLOT.__set__(self, value)
        self.written = None
