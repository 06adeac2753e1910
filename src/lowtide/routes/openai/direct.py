"""`openai` and `openai-compatible`: chat completions, responses, completions and embeddings
in real time, through the official `openai` SDK (`/v1/embeddings` for embedding jobs: vLLM,
llama.cpp's server or TEI behind an OpenAI-compatible endpoint, or OpenAI itself).

`openai-compatible` talks to any server speaking `/v1/chat/completions` (vLLM, SGLang,
llama.cpp's server, Ollama, OpenAI itself): `base_url` is required, and a key is only sent
if `api_key_env` names one (self-hosted servers mostly want none; a placeholder goes
instead). Its concurrency starts at the server's batch size: `concurrency`, else
`max_num_seqs` (say what the server was started with), else the `total_slots` a llama.cpp
server reports at `GET /props`, else 256.

`openai` is OpenAI's own API: the key comes from OPENAI_API_KEY (or `api_key_env`), and
`service_tier` is passed through. `service_tier: flex` is OpenAI's half-price tier for work
that can wait: answers take longer, so its default `timeout` is 900 s instead of 600 s.

Both share the pool of `routes/pool/direct.py` (concurrency, rate limits, retries; see
docs/direct-routes.md for every option). The SDK's own retries are off: the pool retries.
Requests are sent with the SDK's raw-response call and the JSON is read here, which is
several times cheaper than building the SDK's models for each answer. (For embeddings this also
keeps the body verbatim: `client.embeddings.create` would add `encoding_format: base64`
to a body that asked for none, and decode the vectors itself.)
"""

from __future__ import annotations

import json
from typing import Any

import openai

from lowtide.core import fastjson
from lowtide.core.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, MODERATIONS, RESPONSES
from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.openai.wire import openai_outcome, openai_refusal
from lowtide.routes.options import number_option, text_option
from lowtide.routes.pool.direct import (
    POOL_OPTIONS,
    CallFailed,
    PooledRoute,
    connection_failure,
    http_failure,
)
from lowtide.routes.provider import api_key, check_options

COMPATIBLE_OPTIONS = POOL_OPTIONS | {"base_url", "api_key_env", "max_num_seqs", "service_tier"}
OPENAI_OPTIONS = POOL_OPTIONS | {"base_url", "api_key_env", "service_tier"}
NO_KEY = "no-key"  # what a self-hosted server without keys is sent


class OpenAIChatRoute(PooledRoute):
    def __init__(self, name: str, options: dict[str, Any], **pool: Any):
        self.name = name
        compatible = name == "openai-compatible"
        check_options(name, options, COMPATIBLE_OPTIONS if compatible else OPENAI_OPTIONS)
        self.service_tier = text_option(name, options, "service_tier")
        if compatible:
            if not text_option(name, options, "base_url"):
                raise RouteError(
                    f"{name}: route_options.base_url is required: the server's OpenAI-compatible "
                    "root, e.g. http://127.0.0.1:8000/v1"
                )
            key = api_key(name, options, "") if options.get("api_key_env") else NO_KEY
            seqs = number_option(name, options, "max_num_seqs", None, int, 1)
            self.probe_slots = seqs is None and "concurrency" not in options
            defaults = {"concurrency": seqs or 256, "expected_latency": 30.0}
        else:
            key = api_key(name, options, "OPENAI_API_KEY")
            self.probe_slots = False
            defaults = {"concurrency": 32, "max_concurrency": 512, "expected_latency": 10.0}
        timeout = 900.0 if self.service_tier == "flex" else 600.0
        super().__init__(options, timeout=timeout, secret=key, **defaults, **pool)
        self.client = self.sdk_client(openai.AsyncOpenAI, openai.DefaultAioHttpClient, key, text_option(name, options, "base_url"), openai.Omit())
        self.urls = {e: self.endpoint(e.removeprefix("/v1/")) for e in (CHAT, RESPONSES, COMPLETIONS, EMBEDDINGS, MODERATIONS)}

    def refusal(self, request: Request) -> Refusal | None:
        # A key the SDK does not declare (a self-hosted engine's `top_k`, say) is carried.
        return openai_refusal(request, self.name)

    async def prepare(self) -> None:
        """Ask a llama.cpp server how many slots it has; any other answer changes nothing."""
        if not self.probe_slots:
            return
        root = str(self.client.base_url).rstrip("/").removesuffix("/v1")
        try:
            response = await self.client.with_options(timeout=5.0).get(f"{root}/props", cast_to=self._response)
            slots = int(json.loads(response.content)["total_slots"])
        except Exception:  # not llama.cpp, or no such endpoint: keep the default
            return
        if slots > 0:
            self.controller.maximum = max(self.controller.maximum, 2 * slots)
            self.controller.set_limit(slots)

    async def send(self, request: Request) -> Outcome:
        body = request.body
        if self.service_tier and "service_tier" not in body:  # the route's default; a body's own wins
            body = body | {"service_tier": self.service_tier}
        try:
            # Serialised here: the SDK sends bytes as they are, instead of deep-copying a dict body.
            content = fastjson.dumpb(body)
            response = await self.client.post(
                self.urls[request.endpoint], content=content, cast_to=self._response, options={"headers": self.request_headers}
            )
        except openai.APIStatusError as err:
            raise http_failure(err.status_code, err.body, err.response.headers, ("code", "type")) from None
        except openai.APIConnectionError as err:
            raise connection_failure(err, self.timeout, isinstance(err, openai.APITimeoutError)) from None
        try:
            return openai_outcome(request.custom_id, request.endpoint, fastjson.loads(response.content), batch=False)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
            raise CallFailed(
                "bad_response", f"unreadable answer ({type(err).__name__}: {err}): {response.content[:200]!r}", retryable=True
            ) from None

    async def aclose(self) -> None:
        await self.client.close()


def create_compatible(options: dict[str, Any]) -> OpenAIChatRoute:
    return OpenAIChatRoute("openai-compatible", options)


def create(options: dict[str, Any]) -> OpenAIChatRoute:
    return OpenAIChatRoute("openai", options)
