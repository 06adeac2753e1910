"""Opening the store: SQLite (one file, WAL) by default, or PostgreSQL by URL."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from lowtide.core.errors import MissingStoreError, StoreError
from lowtide.core.sql_urls import shown_url
from lowtide.store.migrations import apply_migrations, up_to_date

DEFAULT_DB = "lowtide.db"
# A new SQLite store's page size. A job's transactions write thousands of rows of about a
# kilobyte each; at 16 KiB a page the database and its WAL take a quarter of the system calls
# of SQLite's 4 KiB default (bench/pipeline.py: 1.8 -> 1.0 s of system CPU per 100,000
# requests). It takes effect when the file is created; an existing store keeps its own.
PAGE_SIZE = 16384
# How long a SQLite writer waits for another's write lock before failing "database is locked".
BUSY_TIMEOUT_S = 60.0


def is_busy(err: BaseException) -> bool:
    """Whether `err` is SQLite's "database is locked": a write that waited its busy timeout
    for another process's write lock (a long load, a delete, a vacuum). Its transaction is
    rolled back whole, so the same work may simply be tried again."""
    orig = getattr(err, "orig", None) or err
    return isinstance(err, DBAPIError) and str(orig).startswith("database is locked")


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
log = logging.getLogger("lowtide.store")
# How many requests made pending at once refresh the planner's statistics on PostgreSQL
# (`Store.refresh_statistics`; fewer cannot be planned badly enough to matter: a wrong guess
# costs their number times a batch's), and the columns statements select requests by.
ANALYZE_AFTER = 1_000
PLANNED_BY = ("job_id", "state", "lane", "not_before", "dispatch_id", "custom_id")


class Store:
    """The durable state of every job. Cheap to open; call `close()` when done."""

    def __init__(self, location: str | None = None, create: bool = True, busy_timeout: float = BUSY_TIMEOUT_S):
        """`create=False` (read-only commands): a SQLite file that does not exist is an
        error, not a new, empty store. `busy_timeout`: SQLite's wait for the write lock, in seconds."""
        self.location = location or default_location()
        self.busy_timeout = busy_timeout
        url = to_url(self.location)
        self.is_sqlite = url.startswith("sqlite")
        if not self.is_sqlite and not url.startswith("postgresql"):
            raise StoreError(f"cannot open the store at {self.describe()}: a store is a SQLite file (a path) or a PostgreSQL "
                             f"database (postgresql://…), not {make_url(url).get_backend_name()}")  # fmt: skip
        if self.is_sqlite and (path := _sqlite_path(self.location, url)) is not None:
            _check_sqlite_file(path, create)
        self.engine: Engine = self._create_engine(url)
        try:
            # Read first: a store whose migrations are all applied (every open but the first
            # after an upgrade) is opened without taking SQLite's write lock, so a command that
            # only reads never waits for a writer (a load is one transaction of minutes).
            with self.read() as conn:
                if self.is_sqlite:  # a PostgreSQL database may well hold other applications' tables
                    _check_lowtide_store(conn, self.describe())
                current = up_to_date(conn)
            if not current:
                with self.begin() as conn:
                    if self.is_sqlite:
                        _check_lowtide_store(conn, self.describe())
                    apply_migrations(conn)
        except DBAPIError as err:  # not a database, unreachable, refused
            self.engine.dispose()
            raise StoreError(f"cannot open the store at {self.describe()}: {_first_line(err.orig)}; check --db or LOWTIDE_DB") from None
        except StoreError:
            self.engine.dispose()
            raise

    def _create_engine(self, url: str) -> Engine:
        if not self.is_sqlite:
            try:
                return create_engine(url, pool_pre_ping=True)
            except ModuleNotFoundError as err:  # the driver is an extra: say which, not a traceback
                raise StoreError(
                    f"cannot open the store at {self.describe()}: its driver ({err.name}) is not installed; "
                    "install it with `pip install 'lowtide[postgres]'` (`make install` includes it)"
                ) from None
        engine = create_engine(url, connect_args={"timeout": self.busy_timeout})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            # Let SQLAlchemy's "begin" event issue BEGIN itself (the pysqlite recipe).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before WAL: a no-op unless the file is new
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
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
            path = _sqlite_path(self.location, to_url(self.location))
            return str(path) if path is not None else self.location
        return shown_url(to_url(self.location))

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

    def added_pending(self, count: int) -> None:
        """`count` requests just became pending (a load, a retry): from ANALYZE_AFTER on, the
        planner's statistics of the columns requests are selected by are refreshed."""
        if count >= ANALYZE_AFTER:
            self.refresh_statistics("requests", PLANNED_BY)

    def refresh_statistics(self, table: str, columns: Sequence[str]) -> None:
        """PostgreSQL: `ANALYZE` those columns of `table` now, in a statement of its own (the
        lock it takes is held for the statement alone, not for a caller's transaction).

        For after a bulk insert. The planner weighs a statement by the table's statistics,
        which autovacuum refreshes only once a tenth of the table has changed, and which
        otherwise still describe the table as it was: a store whose requests were all
        finished, or that had five rows when last analyzed, is planned as holding next to no
        pending request. Setting the next 10,000 pending ones to dispatched then walked the
        whole new job for each id in the batch (two ticks of 45,000 requests: 89 s, against
        2.6 s on fresh statistics). ANALYZE reads a sample of at most 30,000 rows, whatever
        the table's size. A no-op on SQLite, which keeps no statistics it was not asked for.

        It never waits: a table a VACUUM (`lowtide prune`) or another ANALYZE holds is skipped
        (SKIP_LOCKED, PostgreSQL 12 on), and a refresh that fails is logged, not raised. What
        was written before stays written; autovacuum catches up in time."""
        if self.is_sqlite:
            return
        listed = ", ".join(f'"{c}"' for c in columns)
        try:
            with self.engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(f'ANALYZE (SKIP_LOCKED) "{table}" ({listed})')
        except DBAPIError as err:
            log.warning("could not refresh the planner's statistics of %s: %s", table, _first_line(err.orig))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_line(err: BaseException | None) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _sqlite_path(location: str, url: str) -> Path | None:
    """The file a SQLite store lives in: the path as given, or the one a `sqlite:///` URL
    names (None for an in-memory database)."""
    if "://" not in location:
        return Path(location).expanduser()
    database = make_url(url).database
    return Path(database).expanduser() if database and database != ":memory:" else None


def _check_sqlite_file(path: Path, create: bool) -> None:
    if path.is_dir():
        raise StoreError(f"cannot open the store at {path}: it is a folder; give --db a file path")
    if not create and not path.exists():
        raise MissingStoreError(
            f"no store at {path}: no job has been submitted here; run `lowtide submit` or `lowtide run` first, "
            "or point --db (or LOWTIDE_DB) at the store"
        )


def _check_lowtide_store(conn: Connection, where: str) -> None:
    """A database with tables but none of lowtide's is someone else's: never write into it."""
    names = set(inspect(conn).get_table_names())
    if names and "lowtide_migrations" not in names:
        shown = ", ".join(sorted(names)[:5]) + (", …" if len(names) > 5 else "")
        raise StoreError(
            f"{where} is a database but not a lowtide store (it has tables {shown}); "
            "point --db (or LOWTIDE_DB) at a lowtide store or a new file"
        )
