"""Two gateways on one store for a moment (a rolling restart: the new one is up before the old
one stops): a webhook being delivered by one is not delivered again by the other."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from lowtide.server.gateway import build_gateway_config
from lowtide.server.gateway.webhooks import Deliverer
from lowtide.store.db import Store
from lowtide.store.gateway_schema import gateway_requests

from .conftest import SECRET, base_config, running_gateway, serving, wait_until

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "call me back"}]}


class HoldingReceiver:
    """Fails the first POST (500), holds the second until `release`, answers others at once."""

    def __init__(self) -> None:
        self.deliveries: list[str] = []
        self.release = threading.Event()

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/hook")
        async def hook(request: Request) -> Any:
            await request.body()
            self.deliveries.append(request.headers["x-lowtide-attempt"])
            if len(self.deliveries) == 1:
                return JSONResponse({"error": "try later"}, status_code=500)
            if len(self.deliveries) == 2:
                await asyncio.to_thread(self.release.wait, 30)
            return {"ok": True}

        return app


def two_gateways(tmp_path, upstream, clock, then: Callable[[asyncio.Task, Deliverer, threading.Event], Awaitable[int]]) -> tuple[int, list[str]]:
    """A deferred call whose first webhook attempt failed; its retry is due and the old
    gateway's POST of it is held at the receiver. `then(old's pass, new, release)` runs at that moment;
    returns what it returned and the attempts the receiver saw."""
    rec = HoldingReceiver()
    with serving(rec.app()) as hook_url:
        config = base_config(tmp_path, upstream, webhooks={"backoff": 10, "max_backoff": 10})
        with running_gateway(tmp_path, config, clock=clock) as g, g.client() as c:
            r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": f"{hook_url}/hook"})
            gid = r.json()["id"]
            wait_until(lambda: g.status(gid).json()["delivery"]["attempts"] == 1, what="the first (failed) attempt recorded")
        clock.advance(60)  # the retry is due; two gateways' deliverers now find it
        cfg = build_gateway_config(config)
        old, new = Store(str(tmp_path / "lowtide.db")), Store(str(tmp_path / "lowtide.db"))

        async def run() -> int:
            a, b = Deliverer(old, cfg, clock, SECRET.encode()), Deliverer(new, cfg, clock, SECRET.encode())
            try:
                first = asyncio.create_task(a.run_due())
                for _ in range(2000):  # until the old gateway's POST is at the receiver, held
                    if len(rec.deliveries) == 2 or first.done():
                        break
                    await asyncio.sleep(0.01)
                assert len(rec.deliveries) == 2, "the old gateway's retry never reached the receiver"
                return await then(first, b, rec.release)
            finally:
                rec.release.set()
                await a.aclose()
                await b.aclose()

        try:
            result = asyncio.run(run())
        finally:
            old.close()
            new.close()
    return result, rec.deliveries


def test_a_delivery_in_flight_on_one_gateway_is_not_sent_again_by_another(tmp_path, upstream, clock):
    async def second_pass(first: asyncio.Task, new: Deliverer, release: threading.Event) -> int:
        attempted = await new.run_due()
        release.set()
        assert await first == 1
        return attempted

    attempted, deliveries = two_gateways(tmp_path, upstream, clock, second_pass)
    assert attempted == 0
    assert deliveries == ["1", "2"]  # the retry went out once


def test_a_gateway_stopping_mid_delivery_hands_it_back_at_once(tmp_path, upstream, clock):
    async def stop_then_take_over(first: asyncio.Task, new: Deliverer, release: threading.Event) -> int:
        first.cancel()  # the old gateway stops with its POST unanswered
        with contextlib.suppress(asyncio.CancelledError):
            await first
        return await new.run_due()  # same clock: due again now, not after the claim runs out

    attempted, deliveries = two_gateways(tmp_path, upstream, clock, stop_then_take_over)
    assert attempted == 1
    assert deliveries == ["1", "2", "2"]  # the unanswered attempt is sent again by the new one


def test_a_late_2xx_on_a_stalled_gateway_records_nothing_once_another_took_the_delivery_over(tmp_path, upstream, clock):
    """The old gateway stalls past its attempt's claim; the new one takes the delivery over and
    delivers it. The old attempt's 2xx, coming after, is not recorded: the outcome is the new
    attempt's (the receiver has the retry twice, as at least once allows)."""

    async def stall_then_take_over(first: asyncio.Task, new: Deliverer, release: threading.Event) -> int:
        clock.advance(3600)  # far past the old attempt's claim (timeout + 60 s)
        attempted = await new.run_due()  # answered at once: delivered
        release.set()
        await first  # the old attempt's 2xx comes now
        return attempted

    attempted, deliveries = two_gateways(tmp_path, upstream, clock, stall_then_take_over)
    assert attempted == 1 and deliveries == ["1", "2", "2"]
    store = Store(str(tmp_path / "lowtide.db"))
    try:
        with store.read() as conn:
            [row] = conn.execute(sa.select(gateway_requests.c.delivery, gateway_requests.c.delivery_attempts)).all()
    finally:
        store.close()
    assert tuple(row) == ("delivered", 2)  # the new gateway's attempt; the old one's is not counted
