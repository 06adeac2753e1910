"""bulk.executemany for many rows at once: an UPDATE run `by_key` gives each row its own
values and leaves a row its guard no longer matches as it was, on SQLite and PostgreSQL; on
PostgreSQL an INSERT or a keyed UPDATE of many rows is one statement (an INSERT a COPY,
which gives back every value as it was sent and skips a stored row as ON CONFLICT DO NOTHING
says), and a result applied right after a claim finds its requests by primary key even when
the table's statistics predate the claim (they said: no request in any dispatch)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from lowtide.core.states import DispatchState, RequestState
from lowtide.engine.dispatch import assign, new_dispatch
from lowtide.store.bulk import executemany, fixed, guard
from lowtide.store.queries import save_job
from lowtide.store.schema import requests
from lowtide.store.transitions import settle_dispatched

scratch = sa.MetaData()
items = sa.Table(
    "bulk_items", scratch,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("note", sa.Text),
    sa.Column("score", sa.Float),
    sa.Column("ok", sa.Boolean),
    sa.Column("big", sa.BigInteger),
)  # fmt: skip

AWKWARD = ["50% off", 'quote " and \\ back', ":name %(x)s ?", "ünïcode ☃ 日本", "", "line\nbreak\ttab", None]


def _fresh(store, n: int) -> None:
    with store.begin() as conn:
        scratch.drop_all(conn)
        scratch.create_all(conn)
        executemany(conn, items.insert(), [{"state": "open", "note": None, "score": None, "ok": None, "big": None} for _ in range(n)])


def _rows(store) -> list[tuple]:
    with store.read() as conn:
        return [tuple(r) for r in conn.execute(sa.select(items).order_by(items.c.id))]


def _keyed_update(conn, state: str):
    return (
        sa.update(items)
        .where(items.c.id == sa.bindparam("_id"), guard(conn, items.c.state, state))
        .values(state=fixed(conn, "closed"), note=sa.bindparam("note"), score=sa.bindparam("score"),
                ok=sa.bindparam("ok"), big=sa.bindparam("big"))
    )  # fmt: skip


def test_a_keyed_update_gives_each_row_its_values_and_its_guard_holds(store):
    _fresh(store, len(AWKWARD) + 1)
    with store.begin() as conn:  # the last row has moved on: the guard must leave it alone
        conn.execute(sa.update(items).where(items.c.id == len(AWKWARD) + 1).values(state="gone"))
    rows = [
        {"_id": i + 1, "note": note, "score": i / 3, "ok": i % 2 == 0, "big": 2**53 + i}
        for i, note in enumerate(AWKWARD)
    ] + [{"_id": len(AWKWARD) + 1, "note": "stale", "score": 9.0, "ok": True, "big": 1}]
    with store.begin() as conn:
        executemany(conn, _keyed_update(conn, "open"), rows, by_key=True)
        executemany(conn, _keyed_update(conn, "open"), [{**rows[0], "note": "again"}], by_key=True)  # closed now
    assert _rows(store) == [
        (i + 1, "closed", note, i / 3, i % 2 == 0, 2**53 + i) for i, note in enumerate(AWKWARD)
    ] + [(len(AWKWARD) + 1, "gone", None, None, None, None)]


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_many_rows_are_one_statement_on_postgresql(store):
    _fresh(store, 0)
    sent: list[bool] = []  # per call to the driver: was it an executemany (one statement per row)?
    sa.event.listen(store.engine, "before_cursor_execute", lambda *a: sent.append(a[-1]))
    with store.begin() as conn:
        executemany(conn, items.insert(), [{"state": "open", "note": f"n{i}", "score": 0.5, "ok": True, "big": i} for i in range(3000)])
        executemany(conn, _keyed_update(conn, "open"), [{"_id": i, "note": "x", "score": 1.0, "ok": False, "big": 0} for i in range(1, 3001)], by_key=True)
    assert True not in sent  # the INSERT is a COPY (in a savepoint), the UPDATE one statement
    assert [r[:3] for r in _rows(store)[:2]] == [(1, "closed", "x"), (2, "closed", "x")]
    assert len(_rows(store)) == 3000


def _copied_rows() -> list[dict]:
    return [
        {"state": "open", "note": note, "score": i / 3 if i % 3 else None, "ok": [True, False, None][i % 3], "big": 2**53 + i}
        for i, note in enumerate(AWKWARD)
    ]  # fmt: skip


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_a_copied_insert_keeps_every_value_and_fixed_ones(store):
    _fresh(store, 0)
    with store.begin() as conn:
        executemany(conn, items.insert(), _copied_rows())
        fixed_state = items.insert().values(state=fixed(conn, "fixed"), note=sa.bindparam("note"))
        executemany(conn, fixed_state, [{"note": "a"}, {"note": None}])
    expected = [(i + 1, r["state"], r["note"], r["score"], r["ok"], r["big"]) for i, r in enumerate(_copied_rows())]
    n = len(expected)
    assert _rows(store) == expected + [(n + 1, "fixed", "a", None, None, None), (n + 2, "fixed", None, None, None, None)]


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_a_copied_insert_meeting_a_stored_row_skips_it_as_on_conflict_says(store):
    from sqlalchemy.dialects import postgresql

    _fresh(store, 0)
    insert = postgresql.insert(items).on_conflict_do_nothing(index_elements=["id"])
    with store.begin() as conn:
        executemany(conn, insert, [{"id": 2, "state": "first", "note": None, "score": None, "ok": None, "big": None}])
        executemany(conn, items.insert(), [{"id": 5, "state": "first", "note": None, "score": None, "ok": None, "big": None}])
    rows = [{"id": i, "state": "second", "note": f"n{i}", "score": 1.5, "ok": True, "big": i} for i in range(1, 5)]
    with store.begin() as conn:
        executemany(conn, insert, rows)  # id 2 is stored: the COPY is rolled back, the rest inserted
    assert [r[:2] for r in _rows(store)] == [(1, "second"), (2, "first"), (3, "second"), (4, "second"), (5, "first")]
    with pytest.raises(sa.exc.IntegrityError), store.begin() as conn:  # without ON CONFLICT: refused, as before
        executemany(conn, items.insert(), [{"id": 5, "state": "again", "note": None, "score": None, "ok": None, "big": None}])


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_a_copy_finishing_in_the_background_is_waited_for_and_its_error_raised(store):
    """The COPY ends while the caller goes on: its next statement sees every row, and a row
    the table refuses is raised there (as SQLAlchemy's error), nothing of it kept."""
    _fresh(store, 0)
    many = [{"state": "open", "note": "x" * 200, "score": 0.5, "ok": True, "big": i} for i in range(20_000)]
    with store.begin() as conn:
        executemany(conn, items.insert(), many)
        assert conn.execute(sa.select(sa.func.count()).select_from(items)).scalar_one() == 20_000
        executemany(conn, items.insert(), many[:10])
    assert len(_rows(store)) == 20_010
    bad = [{"state": "open", "note": None, "score": None, "ok": None, "big": None}] * 100 + [
        {"state": None, "note": None, "score": None, "ok": None, "big": None}
    ]  # fmt: skip
    with pytest.raises(sa.exc.IntegrityError, match="state"), store.begin() as conn:
        executemany(conn, items.insert(), bad)
        conn.execute(sa.select(1))
    with pytest.raises(sa.exc.IntegrityError, match="state"), store.begin() as conn:  # raised by the commit
        executemany(conn, items.insert(), bad)
    assert len(_rows(store)) == 20_010


@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_results_right_after_a_claim_find_their_requests_by_primary_key(store):
    """Statistics taken while no request was in a dispatch estimate a fresh dispatch at one
    row; a guard written `dispatch_id = 7` then drove the plan through the dispatch index
    and compared every request with every result row (25 million comparisons for 5,000)."""
    with store.begin() as conn:
        job_id, _ = save_job(conn, "stats", "{}", "echo", 0.0)
        conn.execute(sa.text(
            "INSERT INTO requests (job_id, custom_id, source_key, source_row, payload, state, attempts, not_before) "
            "SELECT :job, 'r' || g, 'r' || g, g, repeat('x', 300), 'pending', 0, 0 FROM generate_series(1, 30000) g"
        ), {"job": job_id})  # fmt: skip
    with store.begin() as conn:
        conn.execute(sa.text("ANALYZE requests"))
    plans: list[str] = []

    def explain(conn, cursor, statement, parameters, context, executemany_):
        if statement.startswith("UPDATE requests") and "json_to_recordset" in statement:
            cursor.execute("EXPLAIN " + statement, parameters)
            plans.append("\n".join(r[0] for r in cursor.fetchall()))

    with store.begin() as conn:
        dispatch_id = new_dispatch(conn, job_id, "echo", "direct", DispatchState.RUNNING, 0.0)
        ids = list(range(10001, 12001))
        assert assign(conn, dispatch_id, ids, "echo", 0.0) == len(ids)
        sa.event.listen(store.engine, "before_cursor_execute", explain)
        settle_dispatched(conn, RequestState.SUCCEEDED, dispatch_id, [{"_id": i, "output": "ok"} for i in ids], ["output"])
        sa.event.remove(store.engine, "before_cursor_execute", explain)
    assert len(plans) == 1 and "requests_pkey" in plans[0], plans
    with store.read() as conn:
        states = dict(conn.execute(sa.select(requests.c.state, sa.func.count()).group_by(requests.c.state)).all())
    assert states == {"succeeded": 2000, "pending": 28000}



@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_a_connection_cut_in_a_transaction_raises_the_drivers_error_not_a_pending_rollback(store):
    # Once a COPY has hooked the engine, a transaction whose connection the server ends must
    # roll back to the driver's own error (which the CLI tells as a lost database): the
    # rollback hook reached the invalidated connection and raised PendingRollbackError over
    # it, and a worker said "unexpected error" (tests/reliability/test_lost_store.py, 2 runs in 4).
    from tests.conftest import PG_ADMIN_URL

    _fresh(store, 100)  # by COPY: the engine is hooked
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with pytest.raises(sa.exc.DBAPIError) as cut, store.begin() as conn:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with admin.connect() as other:
                other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            conn.execute(sa.text("SELECT 1"))
    finally:
        admin.dispose()
    assert cut.value.connection_invalidated
