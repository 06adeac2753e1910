"""`echo-batch`: the echo answers, delivered the way a batch provider delivers them.

A dry-run batch route for trying a job's batch path, and for tests of the engine's plan →
submit → poll → ingest steps. Its "provider" is a folder (option `dir`, default
`$LOWTIDE_ECHO_BATCH_DIR` or `~/.cache/lowtide/echo-batch`), so batches survive the process
that submitted them, like a provider's do. A batch ends on its `polls_to_complete`-th poll;
results come back in reverse order (order is never assumed).

Options: `dir`, `polls_to_complete` (1), `max_requests` (1000), `drop: [custom_id]` (left out
of the results, as a provider may), and echo's `fail_attempts`, `reject` and `answer`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Collection, Iterable
from pathlib import Path
from typing import Any, Literal

from lowtide.core.cards import CARDS
from lowtide.core.errors import BatchGone, RouteError
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.base import BatchLimits, BatchStatus
from lowtide.routes.options import number_option, text_option, texts_option
from lowtide.routes.own.echo import EchoRoute

MAX_BYTES = CARDS["echo-batch"].limits.max_bytes or 0  # core/cards.py
KNOWN_OPTIONS = {"dir", "polls_to_complete", "cancel_polls", "max_requests", "drop", "fail_attempts", "reject", "answer"}


class EchoBatchRoute:
    kind: Literal["batch"] = "batch"
    name = "echo-batch"
    poll_interval = (1.0, 5.0)  # seconds: first poll, longest wait between polls

    def __init__(self, options: dict[str, Any]):
        unknown = set(options) - KNOWN_OPTIONS
        if unknown:
            raise RouteError(f"echo-batch: unknown route_options {sorted(unknown)}; known: {sorted(KNOWN_OPTIONS)}")
        default_dir = os.environ.get("LOWTIDE_ECHO_BATCH_DIR") or "~/.cache/lowtide/echo-batch"
        self.dir = Path(text_option(self.name, options, "dir") or default_dir).expanduser()
        self.polls_to_complete = number_option(self.name, options, "polls_to_complete", 1)
        self.cancel_polls = number_option(self.name, options, "cancel_polls", 1)
        self.drop = set(texts_option(self.name, options, "drop"))
        self.limits = BatchLimits(max_requests=number_option(self.name, options, "max_requests", 1000, int, 1), max_bytes=MAX_BYTES)
        self.echo = EchoRoute({k: options[k] for k in ("fail_attempts", "reject", "answer") if k in options})

    def check_model(self, model: str) -> None:
        """Any model name: nothing is called."""

    def _meta_path(self, batch_id: str) -> Path:
        return self.dir / batch_id / "meta.json"

    def _read(self, batch_id: str) -> dict[str, Any]:
        try:
            return json.loads(self._meta_path(batch_id).read_text())
        except FileNotFoundError:
            raise BatchGone(f"echo-batch: no batch {batch_id} in {self.dir}") from None

    def _write(self, batch_id: str, meta: dict[str, Any]) -> None:
        tmp = self._meta_path(batch_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        tmp.replace(self._meta_path(batch_id))

    def refusal(self, request: Request) -> Refusal | None:
        return self.echo.refusal(request)

    async def submit(self, key: str, requests: Iterable[Request]) -> str:
        batch_id = f"ebatch_{uuid.uuid4().hex[:16]}"
        folder = self.dir / batch_id
        folder.mkdir(parents=True)
        total = 0
        with (folder / "input.jsonl").open("w") as f:
            for r in requests:
                total += 1
                f.write(json.dumps({"custom_id": r.custom_id, "attempt": r.attempt, "body": r.to_payload()}) + "\n")
        self._write(batch_id, {"key": key, "polls": 0, "total": total, "cancelled": False, "cancelled_at_poll": None})
        return batch_id

    async def find(
        self, key: str, size: int, not_before: float, known: Collection[str] = (), sent: Collection[str] | None = None
    ) -> str | None:
        if not self.dir.exists():
            return None
        for meta in self.dir.glob("*/meta.json"):
            if json.loads(meta.read_text()).get("key") == key:
                return meta.parent.name
        return None

    async def poll(self, batch_id: str) -> BatchStatus:
        meta = self._read(batch_id)
        if self._ended(meta):
            return BatchStatus(phase="ended", ended=True, counts={"total": meta["total"]})
        meta["polls"] += 1
        self._write(batch_id, meta)
        ended = self._ended(meta)
        phase = "ended" if ended else "cancelling" if meta["cancelled"] else "in_progress"
        return BatchStatus(phase=phase, ended=ended, counts={"total": meta["total"], "done": self._done(meta)})

    def _ended(self, meta: dict[str, Any]) -> bool:
        if meta["cancelled"]:
            return meta["polls"] - meta["cancelled_at_poll"] >= self.cancel_polls
        return meta["polls"] >= self.polls_to_complete

    def _done(self, meta: dict[str, Any]) -> int:
        """How many requests (in input order) are done after the polls so far."""
        return min(meta["total"], meta["total"] * meta["polls"] // self.polls_to_complete)

    async def results(self, batch_id: str) -> AsyncIterator[Outcome]:
        meta = self._read(batch_id)
        lines = (self.dir / batch_id / "input.jsonl").read_text().splitlines()
        done = self._done(meta)
        for i, line in reversed(list(enumerate(lines))):
            item = json.loads(line)
            if item["custom_id"] in self.drop:
                continue
            if i >= done:  # only a cancelled batch ends with requests not done
                yield Outcome.failure(item["custom_id"], "batch_cancelled", "echo-batch: batch was cancelled", True)
                continue
            request = Request.from_payload(item["custom_id"], item["body"], item["attempt"])
            try:
                outcome = self.echo.outcome(request)
            except Exception as err:  # a line echo cannot answer fails alone, as a provider's bad line does, not its batch
                outcome = Outcome.failure(item["custom_id"], "invalid_request", f"echo-batch: {type(err).__name__}: {err}", False)
            yield outcome

    async def cancel(self, batch_id: str) -> None:
        meta = self._read(batch_id)
        if not meta["cancelled"] and not self._ended(meta):
            meta["cancelled"] = True
            meta["cancelled_at_poll"] = meta["polls"]
            self._write(batch_id, meta)

    async def aclose(self) -> None:
        pass


def create(options: dict[str, Any]) -> EchoBatchRoute:
    return EchoBatchRoute(options)
