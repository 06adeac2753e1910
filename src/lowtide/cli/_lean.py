"""Imported first by the `lowtide` command: leave out what no command uses but a library
imports by itself.

httpx's own command line (`httpx._main`: pygments, rich's syntax highlighting) is imported by
`import httpx` whenever its extras happen to be installed: ~0.1 s of CPU at every start of
every `lowtide` command that reaches the network code. httpx falls back to a stub `main` when
it cannot be imported; lowtide never calls it.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "cannot be imported"
