"""Real-time passthrough: the client's request, forwarded as it is, to the upstream.

A proxy forwards bytes; it does not rebuild requests. So this is one `httpx.AsyncClient`
per upstream (a connection pool of `max_connections`, shared by every request) rather than the provider SDKs that lowtide's routes
use: the raw body goes up unchanged, the upstream's status, headers and body come back
unchanged, and a streamed answer (Server-Sent Events) is passed on chunk by chunk as it
arrives. The request's headers do change: the upstream's key, from the environment
variable the config names, is set in the header that API uses, and of the client's headers
only FORWARDED ones go up (and the upstream's `forward_headers`): they describe the body
and the answer wanted. The rest would act with the gateway's key, shared by every tenant —
`OpenAI-Organization` / `OpenAI-Project` pick whose account pays, `anthropic-beta` turns on
features the operator never chose, `Idempotency-Key` could hand one tenant another's cached
answer — so they are dropped, as are the client's own key, hop-by-hop headers and SDK
telemetry. Which paths may be forwarded at all is upstream_api.py's allow-list; the path is
canonical by then (paths.py).

`call` is the same trip for the scoped endpoints (scoped.py), read whole so the gateway can
see which object the answer is about.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping

import httpx
from starlette.responses import Response, StreamingResponse

from lowtide.server.errors import ApiError
from lowtide.server.gateway.config import Upstream

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})  # fmt: skip
# The client headers that go up with the gateway's key (docs/gateway.md, "Headers").
FORWARDED = frozenset({"accept", "accept-encoding", "content-type", "user-agent", "anthropic-version"})
OWN = frozenset({"date", "server"})  # the gateway's server sets its own
# A body read through httpx comes decoded, so the encoding header no longer describes it.
DECODED = frozenset({"content-encoding"})


class UpstreamClient:
    """One upstream (an API's base URL and key) over the shared client."""

    def __init__(self, api: str, config: Upstream, client: httpx.AsyncClient):
        self.api = api
        self.config = config
        self.client = client
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        if config.api_key_env and not key:
            raise ValueError(f"upstreams.{api}.api_key_env: the environment variable {config.api_key_env} is not set")
        if key is None:
            self._auth: dict[str, str] = {}
        elif api == "anthropic":
            self._auth = {"x-api-key": key}
        else:
            self._auth = {"authorization": f"Bearer {key}"}
        self.timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0))
        self.forwarded = FORWARDED | frozenset(config.forward_headers)
        # At most this many requests reach httpx's pool at once: its bookkeeping grows with
        # the square of what it holds, so the rest wait here, in a plain FIFO.
        self.gate = asyncio.Semaphore(config.max_connections)

    def url(self, path: str) -> str:
        """`/v1/chat/completions` → `<base_url>/chat/completions` for OpenAI (whose base URL
        ends in /v1, as the SDK's does); Anthropic's base URL is the host: path kept."""
        if self.api == "openai" and path.startswith("/v1/"):
            return self.config.base_url + path[3:]
        return self.config.base_url + path

    def headers(self, incoming: Mapping[str, str]) -> list[tuple[str, str]]:
        """The client's headers that may go up (FORWARDED and `forward_headers`), then the key."""
        out = [(k, v) for k, v in incoming.items() if k.lower() in self.forwarded]
        out.extend(self._auth.items())
        return out

    async def forward(
        self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes,
        done: Callable[[int | None], None], extra: Mapping[str, str] | None = None,
    ) -> Response:  # fmt: skip
        """Send and answer with the upstream's own response; `done(status)` is called once
        the answer is over (streamed or not; None if the upstream could not be reached)."""
        url = self.url(path) + (f"?{query}" if query else "")
        request = self.client.build_request(method, url, headers=self.headers(headers), content=body, timeout=self.timeout)
        await self.gate.acquire()
        released = False
        report = done

        def finished(status: int | None) -> None:
            nonlocal released
            if not released:
                released = True
                self.gate.release()
                report(status)

        try:
            upstream = await self.client.send(request, stream=True)
        except BaseException as err:
            finished(None)
            if isinstance(err, httpx.HTTPError):
                raise ApiError(502, f"the upstream could not be reached ({type(err).__name__})", type="api_error") from None
            raise
        done = finished
        out_headers = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in HOP_BY_HOP and k.lower() not in OWN]
        out_headers.extend((extra or {}).items())
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            return _Streamed(_relay(upstream, done), upstream.status_code, out_headers)
        try:
            content = await upstream.aread()
        except httpx.HTTPError as err:
            done(None)
            raise ApiError(502, f"the upstream's answer broke off ({type(err).__name__})", type="api_error") from None
        finally:
            await upstream.aclose()
        done(upstream.status_code)
        return answer(upstream.status_code, [(k, v) for k, v in out_headers if k.lower() not in DECODED], content)

    async def call(
        self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes | AsyncIterator[bytes] = b""
    ) -> httpx.Response:
        """One request, its answer read whole (decoded): for the scoped endpoints. A body given
        as chunks is sent as they come (an upload)."""
        url = self.url(path) + (f"?{query}" if query else "")
        request = self.client.build_request(method, url, headers=self.headers(headers), content=body, timeout=self.timeout)
        async with self.gate:
            try:
                return await self.client.send(request)
            except httpx.HTTPError as err:
                raise ApiError(502, f"the upstream could not be reached ({type(err).__name__})", type="api_error") from None


def answer(status: int, headers: list[tuple[str, str]], content: bytes) -> Response:
    """A response with exactly these headers and a Content-Length for `content`."""
    response = Response(content, status_code=status)
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers] + [
        (b"content-length", str(len(content)).encode())
    ]
    return response


def relayed(upstream: httpx.Response, content: bytes | None = None) -> Response:
    """The upstream's read answer as ours (its headers, `content` in place of its body if given)."""
    skip = HOP_BY_HOP | OWN | DECODED
    headers = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in skip]
    return answer(upstream.status_code, headers, upstream.content if content is None else content)


async def _relay(upstream: httpx.Response, done: Callable[[int | None], None]) -> AsyncIterator[bytes]:
    """The upstream's bytes as they come; closed (and counted done) however the stream ends,
    a client that goes away included."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()
        done(upstream.status_code)


class _Streamed(StreamingResponse):
    """A StreamingResponse whose headers are exactly the upstream's (no media type added)."""

    def __init__(self, content: AsyncIterator[bytes], status: int, headers: list[tuple[str, str]]):
        super().__init__(content, status_code=status)
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
