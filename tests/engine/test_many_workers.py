"""Four `lowtide worker` processes share jobs on one PostgreSQL store; one is SIGKILLed mid-run.
Every row ends with exactly one applied answer, and no chunk reaches the provider twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from lowtide.store.schema import attempts, requests
from tests.conftest import fresh_pg_schema, make_spec, ticket_rows, write_csv

LOWTIDE = str(Path(sys.executable).with_name("lowtide"))

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def pg_url(pg_schema_url) -> Iterator[str]:
    """A schema of its own: these workers must see no other test's jobs."""
    with fresh_pg_schema("lowtide_workers") as url:
        yield url


def _workers(url: str, n: int) -> list[subprocess.Popen]:
    env = {**os.environ, "LOWTIDE_DB": url}
    return [
        subprocess.Popen([LOWTIDE, "worker", "--until-idle"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(n)
    ]


def _done_count(store: Store) -> int:
    with store.begin() as conn:
        return conn.execute(
            sa.select(sa.func.count()).select_from(requests).where(requests.c.state == "succeeded")
        ).scalar_one()


def test_four_workers_one_killed_every_row_once_no_chunk_twice(pg_url, tmp_path):
    store = Store(pg_url)
    provider = tmp_path / "provider"
    direct = make_spec(
        write_csv(tmp_path / "a.csv", ticket_rows(3000)), name="direct", route_options={"dispatch_size": 50}
    )
    batched = make_spec(
        write_csv(tmp_path / "b.csv", ticket_rows(2000)), name="batched", route="echo-batch", chunk_size=50,
        route_options={"dir": str(provider), "polls_to_complete": 2},
    )  # fmt: skip
    for spec in (direct, batched):
        load_job(store, spec, SystemClock())

    procs = _workers(pg_url, 4)
    deadline = time.monotonic() + 120  # a safety net, not a timing
    while _done_count(store) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()  # reaped, as its supervisor would: a zombie's pid still looks alive
    for proc in procs[1:]:
        proc.wait(300)
        assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
    last = _workers(pg_url, 1)[0]  # whatever the killed one left, nobody else waiting
    last.wait(300)
    assert last.returncode == 0, last.stderr.read().decode()[-2000:]

    with store.begin() as conn:
        states = Counter(conn.execute(sa.select(requests.c.state)).scalars())
        applied = Counter(
            conn.execute(sa.select(attempts.c.request_id).where(attempts.c.applied, attempts.c.ok)).scalars()
        )
    store.close()
    assert states == {"succeeded": 5000}
    assert len(applied) == 5000 and set(applied.values()) == {1}
    keys = Counter(json.loads(meta.read_text())["key"] for meta in provider.glob("*/meta.json"))
    assert keys and set(keys.values()) == {1}, [k for k, n in keys.items() if n > 1]
