"""The endpoints a request may be for, and what each one's body may say.

A request is an endpoint plus a body in that endpoint's own shape (DESIGN "request"). The
keys each body may carry come from the official SDKs' own request types (their TypedDicts),
not from a list kept here, so a parameter the SDKs add is known the day they ship it.
"""

from __future__ import annotations

import typing
from functools import cache
from typing import Any

from lowtide.core.gemini import GENERATE_CONTENT

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
EMBEDDINGS = "/v1/embeddings"
MODERATIONS = "/v1/moderations"
GEMINI = GENERATE_CONTENT  # Gemini's generateContent (core/gemini.py)
ENDPOINTS = (CHAT, RESPONSES, COMPLETIONS, MESSAGES, GEMINI, EMBEDDINGS, MODERATIONS)
# Which provider's protocol an endpoint belongs to.
PROTOCOL = {CHAT: "openai", RESPONSES: "openai", COMPLETIONS: "openai", MESSAGES: "anthropic", GEMINI: "gemini", EMBEDDINGS: "openai",
            MODERATIONS: "openai"}  # fmt: skip
# Endpoints whose answer is no text (vectors, a classification): no messages, no output
# limit, nothing for `choices` or `response_schema` to check.
NO_TEXT = frozenset({EMBEDDINGS, MODERATIONS})
# Keys a batch or a stored request cannot carry: a stream has nobody to read it.
NEVER = frozenset({"stream", "stream_options"})
# Parameters self-hosted OpenAI-compatible servers (vLLM, SGLang, llama.cpp's server) take
# beyond OpenAI's own: passed to an `openai-compatible` route, refused by OpenAI's.
ENGINE_EXTRAS = frozenset({
    "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "structured_outputs", "chat_template", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "priority", "grammar", "json_schema", "cache_prompt", "n_probs", "mirostat",
    "typical_p", "dynatemp_range", "samplers", "return_tokens_as_token_ids", "include_stop_str_in_output",
})  # fmt: skip


def request_type(endpoint: str) -> Any:
    """The official SDK's TypedDict of `endpoint`'s request body."""
    return _typed_dict(endpoint)


def _typed_dict(endpoint: str) -> Any:
    if endpoint == CHAT:
        from openai.types.chat.completion_create_params import CompletionCreateParamsBase

        return CompletionCreateParamsBase
    if endpoint == RESPONSES:
        from openai.types.responses.response_create_params import ResponseCreateParamsBase

        return ResponseCreateParamsBase
    if endpoint == COMPLETIONS:
        from openai.types.completion_create_params import CompletionCreateParamsBase

        return CompletionCreateParamsBase
    if endpoint == MESSAGES:
        from anthropic.types.message_create_params import MessageCreateParamsBase

        return MessageCreateParamsBase
    if endpoint == GEMINI:
        from lowtide.core.gemini import body_type as gemini_body_type

        return gemini_body_type()
    if endpoint == EMBEDDINGS:
        from openai.types.embedding_create_params import EmbeddingCreateParams

        return EmbeddingCreateParams
    if endpoint == MODERATIONS:
        from openai.types.moderation_create_params import ModerationCreateParams

        return ModerationCreateParams
    raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}")


def body_type(endpoint: str) -> Any:
    """The official SDK's TypedDict for a body of `endpoint`."""
    return _typed_dict(endpoint)


@cache
def known_keys(endpoint: str) -> frozenset[str]:
    """Every body key of `endpoint`, as the official SDK's request type declares it."""
    params = _typed_dict(endpoint)
    return frozenset(params.__required_keys__ | params.__optional_keys__)


# The body keys each endpoint's SDK type marks `Required`, written out: every spec is checked
# against them, and reading them from the types imports the whole openai package (0.7 s of
# CPU for every `lowtide` command and API script). tests/core/test_endpoints_required.py
# reads them from the installed SDKs, so a key an SDK starts to require is caught there.
REQUIRED: dict[str, frozenset[str]] = {
    CHAT: frozenset({"messages", "model"}),
    RESPONSES: frozenset(),
    COMPLETIONS: frozenset({"model", "prompt"}),
    MESSAGES: frozenset({"max_tokens", "messages", "model"}),
    GEMINI: frozenset({"contents"}),
    EMBEDDINGS: frozenset({"input", "model"}),
    MODERATIONS: frozenset({"input"}),
}


def required_keys(endpoint: str) -> frozenset[str]:
    """The keys the official SDK requires in a body of `endpoint` (REQUIRED)."""
    try:
        return REQUIRED[endpoint]
    except KeyError:
        raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}") from None


def required_of(typed_dict: Any) -> frozenset[str]:
    """The required keys of an SDK TypedDict. The SDKs declare them `total=False` with
    `Required[...]` under postponed annotations, so `__required_keys__` is empty: they are
    read from the resolved annotations."""
    import typing_extensions

    hints = typing_extensions.get_type_hints(typed_dict, include_extras=True)
    required = (typing.Required, typing_extensions.Required)
    return frozenset(k for k, tp in hints.items() if typing_extensions.get_origin(tp) in required) | typed_dict.__required_keys__


def conversation_key(endpoint: str) -> str:
    """The body key that holds what the model is asked: messages, input or prompt."""
    return {RESPONSES: "input", COMPLETIONS: "prompt", GEMINI: "contents", EMBEDDINGS: "input", MODERATIONS: "input"}.get(endpoint, "messages")
