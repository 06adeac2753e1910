"""A provider's batch file limit is in bytes (OpenAI: 200 MB), and the plan counts bytes: text
outside ASCII takes two to four bytes a character in the UTF-8 file. Counted in characters, a
chunk of Japanese prompts planned at the limit made a file three times over it, which the
provider refuses whole."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from lowtide.core.clock import ManualClock
from lowtide.engine import batches
from lowtide.engine.dispatch import iter_dispatched
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.routes.openai.batch import jsonl_file, request_line
from lowtide.store.schema import dispatches
from tests.conftest import make_spec, write_csv

MAX_BYTES = 16 * 1024
TEXTS = {
    "ascii": "The parcel arrived damaged and the box was open. " * 20,
    "japanese": "荷物が破損した状態で届き、箱が開いていました。" * 40,
    "emoji": "📦💥🙁 " * 200,
}


@pytest.mark.parametrize("text", list(TEXTS))
def test_every_planned_batch_file_is_within_the_routes_byte_limit(store, tmp_path, monkeypatch, text):
    monkeypatch.setenv("OPENAI_API_KEY", "k")  # nothing is sent: the plan and the file only
    rows = [{"ticket_id": f"T{1000 + i}", "body": f"{i} {TEXTS[text]}"} for i in range(40)]
    spec = make_spec(write_csv(tmp_path / "t.csv", rows), route="openai-batch",
                     route_options={"base_url": "http://127.0.0.1:9/v1", "max_bytes": MAX_BYTES})  # fmt: skip
    load_job(store, spec, ManualClock())

    async def plan_all() -> None:
        async with Engine(store, ManualClock()) as engine:
            job = engine._jobs("tickets")[0]
            route = engine.route_for(job.lanes[0])
            assert route.limits.max_bytes == MAX_BYTES
            while batches.plan(store, job, route, engine.clock):
                with store.begin() as conn:  # as if sent: the next plan takes the next chunks
                    conn.execute(sa.update(dispatches).where(dispatches.c.state == "planned").values(state="submitted"))

    asyncio.run(plan_all())
    with store.begin() as conn:
        planned = conn.execute(sa.select(dispatches.c.id)).scalars().all()
    sizes = []
    for dispatch_id in planned:
        with jsonl_file("openai-batch", iter_dispatched(store, dispatch_id), request_line, "batch file") as (f, _, _):
            sizes.append(len(f.read()))
    assert sum(1 for _ in planned) > 1
    assert max(sizes) <= MAX_BYTES, sizes  # before: Japanese 2.5x, emoji 3.4x over
    assert max(sizes) > MAX_BYTES // 2  # and the batches are not cut needlessly small
