"""An ended batch's poll lease is renewed while its results download and are ingested: a long
download (800 MB of embeddings on a slow link) outlives POLL_LEASE, and without renewal a
second worker takes the batch over and downloads and ingests it all again beside the first.
`openai-batch` (the SDK at its defaults but the base URL) against `lowtide serve`, whose
fault plan holds the results download; the engine runs on a ManualClock, moved past the
lease while the download is held."""

from __future__ import annotations

import asyncio
import time

import openai
import sqlalchemy as sa
import yaml

from lowtide.core.states import DispatchState
from lowtide.engine.batches import POLL_LEASE
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.schema import dispatches
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import _options, serve  # noqa: F401

HELD = 8  # real seconds serve holds the results download (its stop waits for it, so no longer)


async def _until(check, what: str, timeout: float = 60.0) -> None:
    """Await until `check()` is truthy (bounded: a safety net, not a timing)."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_an_ended_batchs_lease_is_renewed_while_its_results_download(serve, store, clock, tmp_path):  # noqa: F811
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"http": [{"match": "GET /v1/files/*/content", "delay": HELD}]}))
    url = serve("--faults", str(plan))
    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(5)), route="openai-batch",
                              route_options=_options("openai-batch", url)), clock)  # fmt: skip
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="test-key")

    def lease() -> tuple[str, float | None]:
        with store.begin() as conn:
            return conn.execute(sa.select(dispatches.c.state, dispatches.c.lease_until)).one()

    async def go() -> None:
        async with Engine(store, clock) as engine:
            await engine.tick("tickets")  # planned and sent

            async def ended() -> bool:
                return (await client.batches.list(limit=1)).data[0].status == "completed"

            await _until(ended, "serve to finish the batch")
            clock.advance(3600)  # past its next poll
            tick = asyncio.create_task(engine.tick("tickets"))  # the poll finds it ended; its download is held

            async def ingesting() -> bool:  # held from the poll on, for the download and ingest
                return lease() == (DispatchState.SUBMITTED.value, clock.now() + POLL_LEASE)

            await _until(ingesting, "the poll to find the batch ended")
            clock.advance(POLL_LEASE * 2 / 3)  # past a renewal's due time

            async def renewed() -> bool:
                return lease()[1] == clock.now() + POLL_LEASE

            await _until(renewed, "the lease to be renewed", timeout=HELD - 2)
            clock.advance(POLL_LEASE * 2 / 3)  # past the lease first taken: renewed again, never run out
            await _until(renewed, "the lease to be renewed again", timeout=HELD - 2)
            report = await tick
            assert report.ingested.succeeded == 5

    asyncio.run(go())
    assert lease()[0] == DispatchState.ENDED.value
