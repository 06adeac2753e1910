"""`anthropic`: Anthropic's Messages API in real time, through the official `anthropic` SDK.

The key comes from ANTHROPIC_API_KEY (or `api_key_env`); `base_url` points it elsewhere
(any server speaking `/v1/messages`). `cache_prefix: true` marks the system prompt
`cache_control: ephemeral` (the 5-minute TTL, which suits requests sent back to back).
Requests are built and usage is read exactly as the `anthropic-batch` route does
(`wire.py`): input, cache read, cache creation and output tokens.

It shares the pool of `routes/pool/direct.py` (concurrency, rate limits, retries; see
docs/direct-routes.md). The SDK's own retries are off: the pool retries, honouring
Retry-After, and 429 / 529 (overloaded) make it send less.
"""

from __future__ import annotations

from typing import Any

import anthropic

from lowtide.core import fastjson
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.anthropic.wire import anthropic_outcome, anthropic_params, anthropic_refusal
from lowtide.routes.options import flag_option, text_option
from lowtide.routes.pool.direct import (
    POOL_OPTIONS,
    CallFailed,
    PooledRoute,
    connection_failure,
    http_failure,
)
from lowtide.routes.provider import api_key, check_options

OPTIONS = POOL_OPTIONS | {"base_url", "api_key_env", "cache_prefix"}


class AnthropicMessagesRoute(PooledRoute):
    name = "anthropic"

    def __init__(self, options: dict[str, Any], **pool: Any):
        check_options(self.name, options, OPTIONS)
        key = api_key(self.name, options, "ANTHROPIC_API_KEY")
        self.cache_ttl = "5m" if flag_option(self.name, options, "cache_prefix", False) else None
        super().__init__(options, concurrency=16, max_concurrency=256, secret=key, **pool)
        self.client = self.sdk_client(anthropic.AsyncAnthropic, anthropic.DefaultAioHttpClient, key, text_option(self.name, options, "base_url"), anthropic.Omit())
        self.url = self.endpoint("v1/messages")

    def refusal(self, request: Request) -> Refusal | None:
        return anthropic_refusal(request)

    async def send(self, request: Request) -> Outcome:
        params = anthropic_params(request, self.cache_ttl)
        if isinstance(params, Refusal):  # the loader refuses these first; a body from elsewhere, here
            raise CallFailed("invalid_request", params.message(self.name), retryable=False)
        try:
            # Serialised here: the SDK sends bytes as they are, instead of deep-copying a dict body.
            response = await self.client.post(
                self.url, content=fastjson.dumpb(params), cast_to=self._response, options={"headers": self.request_headers}
            )
        except anthropic.APIStatusError as err:
            raise http_failure(err.status_code, err.body, err.response.headers, ("type",)) from None
        except anthropic.APIConnectionError as err:
            raise connection_failure(err, self.timeout, isinstance(err, anthropic.APITimeoutError)) from None
        try:
            return anthropic_outcome(request.custom_id, fastjson.loads(response.content), batch=False)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CallFailed(
                "bad_response", f"unreadable answer ({type(err).__name__}: {err}): {response.content[:200]!r}", retryable=True
            ) from None

    async def aclose(self) -> None:
        await self.client.close()


def create(options: dict[str, Any]) -> AnthropicMessagesRoute:
    return AnthropicMessagesRoute(options)
