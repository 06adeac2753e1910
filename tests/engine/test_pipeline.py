"""The pipeline end to end on the echo routes, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import random

import sqlalchemy as sa

from lowtide.core.states import JobState
from lowtide.engine.control import job_status
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.schema import attempts, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv


def _attempt_count(store) -> int:
    with store.begin() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one()


def test_job_runs_to_completion_and_results_join_by_custom_id(store, clock, tmp_path):
    rows = ticket_rows(40)
    source = write_csv(tmp_path / "t.csv", rows)
    spec = make_spec(source)
    status = drive_to_end(store, spec, clock)
    assert status.state == JobState.FINISHED
    assert status.counts == {"succeeded": 40}

    # Reorder the source after the run: the join must follow custom_id, not position.
    random.Random(3).shuffle(rows)
    write_csv(source, rows)
    report = export_results(store, "tickets", tmp_path / "out.csv")
    assert report.rows == 40
    with (tmp_path / "out.csv").open() as f:
        out = list(csv.DictReader(f))
    for row in out:
        assert row["state"] == "succeeded"
        assert row["output"] == f"Ticket: {row['body']}"  # echo answers with the user message
        assert row["custom_id"] == row["ticket_id"]


def test_running_the_same_job_twice_adds_and_reruns_nothing(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(30))
    spec = make_spec(source)
    drive_to_end(store, spec, clock)
    before = _attempt_count(store)

    report = load_job(store, spec, clock)
    assert (report.rows, report.new) == (30, 0)
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 30}
    assert _attempt_count(store) == before == 30


def test_adding_rows_processes_only_the_new_ones(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(30))
    spec = make_spec(source)
    drive_to_end(store, spec, clock)

    write_csv(source, ticket_rows(30) + ticket_rows(10, start=5000))
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 40}
    assert _attempt_count(store) == 40
    with store.begin() as conn:
        new = conn.execute(sa.select(requests.c.custom_id).where(requests.c.custom_id.like("T50%"))).scalars().all()
    assert len(new) == 10


def test_batch_route_plans_chunks_and_ingests_results_out_of_order(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(25))
    spec = make_spec(
        source,
        route="echo-batch",
        route_options={"dir": str(tmp_path / "provider"), "polls_to_complete": 2, "max_requests": 10},
    )
    status = drive_to_end(store, spec, clock)
    assert status.counts == {"succeeded": 25}
    batches = list((tmp_path / "provider").glob("*/meta.json"))
    assert len(batches) == 3  # 10 + 10 + 5
    export_results(store, "tickets", tmp_path / "out.jsonl")
    import json

    for line in (tmp_path / "out.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["output"] == f"Ticket: {row['body']}"


def test_results_export_to_parquet_and_jsonl(store, clock, tmp_path):
    import pyarrow.parquet as pq

    source = write_csv(tmp_path / "t.csv", ticket_rows(12))
    drive_to_end(store, make_spec(source), clock)
    export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.num_rows == 12
    assert {"ticket_id", "body", "output", "state", "error", "input_tokens"} <= set(table.column_names)
    assert table.column("input_tokens").type.bit_width == 64


def test_status_reports_counts(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(5))
    spec = make_spec(source)
    load_job(store, spec, clock)
    assert job_status(store, "tickets").counts == {"pending": 5}


def test_batches_default_to_10000_requests_and_a_tick_sends_two(store, clock, tmp_path):
    """The first tick plans only the two chunks it sends (the provider starts at once); the
    next plans up to ten and sends two; what is planned and not sent waits."""
    import asyncio

    from lowtide.engine.tick import Engine
    from lowtide.store.schema import dispatches

    source = write_csv(tmp_path / "t.csv", ticket_rows(45_000))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(tmp_path / "provider"), "max_requests": 50_000})
    load_job(store, spec, clock)

    async def ticks():
        async with Engine(store, clock) as engine:
            return [await engine.tick("tickets"), await engine.tick("tickets")]

    def sent() -> list[tuple[int, bool]]:
        with store.begin() as conn:
            rows = conn.execute(sa.select(dispatches.c.size, dispatches.c.provider_id).order_by(dispatches.c.id)).all()
        return [(size, provider is not None) for size, provider in rows]

    first, second = asyncio.run(ticks())
    assert (first.planned, first.submitted) == (20_000, 2)
    assert (second.planned, second.submitted) == (25_000, 2)
    assert sent() == [(10_000, True)] * 4 + [(5_000, False)]  # the fifth waits for the next tick
