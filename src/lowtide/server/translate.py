"""The edge between provider bodies and lowtide: what a body this server cannot run fails
with (a `Rejection`: that request alone fails, in the provider's shape, and the batch goes
on), and how an API's custom_id travels through the store.

A body is never rebuilt here: it is stored verbatim (DESIGN invariant 8). `rejection`
asks only what the SDK's own types require of the endpoint, and the backend route's
`refusal`: an upstream of the body's protocol takes every key its SDK knows; lowtide's own
engines (echo, local) refuse what they cannot honour, by name (routes/own/plain.py).
"""

from __future__ import annotations

import base64
import types
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Union

import typing_extensions
from pydantic import ConfigDict, TypeAdapter, ValidationError

from lowtide.core.endpoints import known_keys, request_type, required_keys
from lowtide.core.ids import key_of
from lowtide.core.types import Request

PLAIN = (int, float, str, bool, type(None))


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one request fails before it runs (an HTTP 4xx for that request alone)."""

    message: str
    status: int = 400
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None

    def to_json(self, custom_id: str) -> dict[str, Any]:
        return {"custom_id": custom_id, "status": self.status, "type": self.type, "code": self.code,
                "param": self.param, "message": self.message}  # fmt: skip


def rejection(route: Any, endpoint: str, body: dict[str, Any], model: str | None = None, api: str = "openai") -> Rejection | None:
    """Why `route` cannot run `body` (for `endpoint`, with lowtide's model override `model`),
    or None. A key the endpoint requires is named in the provider's own words (`api`)."""
    missing = sorted(required_keys(endpoint) - body.keys())
    if missing:
        key = missing[0]
        said = f"{key}: Field required" if api == "anthropic" else f"Missing required parameter: '{key}'."
        return Rejection(said, param=key)
    checks = scalar_checks(endpoint)
    for key, value in body.items():
        check = checks.get(key)
        if check is not None:
            try:
                check.validate_python(value)
            except ValidationError as err:
                said = " or ".join(dict.fromkeys(e["msg"] for e in err.errors()))
                return Rejection(f"Invalid type for '{key}': {said} (got {type(value).__name__} {_short(value)}).", param=key)
    refusal = getattr(route, "refusal", None)
    if refusal is None:  # a plugin route that does not say: it takes what it is sent
        return None
    refused = refusal(Request("", endpoint, body | {"model": model} if model else body))
    if refused is None:
        return None
    return Rejection(refused.message(route.name), param=refused.field)


def prepare(endpoint: str) -> None:
    """Read `endpoint`'s SDK request type now, before a batch's lines stream in, not at the
    first line. Once per endpoint and process, when the first body for it comes: a server
    asked only in OpenAI's protocol never imports the anthropic and google-genai packages
    (1-3 s of CPU at start)."""
    known_keys(endpoint)
    required_keys(endpoint)
    scalar_checks(endpoint)


@cache
def scalar_checks(endpoint: str) -> dict[str, TypeAdapter]:
    """A strict check of each body key whose SDK type is plain (numbers, text, flags, text
    lists): a wrong type there is wrong for every server of the protocol, and an own engine
    would trip on it. Richer types (messages, tools, literals) are the route's to judge: an
    upstream may take values the installed SDK does not know yet."""
    hints = typing_extensions.get_type_hints(request_type(endpoint), include_extras=True)
    strict = ConfigDict(strict=True)
    return {key: TypeAdapter(hint, config=strict) for key, hint in ((k, _bare(h)) for k, h in hints.items()) if _plain(hint)}


def _bare(hint: Any) -> Any:
    while typing_extensions.get_origin(hint) in (typing_extensions.Required, typing_extensions.NotRequired):
        hint = typing_extensions.get_args(hint)[0]
    return hint


def _plain(hint: Any) -> bool:
    origin = typing_extensions.get_origin(hint)
    if origin in (Union, types.UnionType):
        return all(_plain(arg) for arg in typing_extensions.get_args(hint))
    if origin in (Sequence, list):
        return typing_extensions.get_args(hint) == (str,)
    return hint in PLAIN


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# The loader strips ids, refuses lone surrogates and takes an integral float's spelling for
# the integer's key ("1.0" is "1", core/ids.py), and PostgreSQL's text holds no NUL; an API's
# custom_id may be any string ("1" and "1.0" are two at OpenAI and Gemini). Those that would
# not survive are carried as "~" + URL-safe base64 of their UTF-8.
def encode_key(custom_id: str) -> str:
    if (
        custom_id
        and custom_id == custom_id.strip()
        and not custom_id.startswith("~")
        and "\x00" not in custom_id
        and key_of(custom_id) == custom_id
    ):
        try:
            custom_id.encode("utf-8")
            return custom_id
        except UnicodeEncodeError:
            pass
    raw = custom_id.encode("utf-8", "surrogatepass")
    return "~" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_key(key: str) -> str:
    if not key.startswith("~"):
        return key
    data = key[1:]
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)).decode("utf-8", "surrogatepass")
