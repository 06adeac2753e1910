"""A Gemini body's snake_case field names (which Google's proto3-JSON parser takes) in the
camelCase the rest of lowtide reads (core/gemini.py `camel_body`), before the Gemini wire
(`wire.gemini_body`) judges or sends it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lowtide.core.endpoints import GEMINI
from lowtide.core.gemini import camel_body
from lowtide.core.types import Refusal, Request
from lowtide.routes.gemini.wire import gemini_body


def named_body(request: Request, route: str) -> dict[str, Any] | Refusal:
    """The generateContent body `request` is sent as, its field names in camelCase."""
    if request.endpoint == GEMINI:
        named = camel_body(request.body)
        if isinstance(named, tuple):
            return Refusal(*named)
        if named is not request.body:
            request = replace(request, body=named)
    return gemini_body(request, route)
