"""The collector: turns deferred requests into lowtide jobs, ticks them, records their
results and delivers them. It runs on its own thread with its own event loop (as `lowtide
serve`'s worker does), so flushing, loading and ticking never stall the HTTP side.

One pass:

    flush     accepted requests of one (api, model) become one flush (a lowtide job named
              `gateway-<n>`, in the same transaction as the requests move to `queued`) when
              flush_size of them wait, when the oldest has waited flush_age, or when the
              earliest deadline among them leaves no more time to wait (a batch sent later
              could not end before deadline − safety_margin)
    load      each flush still `loading`: its requests are written as rows holding their
              bodies verbatim (`template.body_column`) to <data_dir>/flushes/gateway-<n>.jsonl
              and `load_job`ed — idempotent, so a restart redoes it without loading twice
    tick      one engine tick per running flush's job: the engine submits, polls, ingests,
              retries, and near a deadline cuts over to the fallback (real-time) route
    collect   requests of a job that reached a terminal state are recorded on their
              deferred rows — the provider's whole response body where the route kept
              one, else one in the API's shape — with the money saved; a flush
              whose requests are all recorded, and whose job has no batch out (one cut
              over at a deadline or cancelled is polled to its end), is done

Deliveries (webhooks.py) run beside the passes in the same loop, each attempt a task of its own.
Only one collector may run per store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from lowtide.core.errors import InputError
from lowtide.core.pricing import attempt_cost
from lowtide.core.spec import FallbackSpec, JobSpec
from lowtide.core.types import Usage
from lowtide.engine.fallback import expected_turnaround
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.server.gateway import records
from lowtide.server.gateway.records import DeferredState, FlushState
from lowtide.server.gateway.shape import ENDPOINT, dumps, flush_line, result_of
from lowtide.server.gateway.webhooks import Deliverer
from lowtide.server.loop_thread import LoopThread
from lowtide.store.gateway_schema import gateway_requests
from lowtide.store.money import to_pico
from lowtide.store.payloads import payload_text
from lowtide.store.queries import batches_out
from lowtide.store.schema import jobs, requests

if TYPE_CHECKING:
    from lowtide.server.gateway.context import Gateway

log = logging.getLogger("lowtide.gateway")
IDLE_MAX = 0.25  # real seconds between passes
TERMINAL = ("succeeded", "failed", "cancelled")


def _warm_up() -> None:
    """Import now what the first flush would import while holding the store's write lock."""
    import pyarrow  # noqa: F401  (the loader's duplicate-id check)
    import pyarrow.compute  # noqa: F401


class Collector(LoopThread):
    thread_name = "lowtide-gateway-collector"
    stop_grace = 10.0

    def __init__(self, gateway: Gateway):
        super().__init__()
        self.gw = gateway
        self.deliverer = Deliverer(gateway.store, gateway.config, gateway.clock, gateway.secret, count=gateway.metrics.webhook,
                                   public_url=gateway.public_url, finished=self.wake_deliveries)  # fmt: skip
        self.turnaround: dict[str, float] = {}
        self._deliver_wake: asyncio.Event | None = None
        self.passes = 0
        for api, target in (("openai", gateway.config.batch.openai), ("anthropic", gateway.config.batch.anthropic)):
            if target is not None:
                self.turnaround[api] = target.expected_turnaround
        self._refresh_turnaround()

    # Running -------------------------------------------------------------------------
    def wake(self) -> None:
        super().wake()
        self.wake_deliveries()

    def wake_deliveries(self) -> None:
        self._set(self._deliver_wake)

    async def _serve(self) -> None:
        self._deliver_wake = asyncio.Event()
        _warm_up()
        deliveries = asyncio.create_task(self._deliver_loop())
        try:
            async with Engine(self.gw.store, self.gw.clock, routes=self.gw.routes) as engine:
                while not self._stopping:
                    try:
                        busy = await self.step(engine)
                    except Exception:  # keep going; the next pass starts again from the store
                        log.exception("gateway: the collector's pass failed; retrying")
                        busy = False
                    self.passes += 1
                    if not (busy or self._stopping):
                        await self._idle(self._idle_seconds(engine))
        finally:
            deliveries.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deliveries
            await self.deliverer.aclose()

    def _idle_seconds(self, engine: Engine) -> float:
        due = engine.next_due()
        if due is None:
            return IDLE_MAX
        return max(0.005, min(IDLE_MAX, due - self.gw.clock.now()))

    async def _deliver_loop(self) -> None:
        """Start each due delivery as its own task (webhooks.py) and wait for the next one to
        be due, a slot to free up or a result to land; never for a receiver."""
        assert self._deliver_wake is not None
        while not self._stopping:
            try:
                started = self.deliverer.start_due()
                due = None if started else self.deliverer.next_due()
            except Exception:
                log.exception("gateway: a delivery pass failed; retrying")
                started, due = [], None
            if started:
                continue
            wait = IDLE_MAX if due is None else max(0.005, min(IDLE_MAX, due - self.gw.clock.now()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._deliver_wake.wait(), timeout=wait)
            self._deliver_wake.clear()

    # One pass ------------------------------------------------------------------------
    async def step(self, engine: Engine) -> bool:
        busy = self.flush()
        busy |= self.load()
        with self.gw.store.begin() as conn:
            running = records.flushes_in(conn, FlushState.RUNNING)
        for flush in running:
            if self._stopping:
                break
            report = await engine.tick(flush.job_name)
            busy |= report.busy
        busy |= self.collect(running)
        self._refresh_turnaround()
        return busy

    def flush(self) -> bool:
        """Create the flushes that are due (see the module doc). Requests that can wait no
        longer (a batch sent now could not end before their deadline − safety_margin) go
        first, in flushes of their own: a flush's job has its earliest deadline, so one
        short wait (`X-Lowtide-Defer: 0`) among requests that can wait hours would cut
        every one of them over to real time, or fail them all had it passed already."""
        cfg = self.gw.config.collector
        now = self.gw.clock.now()
        made = False
        with self.gw.store.begin() as conn:
            groups = records.waiting_groups(conn)
        for g in groups:
            target = self.gw.target(g.api)
            if target is not None and g.deadline <= self._last_send_by(g.api, target, now):
                made |= self._flush_group(g.api, g.model, now, due_by=self._last_send_by(g.api, target, now))
        if made:
            with self.gw.store.begin() as conn:
                groups = records.waiting_groups(conn)
        for g in groups:
            target = self.gw.target(g.api)
            if target is None:
                continue
            if g.n >= cfg.flush_size or g.oldest + cfg.flush_age <= now or g.deadline <= self._last_send_by(g.api, target, now):
                made |= self._flush_group(g.api, g.model, now)
        return made

    def _last_send_by(self, api: str, target: Any, now: float) -> float:
        """The latest deadline a batch sent now cannot meet: now + turnaround + margin."""
        return now + self.turnaround.get(api, target.expected_turnaround) + target.safety_margin

    def _flush_group(self, api: str, model: str, now: float, due_by: float | None = None) -> bool:
        """Flush the accepted requests of (api, model) (with `due_by`, those due by then)."""
        made = False
        while True:
            with self.gw.store.begin() as conn:
                flush = records.create_flush(conn, api, model, self.gw.config.collector.max_job_requests, now, due_by)
            if flush is None:
                return made
            made = True
            log.info("gateway: flush %s: %d deferred request(s) of %s %s", flush.job_name, flush.size, api, model)

    def load(self) -> bool:
        with self.gw.store.begin() as conn:
            loading = records.flushes_in(conn, FlushState.LOADING)
        for flush in loading:
            self._load(flush)
        return bool(loading)

    def _load(self, flush: Any) -> None:
        gw = self.gw
        folder = gw.data_dir / "flushes"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{flush.job_name}.jsonl"
        with gw.store.begin() as conn:
            rows = records.flush_rows(conn, flush.id)
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(flush_line(row.id, row.payload, flush.api, flush.model))
        tmp.replace(path)
        spec = self.job_spec(flush, path)
        try:
            load_job(gw.store, spec, gw.clock, where=f"gateway flush {flush.job_name}")
        except InputError as err:  # cannot happen for bodies checked at the door; fail them, do not loop
            log.error("gateway: flush %s could not be loaded: %s", flush.job_name, err)
            self._fail_flush(flush, str(err))
            return
        with gw.store.begin() as conn:
            records.move_flush(conn, flush.id, FlushState.LOADING, FlushState.RUNNING)

    def job_spec(self, flush: Any, path: Any) -> JobSpec:
        target = self.gw.target(flush.api)
        assert target is not None
        model = target.models.get(flush.model, flush.model) if target.models else flush.model
        fallback = self.gw.fallback_for(flush.api)
        fb = None
        if fallback is not None and fallback[0] != target.route:
            route, options, fb_model = fallback
            fb = FallbackSpec(route=route, route_options=options, model=fb_model or flush.model,
                              safety_margin=max(target.safety_margin, 0.001),
                              expected_turnaround=max(target.expected_turnaround, 0.001))  # fmt: skip
        return JobSpec(
            name=flush.job_name,
            source={"path": str(path), "id_column": "custom_id", "format": "jsonl"},
            template={"body_column": "body"},  # the bodies as they came: no params of its own
            endpoint=ENDPOINT[flush.api],
            model=model,
            route=target.route,
            route_options=target.route_options,
            retry={"max_attempts": target.max_attempts, "backoff_seconds": 5.0},
            deadline=datetime.fromtimestamp(self._deadline(flush), UTC) if fb is not None else None,
            fallback=fb,
            tags=["gateway"],
        )

    def _deadline(self, flush: Any) -> float:
        """The flush's deadline; one stored infinite (by a gateway before defer durations were
        bounded) is read as the longest wait allowed now, so it cannot stall every flush.
        Never less than a safety margin from now: a deadline that passed while the flush
        waited (`X-Lowtide-Defer: 0`, a busy collector) cuts its requests over to the
        fallback at once, where a passed one would fail them unsent."""
        deadline = flush.deadline_at if math.isfinite(flush.deadline_at) else flush.created_at + self.gw.config.max_defer
        target = self.gw.target(flush.api)
        margin = max(target.safety_margin, 0.001) if target is not None else 0.0
        return max(deadline, self.gw.clock.now() + margin)

    def _fail_flush(self, flush: Any, message: str) -> None:
        from lowtide.server.errors import ApiError

        now = self.gw.clock.now()
        body = dumps(ApiError(400, message).body(flush.api))
        with self.gw.store.begin() as conn:
            rows = list(conn.execute(select(gateway_requests.c.id, gateway_requests.c.tenant).where(
                gateway_requests.c.flush_id == flush.id, gateway_requests.c.state == DeferredState.QUEUED.value)))  # fmt: skip
            records.finish(conn, [{"gid": r.id, "target": "failed", "route": None, "result": body, "result_status": 400,
                                   "input_tokens": None, "output_tokens": None, "saved_picousd": None,
                                   "finished_at": now} for r in rows])  # fmt: skip
            records.move_flush(conn, flush.id, FlushState.LOADING, FlushState.DONE, done_at=now)
        for tenant, n in Counter(r.tenant for r in rows).items():
            self.gw.tenants.release_pending(tenant, n)

    def collect(self, running: list[Any]) -> bool:
        """Record the results that landed; returns whether any did."""
        any_done = False
        for flush in running:
            any_done |= self._collect(flush)
        if any_done:
            self.wake_deliveries()
        return any_done

    def _collect(self, flush: Any) -> bool:
        gw = self.gw
        g, r = gateway_requests.c, requests.c
        now = gw.clock.now()
        with gw.store.begin() as conn:
            job_id = conn.execute(select(jobs.c.id).where(jobs.c.name == flush.job_name)).scalar()
            if job_id is None:
                return False
            landed = list(
                conn.execute(
                    select(g.id.label("gid"), g.tenant, g.model.label("client_model"), g.accepted_at, g.callback_url,
                           r.state, r.output, payload_text().label("payload"), r.response, r.model, r.error_code, r.error_message, r.route, r.input_tokens,
                           r.cached_input_tokens, r.cache_write_tokens, r.output_tokens, r.reasoning_tokens)  # fmt: skip
                    .join(requests, (r.custom_id == g.id) & (r.job_id == job_id))
                    .where(g.flush_id == flush.id, g.state == DeferredState.QUEUED.value, r.state.in_(TERMINAL))
                )
            )
            results = [self._result(flush, row, now) for row in landed]
            records.finish(conn, results)
            # Not done while its job has a batch out (cut over at a deadline, or cancelled by
            # the operator): only a running flush's job is ticked, and that batch is polled
            # to its end, its partial results and bill brought in.
            done = not records.queued_left(conn, flush.id) and not batches_out(conn, job_id)
            if done:
                records.move_flush(conn, flush.id, FlushState.RUNNING, FlushState.DONE, done_at=now)
        for tenant, n in Counter(row.tenant for row in landed).items():
            gw.tenants.release_pending(tenant, n)
        for res in results:
            gw.metrics.finished(res["target"], res["saved_picousd"])
        return bool(landed)

    def _result(self, flush: Any, row: Any, now: float) -> dict[str, Any]:
        body, status = result_of(flush.api, row.gid, row.client_model, row, int(now))
        return {
            "gid": row.gid, "target": "succeeded" if row.state == "succeeded" else "failed", "route": row.route,
            "result": dumps(body), "result_status": status, "input_tokens": row.input_tokens,
            "output_tokens": row.output_tokens, "saved_picousd": self._saved(flush, row), "finished_at": now,
        }  # fmt: skip

    def _saved(self, flush: Any, row: Any) -> int | None:
        """What the request would have cost in real time on the upstream, less what it cost."""
        if row.state != "succeeded" or row.route is None:
            return None
        usage = Usage(row.input_tokens or 0, row.cached_input_tokens or 0, row.cache_write_tokens or 0,
                      row.output_tokens or 0, row.reasoning_tokens or 0)  # fmt: skip
        target = self.gw.target(flush.api)
        upstream = self.gw.upstream_config(flush.api)
        price_as = (upstream.price_as if upstream is not None else None) or flush.api
        realtime = attempt_cost(usage, row.client_model, price_as).usd
        if target is not None and row.route == target.route:
            ran = attempt_cost(usage, row.model or row.client_model, row.route, target.route_options).usd
        else:
            fallback = self.gw.fallback_for(flush.api)
            options = fallback[1] if fallback is not None else {}
            ran = attempt_cost(usage, row.client_model, row.route, options).usd
        if realtime is None or ran is None:
            return None
        return to_pico(realtime - ran)

    def _refresh_turnaround(self) -> None:
        for api in list(self.turnaround):
            target = self.gw.target(api)
            if target is None:
                continue
            if self.gw.route_kinds.get(api) == "direct":  # answers at once: no batch to wait for
                self.turnaround[api] = 0.0
                continue
            with self.gw.store.begin() as conn:
                self.turnaround[api] = expected_turnaround(conn, target.route, target.expected_turnaround)
