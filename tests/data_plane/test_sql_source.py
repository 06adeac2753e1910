"""SQL tables and queries as sources (`source.url` + `table`/`query`), on the PostgreSQL
these machines run and on a SQLite file: rows streamed with a server-side cursor, filters in
the WHERE clause, column types kept in typed results, and the refusals that name the table,
the column and the fix before anything is stored."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError, SpecError
from lowtide.core.sources import source_of
from lowtide.core.spec import build_spec
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.store.db import Store
from tests.conftest import PG_ADMIN_URL, drive_to_end, fresh_pg_schema

DAY = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def spec_for(url: str, base_dir: Path, **source) -> object:
    return build_spec({
        "name": "tickets",
        "source": {"url": url, "id_column": "ticket_id", **source},
        "template": {"user": "Ticket {{ ticket_id }}: {{ body }}"},
        "model": "test-model",
        "route": "echo",
        "params": {"max_tokens": 64},
        "base_dir": str(base_dir),
    })  # fmt: skip


def make_table(engine: sa.Engine, n: int, start: int = 0) -> sa.Table:
    meta = sa.MetaData()
    table = sa.Table(
        "tickets", meta,
        sa.Column("ticket_id", sa.Integer, primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer),
        sa.Column("urgent", sa.Boolean),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )  # fmt: skip
    meta.create_all(engine)
    add_rows(engine, table, range(start, start + n), DAY)
    return table


def add_rows(engine: sa.Engine, table: sa.Table, ids, at: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"ticket_id": i, "body": f"ticket {i}", "priority": i % 3, "urgent": i % 2 == 0, "updated_at": at} for i in ids])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    """A database URL (no password: the spec refuses one) with an empty schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'warehouse.db'}"
        return
    try:
        sa.create_engine(PG_ADMIN_URL).connect().close()
    except Exception:
        pytest.skip("PostgreSQL is not reachable")
    with fresh_pg_schema("lowtide_src") as url:
        yield url


def test_a_table_loads_runs_and_exports_with_its_own_types(db_url, sqlite_store, clock, tmp_path):
    engine = sa.create_engine(db_url)
    make_table(engine, 30)
    spec = spec_for(db_url, tmp_path, table="tickets")
    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts.get("succeeded") == 30
    out = tmp_path / "results.parquet"
    export_results(sqlite_store, "tickets", out)
    table = pq.read_table(out)
    schema = table.schema
    assert str(schema.field("ticket_id").type) == "int64" and str(schema.field("priority").type) == "int64"
    assert str(schema.field("urgent").type) == "bool"
    assert schema.field("updated_at").type.__class__.__name__ == "TimestampType"
    rows = table.to_pylist()
    assert [r["ticket_id"] for r in rows] == list(range(30))
    assert all(r["state"] == "succeeded" and r["output"] for r in rows)
    engine.dispose()


def test_a_query_with_a_filter_reads_only_its_rows(db_url, tmp_path):
    engine = sa.create_engine(db_url)
    make_table(engine, 20)
    spec = spec_for(db_url, tmp_path, query="SELECT ticket_id, body, priority FROM tickets WHERE urgent", filter=[["priority", ">=", 1]])
    source = source_of(spec)
    ids = [r.values["ticket_id"] for chunk in source.chunks() for r in chunk]
    assert ids == [i for i in range(20) if i % 2 == 0 and i % 3 >= 1]
    assert source.columns == ["ticket_id", "body", "priority"]
    engine.dispose()


@pytest.mark.postgres
def test_postgres_rows_are_fetched_through_a_server_side_cursor(tmp_path):
    """While the source is half read, the server is answering FETCHes of a cursor: the
    table is not pulled whole into the client."""
    with fresh_pg_schema("lowtide_src") as url:
        engine = sa.create_engine(url)
        make_table(engine, 12_000)
        source = source_of(spec_for(url, tmp_path, table="tickets"))
        chunks = source.chunks(size=1000)
        next(chunks)
        watcher = sa.create_engine(PG_ADMIN_URL)
        with watcher.connect() as conn:
            queries = conn.execute(sa.text("SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid()")).scalars().all()
        assert any(q.lstrip().upper().startswith(("FETCH", "DECLARE")) for q in queries), queries
        assert sum(len(c) for c in chunks) == 11_000
        watcher.dispose()
        engine.dispose()


def test_since_reads_only_rows_past_the_watermark_and_reports_changed_rows(db_url, sqlite_store, clock, tmp_path):
    engine = sa.create_engine(db_url)
    table = make_table(engine, 10)
    spec = spec_for(db_url, tmp_path, table="tickets", since={"column": "updated_at"})

    first = load_job(sqlite_store, spec, clock)
    assert (first.rows, first.new) == (10, 10)
    assert first.watermark is not None and first.watermark.startswith("2026-12-01T09:00")

    later = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    add_rows(engine, table, range(10, 13), later)
    with engine.begin() as conn:  # a row edited since: comes back with a newer watermark
        conn.execute(table.update().where(table.c.ticket_id == 4).values(body="ticket 4, edited", updated_at=later))

    second = load_job(sqlite_store, spec, clock)
    assert (second.rows, second.new, second.changed) == (4, 3, 1)
    assert second.watermark.startswith("2026-12-02T09:00")

    third = load_job(sqlite_store, spec, clock)  # nothing new tonight: no error, nothing stored
    assert (third.rows, third.new) == (0, 0)
    assert third.watermark == second.watermark
    engine.dispose()


def test_a_watermark_column_that_went_backwards_is_refused(db_url, sqlite_store, clock, tmp_path):
    engine = sa.create_engine(db_url)
    table = make_table(engine, 5)
    spec = spec_for(db_url, tmp_path, table="tickets", since={"column": "updated_at"})
    load_job(sqlite_store, spec, clock)
    with engine.begin() as conn:  # the table rebuilt from an older snapshot
        conn.execute(table.update().values(updated_at=datetime(2026, 11, 1, tzinfo=UTC)))
    with pytest.raises(SourceError, match=r'source.since column "updated_at" went backwards: its highest value is now 2026-11-01.*'
                                          r"last load stored rows up to 2026-12-01T09:00.*Nothing was stored"):
        load_job(sqlite_store, spec, clock)
    engine.dispose()


def test_bad_sql_sources_are_refused_by_name(db_url, tmp_path):
    engine = sa.create_engine(db_url)
    make_table(engine, 2)
    with pytest.raises(SourceError, match=r"table nope: no such table; check source.table"):
        source_of(spec_for(db_url, tmp_path, table="nope"))
    with pytest.raises(SourceError, match=r'source.since.column names column "changed", which it does not have; columns are: ticket_id, body'):
        source_of(spec_for(db_url, tmp_path, table="tickets", since={"column": "changed"}))
    with pytest.raises(SourceError, match=r'source.filter names column "team"'):
        source_of(spec_for(db_url, tmp_path, table="tickets", filter=[["team", "=", "a"]]))
    with pytest.raises(SourceError, match=r"query: .*(nope|no such table)"):
        source_of(spec_for(db_url, tmp_path, query="SELECT * FROM nope"))
    engine.dispose()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://etl:hunter2@db.internal/warehouse",
        "postgresql://etl@db.internal/warehouse?password=hunter2",  # libpq takes it as a query key too
        "postgresql+psycopg://etl@db.internal/warehouse?sslmode=verify-full&sslpassword=hunter2",
        "postgresql://etl@db.internal/warehouse?Password=hunter2",
    ],
)
def test_a_url_with_a_password_is_refused_without_showing_it(tmp_path, url):
    with pytest.raises(SpecError) as info:
        spec_for(url, tmp_path, table="tickets")
    msg = str(info.value)
    assert "holds a password; a spec never holds a key" in msg and "PGPASSWORD" in msg
    assert "hunter2" not in msg


def test_one_of_table_or_query(tmp_path):
    with pytest.raises(SpecError, match="a SQL source takes exactly one of `table` or `query`"):
        spec_for("sqlite:///x.db", tmp_path)
    with pytest.raises(SpecError, match="give exactly one of `path`"):
        build_spec({"name": "t", "source": {"path": "a.csv", "url": "sqlite:///x.db", "table": "t", "id_column": "id"},
                    "template": {"user": "x"}, "model": "m", "route": "echo"})  # fmt: skip


def test_store_is_untouched_by_a_refused_sql_load(db_url, sqlite_store: Store, clock, tmp_path):
    spec = spec_for(db_url, tmp_path, table="missing")
    with pytest.raises(SourceError):
        load_job(sqlite_store, spec, clock)
    with sqlite_store.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar() == 0
