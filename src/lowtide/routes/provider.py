"""What the provider batch routes share: options, keys from the environment, classification."""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any
from urllib.parse import urlsplit

from lowtide.core.cards import CARDS, check_limit
from lowtide.core.errors import NotSent, RouteError
from lowtide.routes.base import BatchLimits
from lowtide.routes.options import number_option

# Provider error codes and types that may succeed when sent again.
RETRYABLE_CODES = frozenset(
    {
        "rate_limit_exceeded", "rate_limit_error", "server_error", "api_error", "overloaded_error",
        "timeout", "timeout_error", "request_timeout", "batch_expired", "batch_cancelled",
        "expired", "canceled", "cancelled", "internal_error", "service_unavailable",
    }
)  # fmt: skip


def retryable_status(status: int) -> bool:
    return status in (408, 409, 429) or status >= 500


def batch_limits(route: str, options: dict[str, Any]) -> BatchLimits:
    """The provider's limits per batch (the route's card, core/cards.py), or tighter ones
    from route_options; a looser one is refused, naming the limit and the fix."""
    card = CARDS[route].limits
    assert card.max_requests is not None and card.max_bytes is not None, route
    requests = number_option(route, options, "max_requests", card.max_requests, int, 1)
    size = number_option(route, options, "max_bytes", card.max_bytes, int, 1)
    return BatchLimits(
        max_requests=check_limit(route, "max_requests", requests, card.max_requests, "requests"),
        max_bytes=check_limit(route, "max_bytes", size, card.max_bytes, "bytes"),
        one_model_per_batch=card.one_model_per_batch,
        min_requests=card.min_requests or 1,
    )


def check_options(route: str, options: dict[str, Any], known: set[str]) -> None:
    unknown = set(options) - known
    if unknown:
        raise RouteError(f"{route}: unknown route_options {sorted(unknown)}; known: {sorted(known)}")


def api_key(route: str, options: dict[str, Any], default_env: str) -> str:
    """The key, from the environment variable the spec names (never from the spec itself)."""
    env = options.get("api_key_env", default_env)
    key = os.environ.get(env) if isinstance(env, str) else None
    if not key:
        if not_a_variable(env):
            raise RouteError(pasted_key(route))
        raise RouteError(
            f"{route}: no API key: set the environment variable {env}"
            + ("" if "api_key_env" in options else ", or name another one in route_options.api_key_env")
        )
    return key


def not_a_variable(env: Any) -> bool:
    """Whether `api_key_env` holds something other than a conventional variable name: most
    likely the key itself, pasted in, which an error must not repeat."""
    return not (isinstance(env, str) and re.fullmatch(r"[A-Z_][A-Z0-9_]{0,127}", env))


def pasted_key(route: str) -> str:
    return (
        f"{route}: no API key: route_options.api_key_env must name the environment variable that holds "
        "the key (capitals, digits, _), and its value does not look like one (is it the key itself? it is "
        "not repeated here). Put the key in a variable, say MY_API_KEY, and write api_key_env: MY_API_KEY"
    )


LOOPBACK_POLL = (1.0, 10.0)  # a server on this machine (`lowtide serve`, a test): poll soon and often


def poll_interval(options: dict[str, Any], default: tuple[float, float]) -> tuple[float, float]:
    """[first, longest] seconds between polls: the spec's, else the provider's default, or
    LOOPBACK_POLL when `base_url` points at this machine."""
    if "poll_interval" not in options and is_loopback(options.get("base_url")):
        default = LOOPBACK_POLL
    value = options.get("poll_interval", default)
    if not (isinstance(value, list | tuple) and len(value) == 2 and 0 < value[0] <= value[1]):
        raise RouteError(f"route_options.poll_interval must be [first, longest] seconds; got {value!r}")
    return float(value[0]), float(value[1])


def is_loopback(base_url: Any) -> bool:
    if not isinstance(base_url, str):
        return False
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Errors of a connection that was never made: nothing of the request left. By name, since
# each SDK brings its own transport (httpx, httpx2, httpcore, aiohttp); a timeout, or a
# connection dropped after it was made, may have sent the request and is not among them.
NOT_CONNECTED = frozenset({"ConnectError", "ClientConnectorError"})


def never_sent(err: BaseException | None) -> bool:
    """Whether an SDK's error provably sent nothing: the connection itself was refused or its
    host not found, before any byte of the request left."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, NotSent) or any(k.__name__ in NOT_CONNECTED for k in type(err).__mro__):
            return True
        err = err.__cause__ or err.__context__
    return False
