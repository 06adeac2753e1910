"""Refusing other sites: what keeps a web page the user happens to have open from using a
`lowtide serve` (or gateway) that listens on their machine.

A page of any origin may send "simple" requests to any address without asking first (a form
post, a `fetch` whose body is text/plain), and the server would act on them; a page whose
own name it points at 127.0.0.1 (DNS rebinding) may even read the answers. Browsers mark
both: the first with an `Origin` header naming the page, the second with the page's name
as `Host`. So, ahead of everything else, for every HTTP request:

- `Origin`, when sent, must be the server's own (the host:port of the request's `Host`) or
  one allowed (`--allow-origin`): 403 otherwise. The SDKs, curl and scripts send none.
- Open (no key configured): `Host` must be `localhost` or an IP address (rebinding needs a
  name the attacker owns) or a name allowed (`--allow-host`; `*`: any): 400 otherwise.
  With keys, a rebinding page still holds no key, so any Host is served.
- A body sent to a JSON endpoint must say it is JSON (`Content-Type: application/json`, or
  no type at all): 415 otherwise. Uploads keep their own types (`Policy.raw_paths`).

Refusals are answered in the caller's provider shape (errors.py), naming what to change.

    app.add_middleware(Guard, policy=serve_policy(config))  # or: Guard(asgi_app, policy)
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lowtide.server.errors import ApiError, api_of

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})  # the usual ones, before parsing any
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
WATCHED = frozenset({b"host", b"origin", b"content-type", b"content-length", b"transfer-encoding"})
# Serve's endpoints whose bodies are not JSON: OpenAI's multipart upload, Gemini's raw chunks
# (its upload start is JSON, but needs X-Goog-Upload-* headers no page can send unasked).
SERVE_RAW_PATHS = ("/v1/files", "/upload/")


@dataclass(frozen=True, slots=True)
class Policy:
    open: bool  # no key configured: `Host` is checked
    hosts: frozenset[str] = frozenset()  # names served besides loopback (lowercase, no port); "*": any
    origins: frozenset[str] = frozenset()  # other origins allowed, as "scheme://host[:port]" (lowercase)
    # Paths (prefixes) whose bodies may be of any type; None: no endpoint is held to JSON.
    raw_paths: tuple[str, ...] | None = SERVE_RAW_PATHS
    closing: str = "give it an --api-key"  # how else an open server stops being open

    @classmethod
    def of(cls, *, open: bool, hosts: Iterable[str] = (), origins: Iterable[str] = (),
           raw_paths: tuple[str, ...] | None = SERVE_RAW_PATHS, closing: str = "give it an --api-key") -> Policy:  # fmt: skip
        return cls(open, frozenset(_name(h) for h in hosts if h.strip()),
                   frozenset(o.strip().rstrip("/").lower() for o in origins if o.strip()), raw_paths, closing)  # fmt: skip

    def refusal(self, method: str, path: str, headers: dict[str, str]) -> ApiError | None:
        """Why this request may not be served, or None."""
        host = headers.get("host")
        origin = headers.get("origin")
        if self.open and host is not None and not self._host_served(host):
            return ApiError(400, (
                f"Host {host[:100]!r} is not served: open to any caller, this server answers only to localhost, IP "
                f"addresses and the names given with --allow-host (a web page could otherwise reach it under its own "
                f"name). Start it with --allow-host {_name(host)[:100]} to serve that name, or {self.closing}."))  # fmt: skip
        if origin is not None and not self._origin_allowed(origin, host):
            return ApiError(403, (
                f"Requests from web pages of another origin are refused; this one came from {origin[:100]!r}. "
                f"Start the server with --allow-origin {origin[:100]} to accept that origin."))  # fmt: skip
        if self.raw_paths is not None and method in BODY_METHODS and not path.startswith(self.raw_paths):
            kind = headers.get("content-type")
            if kind is not None and _has_body(headers) and not _is_json(kind):
                return ApiError(415, f"Content-Type {kind[:100]!r} is not accepted here: send the body as JSON with Content-Type: application/json.")
        return None

    def _host_served(self, host: str) -> bool:
        name = _name(host)
        return name in LOCAL_NAMES or "*" in self.hosts or name in self.hosts or _is_address(name)

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().lower()
        if origin in self.origins:
            return True
        scheme, sep, netloc = origin.partition("://")
        # Same origin: the page was served by this server under the name it now calls.
        return bool(sep) and scheme in ("http", "https") and host is not None and netloc == host.strip().lower()


class Guard:
    """ASGI middleware applying a `Policy` to every HTTP request (others pass untouched)."""

    def __init__(self, app: Any, policy: Policy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in WATCHED}
            refused = self.policy.refusal(scope["method"], scope["path"], headers)
            if refused is not None:
                await refused.response(api_of(scope["path"]))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def serve_policy(config: Any) -> Policy:
    """The policy of `lowtide serve` for its `ServeConfig`."""
    return Policy.of(open=not config.api_keys, hosts=config.allow_hosts, origins=config.allow_origins)


def protect(app: Any, config: Any) -> None:
    """Install serve's guard on a FastAPI app (outermost), once however often it is called."""
    if not any(m.cls is Guard for m in app.user_middleware):
        app.add_middleware(Guard, policy=serve_policy(config))


def _name(host: str) -> str:
    """`Host: LocalHost.:8000` → `localhost`; `[::1]:8000` → `[::1]`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")


@functools.lru_cache(maxsize=1024)  # a Host is one of a few; parsing one costs more than the rest
def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def _has_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length")
    return "transfer-encoding" in headers or (length is not None and length.strip() not in ("", "0"))


def _is_json(kind: str) -> bool:
    media = kind.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
