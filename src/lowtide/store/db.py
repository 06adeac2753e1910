"""Opening the store: SQLite (one file, WAL) by default, or PostgreSQL by URL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from lowtide.core.errors import StoreError
from lowtide.store.migrations import apply_migrations

DEFAULT_DB = "lowtide.db"


def default_location() -> str:
    return os.environ.get("LOWTIDE_DB") or DEFAULT_DB


def to_url(location: str) -> str:
    """A path becomes a SQLite URL; anything with '://' is taken as a SQLAlchemy URL."""
    if "://" in location:
        url = make_url(location)
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False)
    return f"sqlite:///{Path(location).expanduser().resolve()}"


_READ_ONLY = "lowtide_read_only"


class Store:
    """The durable state of every job. Cheap to open; call `close()` when done."""

    def __init__(self, location: str | None = None):
        self.location = location or default_location()
        url = to_url(self.location)
        self.is_sqlite = url.startswith("sqlite")
        self.engine: Engine = self._create_engine(url)
        try:
            with self.begin() as conn:
                apply_migrations(conn)
        except OperationalError as err:
            self.engine.dispose()
            raise StoreError(f"cannot open the store at {self.describe()}: {err.orig}") from None

    def _create_engine(self, url: str) -> Engine:
        if not self.is_sqlite:
            return create_engine(url, pool_pre_ping=True)
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            # Let SQLAlchemy's "begin" event issue BEGIN itself (the pysqlite recipe).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            # IMMEDIATE: take the write lock up front, so two writers queue instead of
            # failing with "database is locked" when a reader upgrades. A read-only
            # transaction (`read`) takes none: under WAL it never waits for a writer.
            conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE")

        return engine

    def describe(self) -> str:
        """Where the store is, without any password in it."""
        if self.is_sqlite:
            return str(Path(self.location).expanduser())
        return make_url(to_url(self.location)).render_as_string(hide_password=True)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """One transaction: everything in it commits together or not at all."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A transaction for reading only: one consistent snapshot that, on SQLite, neither
        waits for a writer nor holds one up (a write in it may fail as "database is locked")."""
        with self.engine.connect() as conn:
            conn.execution_options(**{_READ_ONLY: True})
            with conn.begin():
                yield conn

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
