"""`openai-compatible-batch`: OpenAI's Files + Batches API at another provider, by profile.

The openai-batch route's code (routes/openai/batch.py), pointed by `route_options.profile`
at one provider: its card (core/cards.py, `openai-compatible-batch:PROFILE`) gives the base
URL, the key's environment variable, the upload's `purpose`, the completion window, the
limits a batch is planned within and the discount it bills at. What differs between them:

| profile | base_url | key | purpose | endpoints |
|---|---|---|---|---|
| groq | https://api.groq.com/openai/v1 | GROQ_API_KEY | batch | chat |
| together | https://api.together.xyz/v1 | TOGETHER_API_KEY | batch-api | chat |
| novita | route_options.base_url (not confirmed here) | NOVITA_API_KEY | batch | chat, completions |

Without a profile it is any server speaking OpenAI's Batch API at `route_options.base_url`.
`base_url` and `api_key_env` override the profile's; `max_requests` and `max_bytes` may
tighten its limits, never loosen them. Other options as openai-batch's: `poll_interval`,
`find_hours`, `timeout`. The official `openai` SDK is the client (Groq and Together document
their batch APIs as OpenAI-compatible).
"""

from __future__ import annotations

from typing import Any

from lowtide.core.cards import CARDS, profiles_of
from lowtide.core.errors import RouteError
from lowtide.core.types import Refusal, Request
from lowtide.routes.openai.batch import OpenAIBatchRoute
from lowtide.routes.openai.wire import openai_refusal
from lowtide.routes.options import text_option
from lowtide.routes.provider import check_options

NAME = "openai-compatible-batch"
OPTIONS = {"profile", "base_url", "api_key_env", "max_requests", "max_bytes", "poll_interval", "find_hours", "timeout"}


def profile_card(route: str, options: dict[str, Any]):
    """The card `route_options.profile` names, or the route's own without one; an unknown
    profile lists the known ones."""
    profile = options.get("profile")
    if profile is None:
        return CARDS[route]
    known = profiles_of(route)
    if profile not in known:
        raise RouteError(f"{route}: unknown route_options.profile {profile!r}; known: {', '.join(known)}")
    return CARDS[f"{route}:{profile}"]


class OpenAICompatibleBatchRoute(OpenAIBatchRoute):
    name = NAME

    def __init__(self, options: dict[str, Any]):
        check_options(self.name, options, OPTIONS)
        card = profile_card(self.name, options)
        wire = card.wire
        assert wire is not None, card.name
        base_url = text_option(self.name, options, "base_url", wire.base_url)
        if base_url is None:
            who = f"{card.provider}'s OpenAI-compatible base URL" if "profile" in options else "the server's base URL"
            raise RouteError(f"{self.name}: no base_url: give route_options.base_url ({who}, ending in /v1)")
        self.tier, self.max_enqueued_tokens = None, None  # OpenAI's usage tiers: not this provider's
        self.purpose = wire.purpose
        self.completion_window = wire.completion_window
        self.send_metadata = wire.metadata
        self.setup(options, card, wire.key_env, base_url)

    def refusal(self, request: Request) -> Refusal | None:
        refused = openai_refusal(request, self.name)
        if refused is None and request.endpoint not in self.card.endpoints:
            endpoints = ", ".join(self.card.endpoints)
            return Refusal("endpoint", f"{self.card.provider} takes {endpoints} in a batch ({self.card.name}), "
                                       f"not {request.endpoint}; use another route for this endpoint")  # fmt: skip
        return refused


def create(options: dict[str, Any]) -> OpenAICompatibleBatchRoute:
    return OpenAICompatibleBatchRoute(options)
