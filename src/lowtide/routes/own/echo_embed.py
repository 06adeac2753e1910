"""`echo` on `/v1/embeddings`: deterministic unit vectors, so tests can check them exactly.

Each input (a text, or a token array) gets `core.embeddings.echo_vector(input, n)`, where n
is the body's `dimensions`, else the model's published length (text-embedding-3-small:
1536, ...), else 16. `encoding_format: base64` sends each vector as OpenAI does (float32,
little-endian, base64). Usage: characters / 4 (rounded up) per input, as echo's chat usage.
The answer has OpenAI's shape: `{"object": "list", "data": [{"object": "embedding",
"index": i, "embedding": ...}], "model", "usage": {"prompt_tokens", "total_tokens"}}`.
"""

from __future__ import annotations

from typing import Any

from lowtide.core.embeddings import ECHO_DIMENSIONS, echo_vector, encode_base64, model_facts
from lowtide.core.endpoints import EMBEDDINGS, known_keys
from lowtide.core.types import Outcome, Refusal, Request, Usage


def refusal(request: Request) -> Refusal | None:
    body = request.body
    for key in body:
        if key not in known_keys(EMBEDDINGS):
            return Refusal(key, f"is not a parameter of {EMBEDDINGS}")
    given = body.get("input")
    inputs = given if isinstance(given, list) and not all(isinstance(t, int) for t in given) else [given]
    for i, item in enumerate(inputs):
        if not (isinstance(item, str) or (isinstance(item, list) and all(isinstance(t, int) for t in item))):
            return Refusal("input" if len(inputs) == 1 else f"input[{i}]", "must be text or an array of token ids")
        if isinstance(item, str) and not item.strip():
            return Refusal("input" if len(inputs) == 1 else f"input[{i}]", "is empty; an embedding needs text")
    if not inputs:
        return Refusal("input", "is an empty list; give at least one input")
    dims = body.get("dimensions")
    if dims is not None and (type(dims) is not int or dims < 1):
        return Refusal("dimensions", "must be a whole number of at least 1")
    if body.get("encoding_format") not in (None, "float", "base64"):
        return Refusal("encoding_format", "must be float or base64")
    return None


def outcome(request: Request) -> Outcome:
    refused = refusal(request)
    if refused is not None:
        return Outcome.failure(request.custom_id, "invalid_request", refused.message("echo"), False)
    body = request.body
    given = body["input"]
    inputs = given if isinstance(given, list) and not all(isinstance(t, int) for t in given) else [given]
    facts = model_facts(request.model)
    n = body.get("dimensions") or (facts.dimensions if facts else ECHO_DIMENSIONS)
    base64 = body.get("encoding_format") == "base64"
    data: list[dict[str, Any]] = []
    tokens = 0
    for i, item in enumerate(inputs):
        vector = echo_vector(item, n)
        data.append({"object": "embedding", "index": i, "embedding": encode_base64(vector) if base64 else vector})
        tokens += -(-len(item) // 4) if isinstance(item, str) else len(item)
    response = {"object": "list", "data": data, "model": request.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return Outcome(request.custom_id, True, usage=Usage(input_tokens=tokens), response=response)
