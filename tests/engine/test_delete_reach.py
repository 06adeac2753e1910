"""`lowtide delete` reaches every row that names the job, in every table the store has.

The tables are not listed by hand: `naming_rows` walks the SQLAlchemy metadata (the core,
serve and gateway tables alike) and finds, for each table, the rows that name the job: by
its id, its name, one of its dispatches or requests, or (evals) by deriving it. A column
that looks as if it names a job and that it does not know how to read fails the test, so a
table that gains a job column later is caught without anyone remembering to add it here.
"""

from __future__ import annotations

import json

import orjson
import pytest
import sqlalchemy as sa

from lowtide.core.evals import build_eval
from lowtide.engine.compare import compare
from lowtide.engine.retention import LIVE_SERVE_STATUSES, InFlightError, delete_job
from lowtide.store.gateway_schema import gateway_flushes, gateway_requests
from lowtide.store.schema import dispatches, evals, jobs, metadata, requests, serve_batches
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv
from tests.engine.test_delete_prune import _with_a_version

# Columns whose name says "job" or that point at a job's dispatch or request, and how each
# names one. Anything else with "job" in its name, or a foreign key to these tables, fails.
BY_JOB_ID, BY_NAME, BY_NAME_LIST, BY_DISPATCH, BY_REQUEST = "job id", "job name", "JSON list of job names", "dispatch", "request"
KNOWN = {
    "job_id": BY_JOB_ID,
    "job_name": BY_NAME,
    "dispatch_id": BY_DISPATCH,
    "request_id": BY_REQUEST,
}
SPECIAL = {("serve_batches", "jobs"): BY_NAME_LIST}
# Tables whose rows name jobs only by deriving them (an eval names its members EVAL.VARIANT).
DERIVED = {"evals"}


def _how(table: sa.Table, column: sa.Column) -> str | None:
    if (table.name, column.name) in SPECIAL:
        return SPECIAL[(table.name, column.name)]
    if table.name == "jobs" and column.name in ("id", "name"):
        return BY_JOB_ID if column.name == "id" else BY_NAME
    for fk in column.foreign_keys:
        target = fk.column.table.name
        if target in ("jobs", "dispatches", "requests"):
            return {"jobs": BY_JOB_ID, "dispatches": BY_DISPATCH, "requests": BY_REQUEST}[target]
    if column.name in KNOWN:
        return KNOWN[column.name]
    if "job" in column.name.lower():
        pytest.fail(f"{table.name}.{column.name} looks as if it names a job: teach this test (and delete_job) how it does")
    return None


def naming_rows(conn, name: str, job_id: int, dispatch_ids: set[int], request_ids: set[int]) -> dict[str, int]:
    """Rows per table that name the job (its id, name, dispatches or requests), every table."""
    found: dict[str, int] = {}
    for table in metadata.sorted_tables:
        n = 0
        if table.name in DERIVED:
            for data in conn.execute(sa.select(evals.c.spec)).scalars():
                ev = build_eval(orjson.loads(data))
                n += name in {m.spec.name for m in ev.members} | {ev.judge_name}
        for column in table.columns:
            how = _how(table, column)
            if how is None:
                continue
            if how == BY_NAME_LIST:
                lists = conn.execute(sa.select(column).where(column.contains(name))).scalars()
                n += sum(any(j["name"] == name for j in json.loads(v)) for v in lists)
                continue
            where = {
                BY_JOB_ID: column == job_id,
                BY_NAME: column == name,
                BY_DISPATCH: column.in_(dispatch_ids or {-1}),
                BY_REQUEST: column.in_(request_ids or {-1}),
            }[how]
            n += conn.execute(sa.select(sa.func.count()).select_from(table).where(where)).scalar_one()
        found[table.name] = n
    return found


def _ids(conn, name):
    job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == name)).scalar_one()
    d = set(conn.execute(sa.select(dispatches.c.id).where(dispatches.c.job_id == job_id)).scalars())
    r = set(conn.execute(sa.select(requests.c.id).where(requests.c.job_id == job_id)).scalars())
    return job_id, d, r


def _eval_data(tmp_path, name, variants):
    source = write_csv(tmp_path / f"{name}.csv", ticket_rows(3))
    return {
        "name": name,
        "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Sort the ticket.", "user": "{{ body }}"},
        "choices": ["billing", "technical", "account", "shipping", "feedback"],
        "variants": {"models": [{"name": v, "model": "echo-model", "route": "echo"} for v in variants]},
        "scoring": {"method": "choice", "expected": "gold"},
        "base_dir": str(tmp_path),
    }


def _save_eval(conn, data, now):
    conn.execute(evals.insert().values(name=data["name"], spec=json.dumps(data), created_at=now, updated_at=now))


def _serve_batch(conn, batch_id, status, names, now):
    conn.execute(
        serve_batches.insert().values(
            id=batch_id, api="openai", status=status, jobs=json.dumps([{"name": n, "model": "echo-model"} for n in names]),
            faults="{}", total=3, rejected=0, created_at=now, expires_at=now + 86400,
        )
    )  # fmt: skip


def _flush(conn, job_name, state, now):
    flush_id = conn.execute(
        gateway_flushes.insert().values(job_name=job_name, api="openai", model="echo-model", state=state, size=1, deadline_at=now,
                                        created_at=now, done_at=now if state == "done" else None)  # fmt: skip
    ).inserted_primary_key[0]
    conn.execute(
        gateway_requests.insert().values(
            id=f"dfr_{job_name}", tenant="acme", api="openai", model="echo-model", payload="{}", decision="deferred",
            state="succeeded", accepted_at=now, deadline_at=now, expected_at=now, flush_id=flush_id, result='{"ok": true}',
            delivery="none", delivery_attempts=0,
        )
    )  # fmt: skip
    return flush_id


def test_delete_leaves_no_row_that_names_the_job_in_any_table(store, tmp_path, clock):
    # "ev.a", the one member of eval "ev", ran through echo-batch (dispatch phases), one row
    # answered again (an earlier version); a finished API batch of `lowtide serve` ran it
    # beside another job; a gateway flush made it (done: its results are delivered).
    _with_a_version(store, tmp_path, clock, "ev.a")
    _with_a_version(store, tmp_path, clock, "keep")
    now = clock.now()
    with store.begin() as conn:
        _save_eval(conn, _eval_data(tmp_path, "ev", ["a"]), now)
        _serve_batch(conn, "batch_done", "completed", ["ev.a", "keep"], now)
        flush_id = _flush(conn, "ev.a", "done", now)
        job_id, dispatch_ids, request_ids = _ids(conn, "ev.a")
        before = naming_rows(conn, "ev.a", job_id, dispatch_ids, request_ids)
        keep_before = naming_rows(conn, "keep", *_ids(conn, "keep"))
    for table in ("jobs", "requests", "request_versions", "dispatches", "dispatch_phases", "attempts", "events", "evals",
                  "serve_batches", "gateway_flushes"):  # fmt: skip
        assert before[table] > 0, table  # the scenario has a row naming the job in each

    delete_job(store, "ev.a", clock)

    with store.begin() as conn:
        after = naming_rows(conn, "ev.a", job_id, dispatch_ids, request_ids)
        assert after == dict.fromkeys(after, 0), {t: n for t, n in after.items() if n}
        # What belongs to something else survives, detached: the API batch (with its other
        # job), the flush and its deferred request (the tenant's record, result included).
        listed = json.loads(conn.execute(sa.select(serve_batches.c.jobs).where(serve_batches.c.id == "batch_done")).scalar_one())
        assert listed == [{"name": "keep", "model": "echo-model"}]
        flush = conn.execute(sa.select(gateway_flushes).where(gateway_flushes.c.id == flush_id)).one()
        assert flush.job_name is None and flush.state == "done"
        assert conn.execute(sa.select(gateway_requests.c.result).where(gateway_requests.c.flush_id == flush_id)).scalar_one()
        assert naming_rows(conn, "keep", *_ids(conn, "keep")) == keep_before


def test_an_eval_keeps_its_record_while_another_member_remains(store, tmp_path, clock):
    data = _eval_data(tmp_path, "pair", ["a", "b"])
    ev = build_eval(data)
    for member in ev.members:
        drive_to_end(store, member.spec, clock)
    with store.begin() as conn:
        _save_eval(conn, data, clock.now())

    delete_job(store, "pair.a", clock)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(evals)).scalar_one() == 1
    report = compare(store, ev)  # the deleted variant reads as one not run yet; the other is scored
    scored = {v.variant: v for v in report.variants}
    assert scored["a"].not_scored == {"not run": 3} and not scored["b"].not_scored

    delete_job(store, "pair.b", clock)  # the last of its jobs: the eval goes with it
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(evals)).scalar_one() == 0


def test_delete_refuses_a_job_a_live_api_batch_runs(store, tmp_path, clock):
    drive_to_end(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), name="batch_live"), clock)
    with store.begin() as conn:
        _serve_batch(conn, "batch_live", "in_progress", ["batch_live"], clock.now())
        before = naming_rows(conn, "batch_live", *_ids(conn, "batch_live"))

    with pytest.raises(InFlightError) as err:
        delete_job(store, "batch_live", clock)

    assert "batch_live" in str(err.value) and "in_progress" in str(err.value) and "cancel" in str(err.value)
    with store.begin() as conn:
        assert naming_rows(conn, "batch_live", *_ids(conn, "batch_live")) == before


def test_the_engine_knows_which_api_batches_are_live():
    from lowtide.server.records import LIVE

    assert set(LIVE_SERVE_STATUSES) == set(LIVE)
