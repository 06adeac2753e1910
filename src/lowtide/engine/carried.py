"""Keys a job's bodies carry that the installed SDK does not declare, noted once per job and
key (an event `carried_param`, shown by `lowtide status` and the dashboard).

On a route that sends a body to a provider of its own protocol unchanged (core/params.py
`carries`), such a key is not refused: it travels as it came, as the SDKs' `extra_body`
sends it (routes/openai/wire.py). Which keys an SDK declares changes from release to release
(anthropic's stopped declaring `temperature`), so the user is told which keys lowtide sent
without knowing them, once, instead of every row being refused or every row warned about.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sqlalchemy import Connection

from lowtide.core.endpoints import NEVER, PROTOCOL, known_keys
from lowtide.core.params import carries
from lowtide.engine.ledger import note_once

SDKS = {"openai": "openai", "anthropic": "anthropic", "gemini": "google-genai"}


class CarriedKeys:
    """Collects the undeclared top-level keys of a job's bodies (`see`, once per row: one
    set difference) and notes each once (`note`, in the load's transaction)."""

    def __init__(self, spec: Any):
        self.endpoint = spec.request_endpoint
        self.routes = [name for name, _, _ in spec.sending_routes if carries(name, self.endpoint)]
        # Read from the SDK at the first body seen: a renderer that only fingerprints rows
        # (`lowtide compare`, `results`) never imports the SDK (a second of CPU).
        self.known: frozenset[str] | set[str] | None = None
        self.keys: set[str] = set()

    def see(self, body: dict[str, Any]) -> None:
        if not self.routes:
            return
        if self.known is None:
            self.known = known_keys(self.endpoint) | NEVER
        if not self.known.issuperset(body):
            self.keys.update(k for k in body if k not in self.known)

    def note(self, conn: Connection, job_id: int, now: float) -> None:
        for key in sorted(self.keys):
            note_once(conn, job_id, "carried_param", carried_message(key, self.endpoint, self.routes), now)


def carried_message(key: str, endpoint: str, routes: list[str]) -> str:
    sdk = SDKS.get(PROTOCOL.get(endpoint, ""), "the")
    try:
        said = f"{sdk} {version(sdk)}"
    except PackageNotFoundError:
        said = sdk
    return (f"`{key}` is not a parameter of {endpoint} as the installed SDK ({said}) declares it; "
            f"{' and '.join(routes)} sends it in the body as it is (as the SDK's extra_body would)")  # fmt: skip
