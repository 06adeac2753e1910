"""FastAPI apps over the engine. `lowtide serve`: a Batch API server (OpenAI and Anthropic
protocols) whose batches run as lowtide jobs on any route.

The names load on first use: every `lowtide` command imports a constant or two from here
(the CLI's options), and FastAPI with the apps costs a second of CPU that only serve, the
gateway and the dashboard need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ServeConfig", "create_app"]

_WHERE = {"create_app": "lowtide.server.app", "ServeConfig": "lowtide.server.context"}

if TYPE_CHECKING:
    from lowtide.server.app import create_app
    from lowtide.server.context import ServeConfig


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lowtide.server' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
