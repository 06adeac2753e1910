"""What the local route honours beyond plain-text turns, and what it refuses, checked before
anything runs (no llama.cpp needed: `LocalRoute.refusal` runs at load time).

| key | endpoints | what the route does |
|---|---|---|
| `response_format` / `text.format` / `output_config.format`, `response_schema` | chat, responses, messages (schema: all) | a grammar from the JSON Schema masks the tokens (`schema.py`) |
| the same, holding lowtide's ask for the job's `choices` (`{"choice": <enum>}`, core/native_schema.py) | chat, responses, messages | the choices are scored, as without it; the answer is the bare choice |
| `seed` | chat, completions | the draws of a sampled answer come from it alone |
| `top_p` | chat, responses, completions | nucleus sampling when temperature > 0 (greedy keeps the top token anyway) |
| `n` | chat, completions | n choices, each sampled on its own generator |
| `logprobs`, `top_logprobs` | chat | the model's log-probabilities of each token, and the top ones |
"""

from __future__ import annotations

from lowtide.core.native_schema import choices_of
from lowtide.core.types import Refusal, Request
from lowtide.routes.own.local import schema
from lowtide.routes.own.plain import read_plain
from lowtide.routes.own.structure import json_ask

# Beyond plain-text turns, per endpoint: what the local route honours (see its module doc).
HONOURS = {
    "/v1/chat/completions": frozenset({"response_format", "seed", "top_p", "n", "logprobs", "top_logprobs"}),
    "/v1/responses": frozenset({"text", "top_p"}),
    "/v1/completions": frozenset({"seed", "top_p", "n"}),
    "/v1/messages": frozenset({"output_config"}),
}


def refusal(request: Request) -> Refusal | None:
    """What the local route cannot honour in `request`, said before anything runs."""
    plain = read_plain(request, HONOURS)
    if isinstance(plain, Refusal):
        return plain
    ask = json_ask(request)
    if isinstance(ask, Refusal):
        return ask
    body = request.body
    if request.choices:
        asked = {"n": body.get("n", 1) != 1, "logprobs": body.get("logprobs") is True,
                 "top_logprobs": body.get("top_logprobs") not in (None, 0)}  # fmt: skip
        for key, given in asked.items():
            if given:
                return Refusal(key, "choices are scored, not sampled: one answer, with no logprobs, per request")
        # lowtide's own ask for the choices (core/native_schema.py) is what the scoring does anyway
        if ask is not None and choices_of(ask.schema) != list(request.choices):
            return Refusal(ask.field, "choices are scored, not generated: drop the JSON format or the choices")
        return _sampling_refusal(body)
    if ask is not None and ask.bare:
        return Refusal(ask.field, "text/x.enum is not honoured by this route; ask for application/json")
    if ask is not None and ask.schema is not None:
        found = schema.refusal(ask.schema, ask.field)
        if found is not None:
            return found
    return _sampling_refusal(body)


def _sampling_refusal(body: dict) -> Refusal | None:
    top = body.get("top_logprobs")
    if top is not None:
        if type(top) is not int or not 0 <= top <= 20:
            return Refusal("top_logprobs", f"must be a whole number from 0 to 20; got {top!r}")
        if body.get("logprobs") is not True:
            return Refusal("top_logprobs", "needs logprobs: true")
    if "logprobs" in body and not isinstance(body["logprobs"], bool):
        return Refusal("logprobs", "must be true or false")
    top_p = body.get("top_p")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1):
        return Refusal("top_p", f"must be a number above 0 and at most 1; got {top_p!r}")
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        return Refusal("seed", f"must be a whole number; got {seed!r}")
    return None
