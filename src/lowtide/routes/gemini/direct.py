"""`gemini`: Gemini's generateContent in real time, through the official `google-genai` SDK.

The key comes from GEMINI_API_KEY or GOOGLE_API_KEY (or `api_key_env`); `base_url` points
the SDK elsewhere (any server speaking Gemini's v1beta API, like `lowtide serve`). A body
travels verbatim: the SDK's `http_options.extra_body` carries it whole (its `contents`
replace the SDK's own), and the SDK's `should_return_http_response` hands back the
provider's own answer, so nothing passes through the SDK's types either way. A chat body
is translated once by `wire.py`'s table.

`service_tier: flex` (or `priority`, `standard`) sends Gemini's `serviceTier` on each body
that does not set its own: flex is the real-time API at about half the price, for work that
can wait minutes; the timeout then defaults to 900 s. The tier the answer reports
(`usageMetadata.serviceTier` or `trafficType`) is what the ledger bills; an answer that
does not say is billed at the route's tier.

It shares the pool of `routes/pool/direct.py` (concurrency, rate limits, retries; docs/direct-routes.md);
the SDK's own retries are off.
"""

from __future__ import annotations

import json
from typing import Any

from google.genai import errors as genai_errors
from google.genai import types

from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.gemini.batch import gemini_client
from lowtide.routes.gemini.models import check_gemini_model
from lowtide.routes.gemini.names import named_body
from lowtide.routes.gemini.wire import gemini_outcome
from lowtide.routes.options import texts_option
from lowtide.routes.pool.direct import (
    POOL_OPTIONS,
    CallFailed,
    PooledRoute,
    connection_failure,
    http_failure,
)
from lowtide.routes.provider import check_options

OPTIONS = POOL_OPTIONS | {"base_url", "api_key_env", "service_tier", "models"}
TIERS = ("flex", "priority", "standard")


class GeminiRoute(PooledRoute):
    name = "gemini"

    def __init__(self, options: dict[str, Any], **pool: Any):
        check_options(self.name, options, OPTIONS)
        self.service_tier = options.get("service_tier")
        if self.service_tier is not None and self.service_tier not in TIERS:
            raise RouteError(f"gemini: route_options.service_tier must be one of {', '.join(TIERS)}; got {self.service_tier!r}")
        timeout = 900.0 if self.service_tier == "flex" else 600.0
        super().__init__(options, concurrency=16, max_concurrency=256, timeout=timeout, **pool)
        self.models = frozenset(texts_option(self.name, options, "models"))
        self.client = gemini_client({**options, "timeout": self.timeout}, self.name)

    def check_model(self, model: str) -> None:
        check_gemini_model(self.name, model, self.models)

    def refusal(self, request: Request) -> Refusal | None:
        body = named_body(request, self.name)
        return body if isinstance(body, Refusal) else None

    async def send(self, request: Request) -> Outcome:
        body = named_body(request, self.name)
        if isinstance(body, Refusal):  # the loader refuses these first; a body from elsewhere, here
            raise CallFailed("invalid_request", body.message(self.name), retryable=False)
        sent = {k: v for k, v in body.items() if k != "model"}  # the model is the call's path
        if self.service_tier and "serviceTier" not in sent:  # the route's default; a body's own wins
            sent["serviceTier"] = self.service_tier
        config = types.GenerateContentConfig(http_options=types.HttpOptions(extra_body=sent), should_return_http_response=True)
        try:
            response = await self.client.aio.models.generate_content(model=request.model, contents="-", config=config)
        except genai_errors.APIError as err:
            raise http_failure(err.code, err.details, {}, ()) from None
        except (OSError, TimeoutError, ConnectionError) as err:
            raise connection_failure(err, self.timeout, isinstance(err, TimeoutError)) from None
        except Exception as err:  # the HTTP library's own errors (aiohttp, httpx)
            if type(err).__module__.split(".")[0] in ("aiohttp", "httpx", "httpx2", "httpcore"):
                raise connection_failure(err, self.timeout, "Timeout" in type(err).__name__) from None
            raise
        raw = response.sdk_http_response.body if response.sdk_http_response else None
        try:
            return gemini_outcome(request.custom_id, json.loads(raw or ""))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CallFailed("bad_response", f"unreadable answer ({type(err).__name__}: {err}): {str(raw)[:200]!r}", retryable=True) from None

    async def aclose(self) -> None:
        await self.client.aio.aclose()


def create(options: dict[str, Any]) -> GeminiRoute:
    return GeminiRoute(options)
