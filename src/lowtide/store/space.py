"""The store's size on disk, and giving back the space a prune freed (`lowtide prune --vacuum`).

SQLite: a prune turns bodies into NULLs, and the pages they filled go on the file's free
list: the file keeps its size until a `VACUUM`. The store is made with SQLite's default
`auto_vacuum=NONE` (store/db.py sets no other), so `PRAGMA incremental_vacuum` would do
nothing: changing a file to `auto_vacuum=INCREMENTAL` itself takes one full VACUUM, and
incremental vacuuming moves pages without defragmenting them. So a plain `VACUUM`, run
outside any transaction: it rewrites the whole database into a new file and swaps it in.
Its cost: time and I/O in proportion to what is kept (not to what was dropped), free disk
up to the database's size while it runs (the new copy passes through the WAL), and the
store's write lock held throughout: workers and ticks wait meanwhile (up to the 60 s busy
timeout of store/db.py; past it their write fails, "database is locked"), so vacuum when
nothing is running. A
checkpoint then truncates the WAL, where the rewritten pages went. Where the file was made
`auto_vacuum=INCREMENTAL` by hand, `incremental_vacuum` is used instead: it frees the
pages without rewriting the file.

PostgreSQL: `VACUUM (ANALYZE)` of the tables a prune changes (not FULL, which rewrites
them under an exclusive lock): the dead tuples and their TOAST become reusable space for
new rows at once, while readers and writers go on; the files shrink only where whole pages
at their end came free. lowtide's tables only: the database may hold others.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import text

from lowtide.store.db import Store
from lowtide.store.schema import metadata

# The tables whose bodies a prune drops.
PRUNED_TABLES = ("requests", "request_versions")


def store_bytes(store: Store) -> int:
    """Bytes the store takes on disk: the SQLite file and its WAL; on PostgreSQL lowtide's
    tables with their indexes and TOAST."""
    if store.is_sqlite:
        path = Path(store.describe())
        return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())
    with store.read() as conn:
        total = 0
        for table in metadata.sorted_tables:
            size = conn.execute(text("SELECT pg_total_relation_size(to_regclass(:t))"), {"t": table.name}).scalar()
            total += size or 0
        return total


def reclaim(store: Store) -> str:
    """Give the space freed by deleted or emptied rows back (see the module's docstring);
    returns what was run."""
    if store.is_sqlite:
        raw = store.engine.raw_connection()  # autocommit (store/db.py): no BEGIN is issued around it
        try:
            cur = raw.cursor()
            incremental = cur.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
            done = "PRAGMA incremental_vacuum" if incremental else "VACUUM"
            cur.execute(done)
            cur.fetchall()
            cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            cur.close()
        finally:
            raw.close()
        return done
    done = f"VACUUM (ANALYZE) {', '.join(PRUNED_TABLES)}"
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(done)
    return done
