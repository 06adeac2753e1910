"""lowtide: LLM work that can wait, as cheap and reliable offline jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Job", "JobSpec", "LowtideError", "__version__", "export_trace", "load_spec"]

# The public names load on first use: `import lowtide` (and the command's start-up, which
# imports this package first) stays cheap, and a Ctrl-C then is caught (lowtide/_entry.py).
_WHERE = {"Job": "lowtide.api", "LowtideError": "lowtide.core.errors", "JobSpec": "lowtide.core.spec", "load_spec": "lowtide.core.spec",
          "export_trace": "lowtide.engine.otlp"}  # fmt: skip

if TYPE_CHECKING:
    from lowtide.api import Job
    from lowtide.core.errors import LowtideError
    from lowtide.core.spec import JobSpec, load_spec
    from lowtide.engine.otlp import export_trace


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lowtide' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
