"""The store itself, on SQLite and PostgreSQL: migrations, transitions, refusal of newer stores."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from lowtide.core.errors import StoreError
from lowtide.core.states import (
    DISPATCH_TRANSITIONS,
    REQUEST_TRANSITIONS,
    TERMINAL_DISPATCH_STATES,
    DispatchState,
    RequestState,
)
from lowtide.store.db import Store, to_url
from lowtide.store.migrations import MIGRATIONS
from lowtide.store.schema import migrations, requests
from lowtide.store.transitions import move_dispatch, move_requests, request_sources


def test_migration_names_are_unique_and_ordered():
    names = [name for name, _ in MIGRATIONS]
    assert len(names) == len(set(names))
    assert names == sorted(names)
    assert all(name.startswith(f"m{i + 1:03d}_") for i, name in enumerate(names))


def test_opening_applies_every_migration_once(store):
    with store.begin() as conn:
        applied = list(conn.scalars(sa.select(migrations.c.name)))
    assert applied == [name for name, _ in MIGRATIONS]
    reopened = Store(store.location)  # opening again applies nothing new
    with reopened.begin() as conn:
        assert list(conn.scalars(sa.select(migrations.c.name))) == applied
    reopened.close()


def test_a_store_from_a_newer_release_is_refused(sqlite_store):
    with sqlite_store.begin() as conn:
        conn.execute(migrations.insert().values(name="m999_from_the_future", applied_at=0.0))
    with pytest.raises(StoreError, match="newer lowtide.*m999_from_the_future"):
        Store(sqlite_store.location)


def test_sqlite_store_uses_wal(sqlite_store):
    with sqlite_store.begin() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_urls_and_paths():
    assert to_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert to_url("some/file.db").startswith("sqlite:////")


@pytest.mark.parametrize(
    "location",
    [
        "postgresql://u:secret@h/db",
        "postgresql://u@h/db?password=secret",  # libpq's and psycopg's own key
        "postgresql://u@h/db?sslmode=verify-full&sslpassword=secret",  # the client key's passphrase
        "postgresql://u@h/db?PASSWORD=secret&application_name=etl",
        "mysql+pymysql://u@h/db?passwd=secret",
        "mssql+pyodbc://u@dsn?PWD=secret",
    ],
)
def test_describe_shows_the_store_without_its_password_in_any_form(location):
    """`describe` is what every message and start line (status's "cannot open the store at",
    submit's "job stored in", dashboard, serve, gateway) shows of --db."""
    s = Store.__new__(Store)
    s.location, s.is_sqlite = location, False
    shown = s.describe()
    assert "secret" not in shown and "***" in shown
    assert "@h/db" in shown or "@dsn" in shown
    assert ("sslmode=verify-full" in shown) == ("sslmode" in location)  # what is not a secret is shown as given


@pytest.mark.parametrize("url, backend", [("mysql://app@db.internal/jobs", "mysql"), ("mssql+pyodbc://app@db/jobs", "mssql")])
def test_a_database_a_store_cannot_be_is_named(url, backend):
    """A MySQL URL was told to install lowtide[postgres] (its driver was missing); with the
    driver there, a store no migration was written for would have been made."""
    with pytest.raises(StoreError, match=rf"a store is a SQLite file \(a path\) or a PostgreSQL database \(postgresql://…\), not {backend}$"):
        Store(url)


def test_an_unreachable_database_is_a_clear_error():
    with pytest.raises(StoreError, match="cannot open the store"):
        Store("postgresql://nobody@127.0.0.1:1/none")
    with pytest.raises(StoreError, match="cannot open the store") as caught:
        Store("postgresql://nobody@127.0.0.1:1/none?password=S3CRETPW")
    assert "S3CRETPW" not in str(caught.value) and "postgresql+psycopg://nobody@127.0.0.1:1/none?password=***" in str(caught.value)


def test_transition_tables_are_closed_and_terminal_states_are_final():
    for table, enum in ((REQUEST_TRANSITIONS, RequestState), (DISPATCH_TRANSITIONS, DispatchState)):
        assert set(table) == set(enum)
        for targets in table.values():
            assert targets <= set(enum)
    assert REQUEST_TRANSITIONS[RequestState.SUCCEEDED] == frozenset()
    for state in TERMINAL_DISPATCH_STATES:
        assert DISPATCH_TRANSITIONS[state] == frozenset()


def test_illegal_transitions_are_refused(store):
    with pytest.raises(ValueError, match="illegal state transition 'succeeded' → 'pending'"):
        request_sources(RequestState.PENDING, only=[RequestState.SUCCEEDED])
    with store.begin() as conn, pytest.raises(ValueError, match="'ended' → 'submitted'"):
        move_dispatch(conn, 1, DispatchState.ENDED, DispatchState.SUBMITTED)


def test_move_requests_only_touches_rows_in_a_legal_source_state(store, clock, tmp_path):
    from lowtide.engine.loader import load_job
    from tests.conftest import make_spec, ticket_rows, write_csv

    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(3))), clock)
    with store.begin() as conn:
        # pending -> succeeded is not a legal move: nothing changes.
        assert move_requests(conn, RequestState.SUCCEEDED, requests.c.job_id == 1) == 0
        assert move_requests(conn, RequestState.CANCELLED, requests.c.job_id == 1) == 3
        assert set(conn.scalars(sa.select(requests.c.state))) == {"cancelled"}


def test_a_read_transaction_neither_waits_for_a_writer_nor_sees_its_uncommitted_rows(sqlite_store):
    with sqlite_store.begin() as writer:
        writer.execute(migrations.insert().values(name="m_uncommitted", applied_at=0.0))
        # A second BEGIN IMMEDIATE would wait here for the writer (busy_timeout, then "locked").
        with sqlite_store.read() as reader:
            names = set(reader.scalars(sa.select(migrations.c.name)))
        assert "m_uncommitted" not in names and names == {name for name, _ in MIGRATIONS}


def test_among_matches_more_values_than_a_statement_may_bind(store, clock, tmp_path):
    from lowtide.engine.loader import load_job
    from lowtide.store.bulk import among
    from tests.conftest import make_spec, ticket_rows, write_csv

    load_job(store, make_spec(write_csv(tmp_path / "t.csv", ticket_rows(5))), clock)
    with store.begin() as conn:
        wanted = [cid for cid, in conn.execute(sa.select(requests.c.custom_id).order_by(requests.c.id).limit(3))]
        many = wanted + [f"absent-{i}" for i in range(40_000)]  # SQLite binds at most 32,766
        assert sorted(conn.scalars(sa.select(requests.c.custom_id).where(among(conn, requests.c.custom_id, many)))) == sorted(wanted)
        ids = list(conn.scalars(sa.select(requests.c.id).where(among(conn, requests.c.custom_id, wanted))))
        assert sorted(conn.scalars(sa.select(requests.c.custom_id).where(among(conn, requests.c.id, ids)))) == sorted(wanted)


@contextmanager
def opened_before(store: Store, migration: str, undo: str) -> Iterator[Store]:
    """The store as it was before `migration` (`undo` is the SQL that takes it back), opened
    again: the migration has run, and is recorded."""
    with store.begin() as conn:
        conn.exec_driver_sql(undo)
        conn.execute(migrations.delete().where(migrations.c.name == migration))
    reopened = Store(store.location)
    try:
        with reopened.begin() as conn:
            assert migration in set(conn.scalars(sa.select(migrations.c.name)))
        yield reopened
    finally:
        reopened.close()


def test_m007_gives_dispatches_of_an_older_store_a_submit_started_at(store):
    """A store from before m007: the column is added; its dispatches keep NULL there, and
    `find` is anchored at their created_at as before (engine/batches.py)."""
    from lowtide.store.queries import save_job
    from lowtide.store.schema import dispatches

    with store.begin() as conn:
        job_id, _ = save_job(conn, "old", "{}", "echo-batch", 1.0)
        conn.execute(dispatches.insert().values(job_id=job_id, route="echo-batch", kind="batch", key="k", state="submitting", size=1, created_at=5.0))
    with opened_before(store, "m007_dispatch_submit_started", "ALTER TABLE dispatches DROP COLUMN submit_started_at") as reopened, reopened.begin() as conn:
        assert conn.execute(sa.select(dispatches.c.created_at, dispatches.c.submit_started_at)).one() == (5.0, None)


INDEX_MIGRATIONS = [
    # m015: pending requests by lane (engine/tiers.py); partial: pending rows only
    ("m015_requests_lane_index", "requests", "ix_requests_pending_lane", ["job_id", "state", "lane", "not_before", "id"]),
    # m016: a tier's newest turnarounds (engine/turnaround.py)
    ("m016_dispatches_turnaround_index", "dispatches", "ix_dispatches_turnaround", ["route", "model", "kind", "tier", "state", "ended_at"]),
]  # fmt: skip


@pytest.mark.parametrize(("migration", "table", "index", "columns"), INDEX_MIGRATIONS)
def test_a_store_from_before_an_index_migration_gets_the_index_when_it_opens(store, migration, table, index, columns):
    """A new store has the index from m001 (made from the schema); an older one gets it from
    its migration."""
    def found(s):
        with s.begin() as conn:
            return [i["column_names"] for i in sa.inspect(conn).get_indexes(table) if i["name"] == index]

    assert found(store) == [columns]
    with opened_before(store, migration, f"DROP INDEX {index}") as reopened:
        assert found(reopened) == [columns]


def test_m023_rebuilds_the_dispatch_index_of_an_older_store_with_the_id(store):
    """A store from before m023 has ix_requests_dispatch on dispatch_id alone, which left
    PostgreSQL reading the table's ids for each page of a batch; opened, it has (dispatch_id, id)."""

    def found(s):
        with s.begin() as conn:
            return [i["column_names"] for i in sa.inspect(conn).get_indexes("requests") if i["name"] == "ix_requests_dispatch"]

    with store.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_requests_dispatch")
    old = "CREATE INDEX ix_requests_dispatch ON requests (dispatch_id)"
    with opened_before(store, "m023_requests_dispatch_id_index", old) as reopened:
        assert found(reopened) == [["dispatch_id", "id"]]


def test_m017_gives_the_requests_of_an_older_store_a_plain_answer(store, tmp_path):
    """A store from before m017 gets the column when it opens; its requests keep NULL there,
    so the export reads their answer columns from the responses, as before."""
    from tests.engine.ledger_helpers import stored_job

    stored_job(store, tmp_path, n=1)
    with opened_before(store, "m017_plain_answers", "ALTER TABLE requests DROP COLUMN plain_answer") as reopened, reopened.begin() as conn:
        assert conn.execute(sa.select(requests.c.custom_id, requests.c.plain_answer)).all() == [("r0", None)]


def test_a_postgresql_store_without_its_driver_names_the_extra(monkeypatch):
    # `make install` had no psycopg: `--db postgresql://…` ended in "unexpected error: ModuleNotFoundError".
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    with pytest.raises(StoreError, match=r"driver \(psycopg\) is not installed.*pip install 'lowtide\[postgres\]'"):
        Store("postgresql://nobody@127.0.0.1:1/none")
