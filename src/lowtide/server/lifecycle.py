"""The server's worker: advances every live batch and ticks its jobs, on its own thread so
that loading or running a big batch never stalls the HTTP side.

One pass (`step`) over the live batches, oldest first:

    validating   check the input (fault: fail it), write source rows, load the jobs
    in_progress  past expires_at: stop the jobs, then `expired`; a planned part-way expiry
                 (expire_after) likewise once its requests ran; otherwise, once every job is
                 done and --complete-after has passed: `finalizing`
    finalizing   write the output, then `completed`
    cancelling   cancel the jobs; once they stopped, write the partial output, `cancelled`

then engine ticks for the jobs of batches in progress or cancelling, oldest first, until
one of them has work, and last the validation of at most one new batch (see `step`). Every
move is checked against the status the batch had (a cancel may come in between); work
before a move is redone after a crash, and is idempotent.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from sqlalchemy import Row, and_, select

from lowtide.core.endpoints import MESSAGES
from lowtide.core.errors import InputError, RouteError, UnknownRouteError
from lowtide.core.spec import JobSpec
from lowtide.core.states import RequestState
from lowtide.engine.control import cancel_job, job_done
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes import create_route
from lowtide.server import billing, queue, records
from lowtide.server.context import Server
from lowtide.server.errors import ApiError
from lowtide.server.finalize import batch_folder, build_anthropic, build_openai
from lowtide.server.gemini_intake import take
from lowtide.server.gemini_outputs import build_gemini, meta_of
from lowtide.server.intake import Intake, check_size, take_openai_file
from lowtide.server.loop_thread import LoopThread
from lowtide.server.openrouter_api import build_openrouter
from lowtide.server.records import BatchStatus as S
from lowtide.server.translate import Rejection, decode_key
from lowtide.store.schema import jobs, requests
from lowtide.store.transitions import move_requests

log = logging.getLogger("lowtide.serve")
IDLE_MAX = 0.25  # real seconds between passes while batches are live
QUIET_MAX = 2.0  # ... and while none is
TROUBLE_WAIT = 5.0  # real seconds before a batch whose step failed is tried again


class Worker(LoopThread):
    thread_name = "lowtide-serve-worker"

    def __init__(self, server: Server):
        super().__init__()
        self.server = server
        self._trouble: dict[str, float] = {}  # batch id -> when to try it again (monotonic)
        self._stepped: Engine | None = None  # run_once's engine (no worker thread)

    # Running ---------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self.server.wake = self.wake

    async def run_once(self) -> bool:
        """One pass on the caller's event loop, for a server made with run_worker=False
        (a simulation steps serve between its client's ticks); whether anything moved."""
        if self._stepped is None:
            self._stepped = self._engine()
        busy, _ = await self.step(self._stepped)
        return busy

    async def aclose(self) -> None:
        engine, self._stepped = self._stepped, None
        if engine is not None:
            await engine.aclose()

    def _engine(self) -> Engine:
        clock = self.server.clock
        return Engine(self.server.store, clock, lease=120.0 * clock.scale, routes=self.server.config.routes)

    async def _serve(self) -> None:
        async with self._engine() as engine:
            while not self._stopping:
                try:
                    busy, wait = await self.step(engine)
                except Exception:  # keep serving; the next pass retries from the store
                    log.exception("lowtide serve: the worker's pass failed; retrying")
                    busy, wait = False, 1.0
                if not (busy or self._stopping):
                    await self._idle(wait)

    async def step(self, engine: Engine) -> tuple[bool, float]:
        """One pass; returns (whether anything moved, how long to wait if not).

        Batches are served in the order they were created, like a queue: the oldest batch
        whose job has work gets this pass's tick, and at most one new batch is validated
        after it. A batch's results are ready as early as they can be, and a new batch still
        gets its validation (and its errors) within one pass."""
        with self.server.store.begin() as conn:
            live = records.live_batches(conn)
        busy = False
        waiting = [row for row in live if row.status == S.VALIDATING.value]
        for row in live:
            if row.status != S.VALIDATING.value:
                busy |= self._advance_safely(row)
        with self.server.store.begin() as conn:
            running = [r for r in records.live_batches(conn) if r.status in (S.IN_PROGRESS, S.CANCELLING)]
        for name in [j["name"] for row in running for j in records.jobs_of(row)]:
            if self._stopping:
                break
            report = await engine.tick(name)
            if report.busy:
                busy = True
                break
        for row in waiting:
            if self._trouble.get(row.id, 0.0) <= time.monotonic():
                busy |= self._advance_safely(row)
                break
        return busy, self._next_wait(live, engine)

    def _advance_safely(self, row: Row) -> bool:
        """Advance one batch; one batch in trouble must not hold up the others."""
        if self._trouble.get(row.id, 0.0) > time.monotonic():
            return False
        try:
            moved = self.advance(row)
        except Exception:
            log.exception("lowtide serve: batch %s could not move on; trying again in %g s", row.id, TROUBLE_WAIT)
            self._trouble[row.id] = time.monotonic() + TROUBLE_WAIT
            return False
        self._trouble.pop(row.id, None)
        return moved

    def _next_wait(self, live: list[Row], engine: Engine) -> float:
        if not live:
            return QUIET_MAX
        clock = self.server.clock
        now = clock.now()
        due = [engine.next_due()] + [r.expires_at for r in live]
        due += [r.created_at + self.server.config.complete_after for r in live]
        ahead = [d - now for d in due if d is not None and d > now]
        return max(0.005, min([IDLE_MAX] + [clock.real_seconds(a) for a in ahead]))

    # Advancing one batch ----------------------------------------------------------------
    def advance(self, row: Row) -> bool:
        status = S(row.status)
        if status is S.VALIDATING:
            return self.validate(row)
        if status is S.IN_PROGRESS:
            return self.progress(row)
        if status is S.FINALIZING:
            return self.end(row, S.FINALIZING, S.COMPLETED, "completed")
        if status is S.CANCELLING:
            for job in records.jobs_of(row):
                if self._exists(job["name"]):
                    cancel_job(self.server.store, job["name"], self.server.clock)
            if self._all_done(row):
                return self.end(row, S.CANCELLING, S.CANCELLED, "cancelled")
        return False

    def validate(self, row: Row) -> bool:
        server = self.server
        faults = records.faults_of(row)
        now = server.clock.now()
        if row.api in ("openai", "gemini"):  # an inline Gemini batch was taken in at create: only a fault fails it
            fault = faults.get("fail_validation")
            errors = [dict(fault, param=None, line=None)] if fault else self._take_openai(row) if row.api == "openai" else self._take_gemini(row)
            if not errors and row.api == "openai" and server.faults.plan.enqueued_tokens:
                errors = queue.over_limit(server, row.id)  # the simulated batch queue limit
            if errors:
                with server.store.begin() as conn:
                    records.move_batch(conn, row.id, S.VALIDATING, S.FAILED, now,
                                       errors=json.dumps({"object": "list", "data": errors}))  # fmt: skip
                return True
            with server.store.begin() as conn:
                row = records.get_batch(conn, row.id)
        self._load(row, faults)
        with server.store.begin() as conn:
            records.move_batch(conn, row.id, S.VALIDATING, S.IN_PROGRESS, server.clock.now())
        return True

    def _take_openai(self, row: Row) -> list[dict[str, Any]]:
        """Check the input file and write the batch's folder; the errors, if it is refused."""
        server, config = self.server, self.server.config
        with server.store.begin() as conn:
            file = records.get_file(conn, row.input_file_id)
        if file is None or (file.expires_at is not None and file.expires_at <= server.clock.now()):
            return [{"code": "file_not_found", "message": f"The input file {row.input_file_id} was deleted.", "param": "input_file_id", "line": None}]
        if errors := check_size(file.bytes, config.openai_max_bytes):
            return errors
        with Intake(batch_folder(server, row.id), row.id) as intake:
            model, errors = take_openai_file(server.path(file.path), intake, row.endpoint, config.openai_max_requests,
                                             server.refuse(row.endpoint), config.max_json_depth)  # fmt: skip
        if errors:
            intake.discard()
            return errors
        jobs = [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()]
        with server.store.begin() as conn:
            records.set_batch(conn, row.id, model=model, jobs=json.dumps(jobs), total=intake.total, rejected=intake.rejected)
        return []

    def _take_gemini(self, row: Row) -> list[dict[str, Any]]:
        """A Gemini file batch's lines, taken in after its create answered (gemini_api.py); the
        errors, if a line is no request or the file is gone. An inline one was taken in at create."""
        name = meta_of(row).get("fileName")
        if name is None or records.jobs_of(row):  # inline, or taken in before a crash
            return []
        server = self.server
        try:
            intake = take(server, row.id, row.model, {"fileName": name})
        except ApiError as err:
            return [{"code": "invalid_argument", "message": err.message, "param": "inputConfig.fileName", "line": None}]
        jobs = [{"name": j["name"], "model": j["model"]} for j in intake.jobs.values()]
        with server.store.begin() as conn:
            records.set_batch(conn, row.id, jobs=json.dumps(jobs), total=intake.total, rejected=intake.rejected)
        return []

    def _load(self, row: Row, faults: dict[str, Any]) -> None:
        """Load each job of the batch (idempotent: rows already stored stay as they are)."""
        server = self.server
        folder = batch_folder(server, row.id)
        keep = faults.get("expire_after")
        for job in records.jobs_of(row):
            if row.api == "anthropic" and faults.get("fail_validation"):
                self._reject_all(row, job, faults["fail_validation"]["message"])
                continue
            # Rows are the bodies as they came (intake.py): stored verbatim, nothing invented.
            spec = JobSpec(
                name=job["name"],
                source={"path": str(folder / f"{job['name']}.jsonl"), "id_column": "custom_id"},
                template={"body_column": "body"},
                endpoint=row.endpoint or MESSAGES,  # a Gemini batch's is GEMINI (gemini_api.py)
                model=server.config.model or job["model"],
                route=server.config.backend,
                route_options=server.config.route_options,
                retry={"max_attempts": server.config.max_attempts, "backoff_seconds": 5.0},
                fallback=server.config.fallback,
                packing=False,  # each line is one provider request already, answered in its own shape
            )
            try:
                self._route(spec).check_model(spec.model)
            except UnknownRouteError:
                raise
            except RouteError as err:  # the backend does not run this model
                self._reject_all(row, job, str(err), status=404)
                continue
            try:
                # Intake asked the backend's `refusal` about every line (a refused one fails alone).
                report = load_job(server.store, spec, server.clock, where=f"batch {row.id}", routes_checked=True)
            except InputError as err:
                self._reject_all(row, job, str(err))
                continue
            if keep is not None:
                with server.store.begin() as conn:
                    move_requests(
                        conn, RequestState.CANCELLED,
                        and_(requests.c.job_id == report.job_id, requests.c.source_row > keep,
                             requests.c.state == RequestState.PENDING.value),
                        values={"error_code": "batch_expired", "error_message": "expired (fault plan: expire_after)"},
                    )  # fmt: skip
                keep = max(0, keep - report.rows)

    def _route(self, spec: JobSpec):
        given = self.server.config.routes.get(spec.route)
        return given if given is not None else create_route(spec.route, spec.route_options)

    def _reject_all(self, row: Row, job: dict[str, str], message: str, status: int = 400) -> None:
        """Every request of a job that cannot be loaded fails alone, with `message`."""
        folder = batch_folder(self.server, row.id)
        source = folder / f"{job['name']}.jsonl"
        if not source.exists():
            return
        rejection = Rejection(message, status=status, code="model_not_found" if status == 404 else None)
        with source.open(encoding="utf-8") as f, (folder / "rejected.jsonl").open("a", encoding="utf-8") as out:
            n = 0
            for line in f:
                cid = decode_key(json.loads(line)["custom_id"])
                out.write(json.dumps(rejection.to_json(cid) | {"model": job["model"]}) + "\n")
                n += 1
        source.unlink()
        with self.server.store.begin() as conn:
            current = records.get_batch(conn, row.id)
            jobs = [j for j in records.jobs_of(current) if j["name"] != job["name"]]
            records.set_batch(conn, row.id, jobs=json.dumps(jobs), rejected=current.rejected + n)

    def progress(self, row: Row) -> bool:
        server = self.server
        now = server.clock.now()
        expiring = now >= row.expires_at or "expire_after" in records.faults_of(row)
        if now >= row.expires_at:
            for job in records.jobs_of(row):
                if self._exists(job["name"]):
                    cancel_job(server.store, job["name"], server.clock)
        if not self._all_done(row):
            return False
        if expiring:
            return self.end(row, S.IN_PROGRESS, S.EXPIRED, "expired")
        if now < row.created_at + server.config.complete_after:
            return False
        with server.store.begin() as conn:
            moved = records.move_batch(conn, row.id, S.IN_PROGRESS, S.FINALIZING, now)
        return moved and self.end(records_get(server, row.id), S.FINALIZING, S.COMPLETED, "completed")

    def end(self, row: Row, current: S, target: S, ending: str) -> bool:
        """Write the batch's output and move it to its final status, together."""
        server = self.server
        build = {"openai": build_openai, "gemini": build_gemini, "openrouter": build_openrouter}.get(row.api, build_anthropic)
        built = build(server, row, ending)
        with server.store.begin() as conn:
            if not records.move_batch(conn, row.id, current, target, server.clock.now(), **built["values"]):
                return False
            for file in built["files"]:
                records.insert_file(conn, **file)
            billing.record(conn, built["bill"])  # with the move: a redone end bills nothing twice
        return True

    def _exists(self, name: str) -> bool:
        with self.server.store.begin() as conn:
            return conn.execute(select(jobs.c.id).where(jobs.c.name == name)).first() is not None

    def _all_done(self, row: Row) -> bool:
        return all(not self._exists(j["name"]) or job_done(self.server.store, j["name"]) for j in records.jobs_of(row))


def records_get(server: Server, batch_id: str) -> Row:
    with server.store.begin() as conn:
        return records.get_batch(conn, batch_id)
