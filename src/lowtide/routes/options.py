"""Reading a route's `route_options`: each option checked by name and kind when the route is
made, never cut or guessed, and an API key kept out of what a route's errors say."""

from __future__ import annotations

from typing import Any

from lowtide.core.errors import RouteError


def scrub(route: object, text: str) -> str:
    """`text` without the route's API key (`route.secret`, where it holds one): a proxy or a
    self-hosted server may echo the request's Authorization header in an error, which the
    engine would otherwise keep in the store and print."""
    secret = getattr(route, "secret", None)
    return text.replace(secret, "[api key]") if secret else text


def number_option(route: str, options: dict[str, Any], key: str, default: Any, kind: type = int, minimum: float = 0) -> Any:
    """route_options[key] as a `kind` (int or float) of at least `minimum`, or `default` when
    it is not given; anything else is refused by name, never cut (2.5 is not a whole number)
    or read as a number it is not (true, NaN)."""
    value = options.get(key, default)
    if value is None:
        return None
    whole = kind is int
    try:
        number = kind(value)
        fits = not isinstance(value, bool) and number >= minimum and not (whole and isinstance(value, float) and value != number)
    except (TypeError, ValueError, OverflowError):
        fits = False
    if not fits:
        what = "a whole number" if whole else "a number"
        raise RouteError(f"{route}: route_options.{key} must be {what} ≥ {minimum:g}; got {value!r}")
    return number


def flag_option(route: str, options: dict[str, Any], key: str, default: bool) -> bool:
    """route_options[key] as true or false; `"no"` or 0 is refused, not read as true."""
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise RouteError(f"{route}: route_options.{key} must be true or false; got {value!r}")
    return value


def text_option(route: str, options: dict[str, Any], key: str, default: str | None = None) -> str | None:
    """route_options[key] as text (a URL, a path, a name), or `default` when not given."""
    value = options.get(key, default)
    if value is not None and (not isinstance(value, str) or not value):
        raise RouteError(f"{route}: route_options.{key} must be text; got {value!r}")
    return value


def texts_option(route: str, options: dict[str, Any], key: str) -> list[str]:
    """route_options[key] as a list of texts (one text is a list of one), [] when not given:
    a text is never read as the list of its characters."""
    value = options.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RouteError(f"{route}: route_options.{key} must be a list of texts; got {value!r}")
    return value


def secret_of(key: str | None) -> str | None:
    """The key as `scrub` looks for it: a placeholder too short to be one is not replaced."""
    return key if key and len(key) >= 8 else None
