"""Shared fixtures: real stores (a SQLite file, and a fresh PostgreSQL schema), an engine
clock that only moves when told to, and small source files written per test."""

from __future__ import annotations

import csv
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import lowtide.store.gateway_schema  # noqa: F401  (its tables join the shared metadata)
from lowtide.core.clock import ManualClock
from lowtide.core.spec import JobSpec, build_spec
from lowtide.store.db import Store, StoreError
from lowtide.store.migrations import MIGRATIONS
from lowtide.store.schema import metadata, migrations


def _consoles_that_read_columns_on_every_print() -> None:
    """The CLI's Rich consoles are made once, when lowtide.cli.common is imported; made while
    COLUMNS is set they keep that width for good. Made here, with it unset, they read it on
    each print, so a test's COLUMNS holds whatever test (or xdist worker) imported them first."""
    columns = os.environ.pop("COLUMNS", None)
    import lowtide.cli.common  # noqa: F401

    if columns is not None:
        os.environ["COLUMNS"] = columns


_consoles_that_read_columns_on_every_print()

PG_ADMIN_URL = os.environ.get("LOWTIDE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_available() -> bool:
    try:
        engine = sa.create_engine(PG_ADMIN_URL)
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a schema made for this test run."""
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")
    with fresh_pg_schema("lowtide_test") as url:
        yield url


@contextmanager
def fresh_pg_schema(prefix: str) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a new, empty schema, dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, tmp_path) -> Iterator[Store]:
    """A fresh, empty store on each backend."""
    if request.param == "sqlite":
        s = Store(str(tmp_path / "lowtide.db"))
    else:
        s = emptied_pg_store(request.getfixturevalue("pg_schema_url"))
    yield s
    s.close()


@pytest.fixture
def pg_store(pg_schema_url) -> Iterator[Store]:
    """A PostgreSQL store whose tables are new (for a test that is about PostgreSQL alone,
    as those that read query plans and buffer counts are): no planner statistics or dead
    rows left by the tests before it, as `store`'s emptied tables keep."""
    s = fresh_pg_store(pg_schema_url)
    yield s
    s.close()


_KEPT = migrations.name  # which migrations ran is the schema's, not a test's data


def emptied_pg_store(url: str) -> Store:
    """A store on this run's schema holding no rows, as a new one would, sequences restarted.

    Deleting the rows takes ~0.1 s; dropping every table and migrating afresh took ~0.8 s
    a test. The tables keep the planner statistics and dead rows of the tests before (a test
    that reads query plans takes `pg_store`). A schema a test changed (a column dropped, a
    migration taken back or one from a newer release recorded) is made afresh instead."""
    try:
        s = Store(url)
    except StoreError:  # a newer release's migration recorded: start over
        s = None
    if s is not None:
        with s.begin() as conn:
            if _as_migrated(conn):
                conn.exec_driver_sql("; ".join(f'DELETE FROM "{t.name}"' for t in reversed(metadata.sorted_tables) if t.name != _KEPT))
                conn.exec_driver_sql(
                    "SELECT setval(c.oid, 1, false) FROM pg_class c "
                    "WHERE c.relkind = 'S' AND c.relnamespace = current_schema()::regnamespace"
                )
                return s
        s.close()
    return fresh_pg_store(url)


def fresh_pg_store(url: str) -> Store:
    """A store on this run's schema with every lowtide table dropped and made again."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.drop_all(conn)  # every table lowtide makes, the serve and gateway ones too
    engine.dispose()
    return Store(url)


def _as_migrated(conn: sa.Connection) -> bool:
    """Every migration recorded, and lowtide's tables have exactly the columns schema.py gives them."""
    applied = set(conn.scalars(sa.select(migrations.c.name)))
    columns = conn.execute(
        sa.text("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()")
    ).all()
    expected = {(t.name, c.name) for t in metadata.sorted_tables for c in t.columns}
    tables = {t.name for t in metadata.sorted_tables}
    present = {(table, column) for table, column in columns if table in tables}
    return applied == {name for name, _ in MIGRATIONS} and present == expected


@pytest.fixture
def sqlite_store(tmp_path) -> Iterator[Store]:
    s = Store(str(tmp_path / "lowtide.db"))
    yield s
    s.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def wait_until(check: Callable[[], Any], timeout: float = 20.0, what: str = "a condition") -> Any:
    """Poll `check` until it is truthy (a bounded loop; the timeout is only a safety net)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def ticket_rows(n: int, start: int = 1000) -> list[dict]:
    labels = ["billing", "technical", "account", "shipping", "feedback"]
    return [
        {"ticket_id": f"T{start + i}", "channel": "email", "body": f"ticket {start + i} about {labels[i % 5]}", "gold": labels[i % 5]}
        for i in range(n)
    ]


@pytest.fixture
def tickets_csv(tmp_path) -> Path:
    return write_csv(tmp_path / "tickets.csv", ticket_rows(40))


def make_spec(source_path: Path, /, **overrides) -> JobSpec:
    """A job spec over `source_path`; dict overrides (`source` too) merge one level deep."""
    data = {
        "name": "tickets",
        "source": {"path": str(source_path), "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"},
        "model": "test-model",
        "route": "echo",
        "params": {"max_tokens": 256},  # lowtide sets no limit itself; the tests' jobs do
        "retry": {"max_attempts": 3, "backoff_seconds": 10},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return build_spec(data)


def drive_to_end(store: Store, spec: JobSpec, clock: ManualClock, *, max_ticks: int = 200, step: float = 3600.0, engine=None):
    """Load the job, then tick it (moving the engine clock on when idle) until it is done."""
    import asyncio

    from lowtide.engine.control import job_status
    from lowtide.engine.loader import load_job
    from lowtide.engine.tick import Engine

    load_job(store, spec, clock)

    async def go():
        eng = engine or Engine(store, clock, seed=7)
        try:
            for _ in range(max_ticks):
                report = await eng.tick(spec.name)
                status = job_status(store, spec.name)
                if status.done:
                    return status
                if not report.busy:
                    clock.advance(step)
            raise AssertionError(f"job {spec.name} did not finish in {max_ticks} ticks: {status}")
        finally:
            if engine is None:
                await eng.aclose()

    return asyncio.run(go())


def whole_columns(table):
    """Every column of a requests or request_versions table, its `payload` whole
    (store/payloads.py `payload_text`), for `sa.select(*...)`: a test reads what was sent."""
    from lowtide.store.payloads import payload_text

    return [payload_text(table).label("payload") if c.name == "payload" else c for c in table.c]
