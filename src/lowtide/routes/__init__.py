"""Route registry. Built-in routes register through the `lowtide.routes` entry-point group,
exactly as a third-party plugin would: one module plus one line in pyproject.toml."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from lowtide.core.errors import UnknownRouteError
from lowtide.routes.base import BatchLimits, BatchRoute, BatchStatus, DirectRoute, Route

__all__ = [
    "BatchLimits",
    "BatchRoute",
    "BatchStatus",
    "DirectRoute",
    "Route",
    "create_route",
    "known_routes",
]

ENTRY_POINT_GROUP = "lowtide.routes"


@cache
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_routes() -> list[str]:
    return sorted(_entry_points())


def create_route(name: str, options: dict[str, Any] | None = None) -> Route:
    """Build the route registered as `name`; an unknown name lists the known ones."""
    ep = _entry_points().get(name)
    if ep is None:
        known = ", ".join(known_routes()) or "(none: is lowtide installed?)"
        raise UnknownRouteError(
            f'unknown route "{name}"; known routes: {known}. '
            "Fix the `route:` key of the job spec, or install the plugin that provides it."
        )
    return ep.load()(dict(options or {}))
