"""`lowtide delete` and `lowtide prune` at the engine: engine/retention.py, on both backends.

Delete removes exactly one job's rows, from every table that holds them, and refuses while
its batches are in flight; prune drops bodies and keeps the ledger (`lowtide report`)."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from lowtide.core.errors import JobNotFoundError
from lowtide.engine.control import cancel_job, job_status
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.engine.retention import JOB_TABLES, PRUNED, InFlightError, delete_job, in_flight, prune
from lowtide.engine.tick import Engine
from lowtide.store.schema import (
    dispatch_phases,
    dispatches,
    events,
    jobs,
    request_versions,
    requests,
)
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

DAY = 86400.0


def _spec(tmp_path, name, n=5, **extra):
    rows = tmp_path / f"{name}.csv"
    write_csv(rows, ticket_rows(n))
    options = {"dir": str(tmp_path / "echo-batch"), **extra}
    return make_spec(rows, name=name, route="echo-batch", route_options=options)


def _rows(store, name) -> dict[str, int]:
    """Rows per table that belong to the job `name` (0 everywhere once it is gone)."""
    with store.begin() as conn:
        job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == name)).scalar()
        if job_id is None:
            return dict.fromkeys(JOB_TABLES, 0)
        counts = {}
        for table in JOB_TABLES:
            t = sa.table(table, sa.column("job_id"), sa.column("id"), sa.column("dispatch_id"))
            if table == "jobs":
                where = t.c.id == job_id
            elif table == "dispatch_phases":
                where = t.c.dispatch_id.in_(sa.select(dispatches.c.id).where(dispatches.c.job_id == job_id))
            else:
                where = t.c.job_id == job_id
            counts[table] = conn.execute(sa.select(sa.func.count()).select_from(t).where(where)).scalar_one()
        return counts


def _with_a_version(store, tmp_path, clock, name):
    """A finished echo-batch job, one of whose rows changed and was answered again: rows in
    every table a job has (dispatch phases from polls, an earlier version)."""
    spec = _spec(tmp_path, name)
    drive_to_end(store, spec, clock)
    rows = ticket_rows(5)
    rows[0]["body"] = "changed"
    write_csv(tmp_path / f"{name}.csv", rows)
    load_job(store, spec, clock, requeue_changed=True)
    return drive_to_end(store, spec, clock)


def test_delete_removes_every_row_of_the_job_and_nothing_of_another(store, tmp_path, clock):
    _with_a_version(store, tmp_path, clock, "junk")
    _with_a_version(store, tmp_path, clock, "keep")
    junk, keep = _rows(store, "junk"), _rows(store, "keep")
    for table in ("requests", "request_versions", "dispatches", "dispatch_phases", "attempts", "events", "jobs"):
        assert junk[table] > 0, table  # the test covers each of them
    with store.begin() as conn:
        global_events = conn.execute(sa.select(sa.func.count()).select_from(events).where(events.c.job_id.is_(None))).scalar_one()

    deleted = delete_job(store, "junk", clock)

    assert {t: deleted[t] for t in JOB_TABLES} == junk
    assert _rows(store, "junk") == dict.fromkeys(JOB_TABLES, 0)
    assert _rows(store, "keep") == keep
    assert job_status(store, "keep").counts == {"succeeded": 5}
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == keep["requests"]
        assert conn.execute(sa.select(sa.func.count()).select_from(request_versions)).scalar_one() == keep["request_versions"]
        assert conn.execute(sa.select(sa.func.count()).select_from(dispatch_phases)).scalar_one() == keep["dispatch_phases"]
        said = conn.execute(sa.select(events.c.message).where(events.c.job_id.is_(None), events.c.kind == "deleted")).scalars().all()
        n_global = conn.execute(sa.select(sa.func.count()).select_from(events).where(events.c.job_id.is_(None))).scalar_one()
    assert n_global == global_events + 1 and said and '"junk"' in said[0]
    with pytest.raises(JobNotFoundError):
        delete_job(store, "junk", clock)


def _in_flight_job(store, tmp_path, clock, name="flying"):
    """An echo-batch job whose batch is submitted and not due for a poll (the clock is held)."""
    spec = _spec(tmp_path, name, polls_to_complete=1000)
    load_job(store, spec, clock)

    async def one_tick():
        async with Engine(store, clock, seed=7) as engine:
            return await engine.tick(name)

    assert asyncio.run(one_tick()).submitted == 1
    return spec


def test_delete_refuses_a_job_with_batches_in_flight(store, tmp_path, clock):
    _in_flight_job(store, tmp_path, clock)
    before = _rows(store, "flying")
    flying = in_flight(store, "flying")
    assert [f.state for f in flying] == ["submitted"]

    with pytest.raises(InFlightError) as err:
        delete_job(store, "flying", clock)

    assert "in flight" in str(err.value) and "--cancel" in str(err.value) and "echo-batch" in str(err.value)
    assert _rows(store, "flying") == before


def test_after_a_cancel_the_job_is_deleted_once_its_batches_have_ended(store, tmp_path, clock):
    spec = _in_flight_job(store, tmp_path, clock)
    other = _spec(tmp_path, "other")
    drive_to_end(store, other, clock)
    keep = _rows(store, "other")

    cancel_job(store, "flying", clock)  # the existing cancel path: the batch is asked to stop
    assert in_flight(store, "flying")  # still out until a tick cancels and collects it
    with pytest.raises(InFlightError):
        delete_job(store, "flying", clock)

    clock.advance(3600)
    status = drive_to_end(store, spec, clock)  # ticks: the provider's cancel lands
    assert status.state == "cancelled" and not in_flight(store, "flying")
    assert delete_job(store, "flying", clock)["requests"] == 5
    assert _rows(store, "flying") == dict.fromkeys(JOB_TABLES, 0)
    assert _rows(store, "other") == keep


def test_prune_drops_bodies_of_old_finished_jobs_and_keeps_the_report(store, tmp_path, clock):
    _with_a_version(store, tmp_path, clock, "old")
    clock.advance(40 * DAY)
    _spec_new = _spec(tmp_path, "new")
    drive_to_end(store, _spec_new, clock)
    report_before = cost_report(store).as_dict()
    status_before = job_status(store, "old").counts
    rows_before = _rows(store, "old")
    new_before = _bodies(store, "new")

    preview = prune(store, clock, 30 * DAY, dry_run=True)
    assert preview.jobs == ["old"] and preview.bytes > 0
    assert _bodies(store, "old")[0][0] != PRUNED  # a dry run changes nothing

    done = prune(store, clock, 30 * DAY)

    assert done.jobs == ["old"] and done.requests == 5 and done.versions == 1 and done.bytes == preview.bytes
    assert cost_report(store).as_dict() == report_before
    assert job_status(store, "old").counts == status_before
    assert {t: n for t, n in _rows(store, "old").items() if t != "events"} == {t: n for t, n in rows_before.items() if t != "events"}
    assert all(row == (PRUNED, None, None, None) for row in _bodies(store, "old"))
    assert _bodies(store, "new") == new_before  # finished 0 days ago: kept
    with store.begin() as conn:
        assert conn.execute(sa.select(request_versions.c.payload, request_versions.c.output)).all() == [(PRUNED, None)]
    assert prune(store, clock, 30 * DAY).jobs == []  # nothing left to drop


def test_prune_keep_results_keeps_the_answers(store, tmp_path, clock):
    drive_to_end(store, _spec(tmp_path, "old"), clock)
    answers = [row[2] for row in _bodies(store, "old")]
    assert all(answers)
    clock.advance(2 * DAY)
    assert prune(store, clock, DAY, keep_results=True).jobs == ["old"]
    bodies = _bodies(store, "old")
    assert [row[2] for row in bodies] == answers
    assert all(payload == PRUNED and response is None for payload, response, _, _ in bodies)


def test_results_after_a_keep_results_prune_keep_their_answer_columns(store, tmp_path, clock):
    """`prune --keep-results` drops the raw responses and keeps the answers: a plain answer's
    columns are read from what ingest kept beside the response, which the export read only
    while the response was there, so `finish_reason` came out empty (and a SQL table's
    copy of it was overwritten with NULL)."""
    from lowtide.engine.export import export_results

    drive_to_end(store, _spec(tmp_path, "old"), clock)
    before = export_results(store, "old", tmp_path / "before.jsonl")
    clock.advance(2 * DAY)
    prune(store, clock, DAY, keep_results=True)
    after = export_results(store, "old", tmp_path / "after.jsonl")
    read = lambda p: [{k: r[k] for k in ("custom_id", "state", "output", "finish_reason")} for r in map(json.loads, p.read_text().splitlines())]  # noqa: E731
    assert after.states == before.states == {"succeeded": 5}
    assert read(tmp_path / "after.jsonl") == read(tmp_path / "before.jsonl")
    assert {r["finish_reason"] for r in read(tmp_path / "after.jsonl")} == {"stop"}


def test_prune_rewrites_each_request_row_once(store, tmp_path, clock):
    """PostgreSQL keeps the old version of each row an UPDATE rewrites until VACUUM: a prune
    that rewrote the job's rows twice (bodies, then payloads) needed room for two more copies
    of them, and at 10,000,000 requests filled the disk (issue 32)."""
    drive_to_end(store, _spec(tmp_path, "old"), clock)
    clock.advance(2 * DAY)
    rewritten = []

    def on_update(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE REQUESTS "):
            rewritten.append(cursor.rowcount)

    sa.event.listen(store.engine, "after_cursor_execute", on_update)
    try:
        done = prune(store, clock, DAY)
    finally:
        sa.event.remove(store.engine, "after_cursor_execute", on_update)
    assert done.requests == 5
    assert rewritten == [5]  # before: [5, 5], every row rewritten a second time for its payload
    assert all(row == (PRUNED, None, None, None) for row in _bodies(store, "old"))


def test_prune_waits_for_live_batches_and_keeps_what_retry_would_send(store, tmp_path, clock):
    spec = _in_flight_job(store, tmp_path, clock)
    cancel_job(store, "flying", clock)  # cancelled, but its batch is still out
    clock.advance(40 * DAY)
    assert prune(store, clock, 30 * DAY).jobs == []
    drive_to_end(store, spec, clock)  # the provider's cancel lands: the batch has ended
    payloads = [row[0] for row in _bodies(store, "flying")]
    clock.advance(40 * DAY)
    prune(store, clock, 30 * DAY)
    assert job_status(store, "flying").counts == {"cancelled": 5}
    assert [row[0] for row in _bodies(store, "flying")] == payloads  # `lowtide retry --cancelled` sends these


def _bodies(store, name):
    with store.begin() as conn:
        job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == name)).scalar_one()
        r = requests.c
        return conn.execute(
            sa.select(r.payload, r.response, r.output, r.parsed).where(r.job_id == job_id).order_by(r.id)
        ).all()


def test_delete_removes_the_repair_sends_of_the_job(store, tmp_path, clock, monkeypatch):
    from tests.engine.answers import answer_all, chat, choice, loaded_job

    schema = {"type": "object", "properties": {"label": {"enum": ["billing"]}}, "required": ["label"]}
    good, bad = '{"label": "billing"}', '{"label": "sales"}'
    drive_to_end(store, _spec(tmp_path, "keep"), clock)
    keep = _rows(store, "keep")
    job = loaded_job(store, clock, tmp_path, monkeypatch, ["ok", "mended"], response_schema=schema)
    answer_all(store, job, {"ok": chat(choice(0, good)), "mended": chat(choice(0, bad))})
    answer_all(store, job, {"mended": chat(choice(0, good))})  # the repair attempt
    with store.begin() as conn:  # the helper ingests without ending its batches: end them, as a poll would
        conn.execute(sa.update(dispatches).where(dispatches.c.job_id == job.id).values(state="ended"))
    before = _rows(store, "tickets")
    assert before["repair_sends"] == 1 and before["attempts"] == 3

    deleted = delete_job(store, "tickets", clock)
    assert {t: deleted[t] for t in JOB_TABLES} == before
    assert _rows(store, "tickets") == dict.fromkeys(JOB_TABLES, 0)
    assert _rows(store, "keep") == keep


def test_a_results_file_marks_the_rows_whose_answers_were_pruned(store, tmp_path, clock):
    """After a prune a pruned row is exported with state `pruned` (its answer columns empty),
    never as a `succeeded` row with a null answer; a row answered since is `succeeded`."""
    import csv

    from lowtide.engine.export import export_results

    spec = _spec(tmp_path, "old")
    drive_to_end(store, spec, clock)
    clock.advance(2 * DAY)
    prune(store, clock, DAY)
    write_csv(tmp_path / "old.csv", ticket_rows(6))  # a new row, answered after the prune
    drive_to_end(store, spec, clock)

    report = export_results(store, "old", tmp_path / "results.csv")

    assert report.states == {"pruned": 5, "succeeded": 1}
    with (tmp_path / "results.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["state"], r["output"]) for r in rows[:5]] == [("pruned", "")] * 5
    assert rows[5]["state"] == "succeeded" and rows[5]["output"]
