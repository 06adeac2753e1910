"""Many-row INSERTs on PostgreSQL by COPY, finished in the background (store/bulk.py uses it).

Why COPY: the server reads COPY's rows for about half the CPU of `json_to_recordset`'s
(the requests table, 50,000 rows: 1.6 s against 2.9 s of the server's CPU), and psycopg
writes them in C. COPY knows no `ON CONFLICT`, so it runs in a savepoint: lowtide's inserts
seldom meet a stored row (the loader inserts only rows it did not find, ingest only attempts
it has not seen), and where one does, the savepoint is rolled back and the rows go by the
caller's set-based statement, which skips it (`fallback`).

Why in the background: every statement waits for its answer, so the client and the server
work one after the other (the loader renders a chunk while the server idles, then the
server writes it while the loader waits). A COPY is written and finished by a thread, which
holds psycopg's lock on the connection from the start of the COPY to its end; the caller
goes on (the loader renders its next chunk) and its next use of the connection (a
statement, a commit or rollback, the connection's return to the pool) first waits for the
COPY and raises what it raised. One COPY at a time per connection; its rows are kept until
it ends.

Only plain columns (numbers, text, booleans) whose values come from the rows, a scalar
default or `bulk.fixed` go this way (`plan`); anything else takes the set-based statement.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import Boolean, Connection, Dialect, bindparam, event
from sqlalchemy.dialects.postgresql.dml import OnConflictDoNothing
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Insert
from sqlalchemy.sql.elements import BindParameter

FIXED = "_lowtide_fixed"  # set by bulk.fixed on its literal: the value, for COPY
_PENDING = "lowtide_copy"  # in the pool entry's info: the COPY under way on that connection
_SAVEPOINT = "lowtide_copy"
_HOOKED = "_lowtide_copy_hooks"


def plan(dialect: Dialect, stmt: Insert, keys: list[str]) -> tuple[list[str], list[str], list[Any]] | None:
    """(columns, the row keys that fill them, then the values every row gets) for COPY, or
    None where COPY cannot stand for `stmt`: RETURNING, an ON CONFLICT other than DO NOTHING,
    a value computed in SQL, a column that SQLAlchemy converts (Boolean's check of its values
    aside: psycopg writes a bool as PostgreSQL reads it) or defaults by a function."""
    after = stmt._post_values_clause
    if stmt._returning or after is not None and not isinstance(after, OnConflictDoNothing):
        return None
    table = stmt.table
    given = {(k if isinstance(k, str) else k.key): v for k, v in (stmt._values or {}).items()}
    if not given:
        given = {k: bindparam(k) for k in keys}
    names, from_rows, fixed_names, constants = [], [], [], []
    for name, value in given.items():
        if isinstance(value, BindParameter) and value.key in keys:
            names.append(name)
            from_rows.append(value.key)
        elif FIXED in getattr(value, "__dict__", {}):
            fixed_names.append(name)
            constants.append(value.__dict__[FIXED])
        else:
            return None
    for col in table.c:  # what SQLAlchemy would fill in for a column the statement leaves out
        if col.name in given or col.default is None:
            continue
        if not col.default.is_scalar:
            return None
        fixed_names.append(col.name)
        constants.append(col.default.arg)
    for name in names + fixed_names:
        kind = table.c[name].type
        if not isinstance(kind, Boolean) and kind._cached_bind_processor(dialect) is not None:
            return None
    return names + fixed_names, from_rows, constants


def copy_in_background(
    conn: Connection, stmt: Insert, rows: Sequence[dict[str, Any]], fallback: Callable[[], tuple[str, dict]]
) -> bool:
    """Start inserting `rows` by COPY (see the module doc); False, having done nothing, where
    COPY cannot stand for `stmt`. `fallback` gives the set-based statement's SQL and
    parameters, run where a row was already stored."""
    if conn.dialect.driver != "psycopg":
        return False
    found = plan(conn.dialect, stmt, list(rows[0]))
    if found is None:
        return False
    names, keys, constants = found
    _hook(conn.engine)
    finish(conn.connection.info)  # one at a time: a COPY started by the last call ends first
    quote = conn.dialect.identifier_preparer.quote
    sql = f"COPY {quote(stmt.table.name)} ({', '.join(quote(n) for n in names)}) FROM STDIN"
    conn.exec_driver_sql(f"SAVEPOINT {_SAVEPOINT}")
    job = _Copy(conn.connection.dbapi_connection, sql, rows, keys, constants, fallback)
    conn.connection.info[_PENDING] = job
    job.start()
    job.holding.wait()  # the connection is the COPY's now: the caller's next statement waits for it
    return True


def finish(info: dict, quiet: bool = False) -> None:
    """Wait for the COPY under way on a connection (its pool entry's `info`), if any, and
    raise what it raised (not when `quiet`: the transaction is being given up anyway). An
    error that broke the connection is left for the next statement to meet through
    SQLAlchemy, which reports a lost connection as such."""
    job = info.pop(_PENDING, None)
    if job is None:
        return
    job.join()
    err = job.error
    if err is None or quiet or job.raw.closed or job.raw.broken:
        return
    raise DBAPIError.instance(job.sql, None, err, type(err)) from err


class _Copy(threading.Thread):
    def __init__(self, raw, sql: str, rows, keys: list[str], constants: list[Any], fallback) -> None:
        super().__init__(name="lowtide-copy", daemon=True)
        self.raw, self.sql, self.rows, self.keys, self.constants, self.fallback = raw, sql, rows, keys, constants, fallback
        self.holding = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from psycopg.errors import UniqueViolation  # PostgreSQL's driver: an optional extra

        try:
            with self.raw.cursor() as cursor:
                try:
                    self._copy(cursor)
                except UniqueViolation:  # a row already stored: the set-based INSERT skips it
                    cursor.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                    cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                    cursor.execute(*self.fallback())
                    return
                except BaseException:
                    if not (self.raw.closed or self.raw.broken):  # the rows' own error, reported as it is
                        cursor.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                    raise
                cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        except BaseException as err:
            self.error = err
        finally:
            self.holding.set()
            self.rows = ()

    def _copy(self, cursor) -> None:
        keys, constants = self.keys, self.constants
        with cursor.copy(self.sql) as copy:
            self.holding.set()
            write = copy.write_row
            if constants:
                for row in self.rows:
                    write([*(row[k] for k in keys), *constants])
            else:
                pick = itemgetter(*keys) if len(keys) > 1 else (lambda r, k=keys[0]: (r[k],))
                for row in self.rows:
                    write(pick(row))


def _hook(engine: Engine) -> None:
    """Make every use of the engine's connections wait for their COPY first (once per engine)."""
    if engine.__dict__.get(_HOOKED):
        return
    engine.__dict__[_HOOKED] = True
    event.listen(engine, "before_cursor_execute", lambda conn, *_: finish(conn.connection.info))
    event.listen(engine, "commit", lambda conn: finish(conn.connection.info))
    event.listen(engine, "rollback", _on_rollback)
    event.listen(engine.pool, "reset", _on_reset)
    event.listen(engine.pool, "checkin", _on_checkin)
    event.listen(engine.pool, "invalidate", _on_invalidate)


def _on_rollback(conn) -> None:
    """A rollback waits for the COPY; but a connection the server cut is invalidated, and
    reaching its DBAPI connection would raise PendingRollbackError over the driver's own
    error (a worker then said "unexpected error", not that it lost the database). Its COPY
    was finished when the pool invalidated it (`_on_invalidate`)."""
    if not conn.invalidated:
        finish(conn.connection.info, quiet=True)


def _on_reset(dbapi_connection, connection_record, reset_state) -> None:
    finish(connection_record.info, quiet=True)


def _on_checkin(dbapi_connection, connection_record) -> None:
    if connection_record is not None:
        finish(connection_record.info, quiet=True)


def _on_invalidate(dbapi_connection, connection_record, exception) -> None:
    finish(connection_record.info, quiet=True)
