"""A worker stopped (Ctrl-C, SIGTERM: its task cancelled) while a direct dispatch runs keeps
the answers it already has: they are paid for, and dropping them would have the requests
sent, and billed, again once their lease ran out. `openai` (the SDK at its defaults but
the base URL) against `lowtide serve`, whose fault plan holds the calls after the fifth."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import sqlalchemy as sa
import yaml

from lowtide.core.clock import SystemClock
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.schema import requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, serve  # noqa: F401

ANSWERED = 5


class _Answers(logging.Handler):
    """Counts the chat answers the openai SDK received (its client logs each response at
    DEBUG); sets `enough` on the loop once there are ANSWERED."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__(logging.DEBUG)
        self.loop, self.n, self.enough = loop, 0, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "HTTP Response: %s %i" and record.args[1] == 200:  # (every POST here is a chat call)
            self.n += 1
            if self.n == ANSWERED:
                self.loop.call_soon_threadsafe(self.enough.set)


def test_a_stopped_worker_keeps_the_direct_answers_it_received(serve, tmp_path):  # noqa: F811
    # Every call after the fifth waits 10 s (the worker is stopped meanwhile; serve's own stop
    # waits for them, so no longer).
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "POST /v1/chat/completions", "calls": list(range(ANSWERED + 1, 41)), "delay": 10}]}))
    url = serve("--faults", str(plan))
    source = write_csv(tmp_path / "t.csv", ticket_rows(40))
    options = {"base_url": f"{url}/v1", "api_key_env": KEY_ENV}
    store = Store(str(tmp_path / "client.db"))
    load_job(store, make_spec(source, route="openai", route_options=options), SystemClock())
    sdk_log = logging.getLogger("openai._base_client")

    async def stopped_after_answers() -> int:
        answers = _Answers(asyncio.get_running_loop())
        level = sdk_log.level
        sdk_log.addHandler(answers)
        sdk_log.setLevel(logging.DEBUG)
        try:
            async with Engine(store) as engine:
                work = asyncio.create_task(drive(engine, "tickets"))
                done, _ = await asyncio.wait([work, asyncio.create_task(answers.enough.wait())], timeout=120,
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip  (a safety net)
                assert work not in done and answers.enough.is_set(), f"{answers.n} answers before the run ended"
                work.cancel()  # what a Ctrl-C or SIGTERM does to the running command (asyncio.run)
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        finally:
            sdk_log.removeHandler(answers)
            sdk_log.setLevel(level)
        return answers.n

    received = asyncio.run(stopped_after_answers())
    with store.begin() as conn:
        states = dict(conn.execute(sa.select(requests.c.state, sa.func.count()).group_by(requests.c.state)).all())
    assert received >= ANSWERED and states.get("succeeded") == received, (received, states)  # each answer received, kept
