"""lowtide inside the orchestrators data teams run (Airflow, Dagster), each behind its own
extra: `pip install lowtide` pulls none of them, and a module here imported without its
extra (or with a release outside the supported range) fails with lowtide's message naming
the extra and the pip command (`require`)."""

from __future__ import annotations

import importlib
import re

from lowtide.core.errors import InputError


class MissingExtra(InputError, ImportError):
    """An integration's package is not installed, or is a release lowtide does not support."""


def require(module: str, extra: str, minimum: tuple[int, ...] = (), below: tuple[int, ...] | None = None) -> None:
    """Import `module` (the orchestrator's package) or raise MissingExtra with the fix: the
    extra to install, and the supported range where the installed release is outside it."""
    fix = f"pip install 'lowtide[{extra}]'"
    try:
        package = importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"lowtide.integrations.{extra} needs the {extra!r} extra: {fix}") from None
    found = getattr(package, "__version__", "0")
    release = tuple(int(n) for n in re.findall(r"\d+", found)[: max(len(minimum), len(below or ()), 1)])
    if release < minimum or (below is not None and release >= below):
        supported = ".".join(map(str, minimum)) + (f" to below {'.'.join(map(str, below))}" if below else " or later")
        raise MissingExtra(f"lowtide.integrations.{extra} supports {module} {supported}; {found} is installed: {fix}")
