"""The server's CPU to insert the bench's rendered requests into PostgreSQL, four ways.

    .venv/bin/python bench/pg_inserts.py --n 50000 --db postgresql://postgres@127.0.0.1/test

Renders `--n` rows of bench/pipeline.py's job (the loader, in a fresh schema dropped after),
then inserts them again into an emptied `requests`, by each way in turn, two rounds: lowtide's
set-based `INSERT … SELECT … FROM json_to_recordset` (bulk.py's fallback), `unnest` of binary
arrays, COPY into a temporary table then `INSERT … SELECT … ON CONFLICT DO NOTHING`, and a
plain COPY. Prints wall, this process's CPU and the backend's CPU (read from /proc: the
server must run on this machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sqlalchemy.dialects import postgresql  # noqa: E402

import lowtide.engine.loader as loader  # noqa: E402
from client_store import ClientStore  # noqa: E402
from lowtide.core.clock import SystemClock  # noqa: E402
from lowtide.store import bulk  # noqa: E402
from lowtide.store.db import Store  # noqa: E402
from pipeline import bench_spec, make_source  # noqa: E402

TYPES = {"source_row": "int", "job_id": "int", "attempts": "int", "not_before": "float8"}  # the rest: text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1/test")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-pg-inserts-"))
    place = ClientStore(tmp, args.db)
    try:
        make_source(tmp / "tickets.csv", args.n)
        store = Store(place.url)
        rows: list[dict] = []
        keep = loader.executemany
        loader.executemany = lambda conn, stmt, chunk, **kw: (rows.extend(dict(r) for r in chunk), keep(conn, stmt, chunk, **kw))
        loader.load_job(store, bench_spec(tmp / "tickets.csv"), SystemClock())
        loader.executemany = keep
        keys = list(rows[0])
        cols = ", ".join(keys)
        typed = ", ".join(f"{k} {TYPES.get(k, 'text')}" for k in keys)
        insert = postgresql.insert(loader.requests).on_conflict_do_nothing(index_elements=["job_id", "custom_id"])

        def by_json(conn, raw):
            conn.execute(bulk._set_based(insert, keys), {bulk._ROWS: bulk.fastjson.dumps(rows)})

        def by_unnest(conn, raw):
            arrays = [list(c) for c in zip(*(tuple(r[k] for k in keys) for r in rows), strict=True)]
            casts = ", ".join(f"%b::{TYPES.get(k, 'text')}[]" for k in keys)
            raw.execute(f"INSERT INTO requests ({cols}) SELECT * FROM unnest({casts}) ON CONFLICT (job_id, custom_id) DO NOTHING", arrays)

        def by_copy_temp(conn, raw):
            raw.execute(f"CREATE TEMP TABLE copied ({typed}) ON COMMIT DROP")
            with raw.cursor().copy(f"COPY copied ({cols}) FROM STDIN") as copy:
                for r in rows:
                    copy.write_row([r[k] for k in keys])
            raw.execute(f"INSERT INTO requests ({cols}) SELECT {cols} FROM copied ON CONFLICT (job_id, custom_id) DO NOTHING")

        def by_copy(conn, raw):
            with raw.cursor().copy(f"COPY requests ({cols}) FROM STDIN") as copy:
                for r in rows:
                    copy.write_row([r[k] for k in keys])

        for _ in range(2):
            for name, way in [("json_to_recordset", by_json), ("unnest", by_unnest), ("COPY, temp table", by_copy_temp), ("COPY", by_copy)]:
                with store.begin() as conn:
                    conn.exec_driver_sql("DELETE FROM requests")
                store.engine.dispose()
                with store.begin() as conn:
                    raw = conn.connection.driver_connection
                    t, c, s = time.perf_counter(), time.process_time(), _backend_cpu(raw.info.backend_pid)
                    way(conn, raw)
                    t, c, s = time.perf_counter() - t, time.process_time() - c, _backend_cpu(raw.info.backend_pid) - s
                print(f"{name:<18} wall {t:6.2f}s  client CPU {c:5.2f}s  server CPU {s:5.2f}s  ({len(rows):,} rows)")
        store.close()
    finally:
        place.drop()
        shutil.rmtree(tmp, ignore_errors=True)


def _backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
