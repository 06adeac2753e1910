"""What a request row's width costs SQLite alone: the store's three writes of a request (insert,
claim, answer) with the payload in the row at two sizes, and with the payload in a table of
its own that the claim and the answer never rewrite.

    .venv/bin/python bench/row_width.py                 # 100,000 rows: 622-byte and 274-byte payloads
    .venv/bin/python bench/row_width.py --n 1000000

The sizes are `bench/pipeline.py`'s: its job's payload with the JSON schema of the choices in
`response_format` (622 bytes), and without choices (274). A stand-in table, not lowtide's
schema: it prices the bytes, not lowtide's statements. Prints each case's CPU (this process:
SQLite runs in it), its ratio to the first case, the file's size and the peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import tempfile
import time

CHUNK = 5000  # requests a transaction, as a dispatch of echo
ANSWER = "y" * 430  # the size of echo's stored answer body in bench/pipeline.py


def run(n: int, payload_bytes: int, apart: bool) -> tuple[float, int]:
    """CPU seconds of the three writes of `n` requests, and the store's size in bytes."""
    folder = tempfile.mkdtemp(prefix="lowtide-row-width-")
    path = os.path.join(folder, "store.db")
    db = sqlite3.connect(path, isolation_level=None)
    for pragma in ("page_size=16384", "journal_mode=WAL", "synchronous=NORMAL"):  # as store/db.py
        db.execute(f"PRAGMA {pragma}")
    column = "payload_id" if apart else "payload"  # apart: the row holds the payload's id in table p
    db.execute(f"CREATE TABLE r (id INTEGER PRIMARY KEY, job INT, cid TEXT, state TEXT, dispatch INT, {column}, text TEXT, response TEXT)")
    if apart:
        db.execute("CREATE TABLE p (id INTEGER PRIMARY KEY, payload TEXT)")
    db.execute("CREATE UNIQUE INDEX ix_job_cid ON r (job, cid)")
    db.execute("CREATE INDEX ix_job_state ON r (job, state)")
    payload = "x" * payload_bytes
    began = time.process_time()
    for start in range(0, n, CHUNK):
        ids = range(start, min(start + CHUNK, n))
        db.execute("BEGIN")
        if apart:
            db.executemany("INSERT INTO p (id, payload) VALUES (?, ?)", [(i, payload) for i in ids])
        db.executemany(f"INSERT INTO r (id, job, cid, state, {column}) VALUES (?, 1, ?, 'pending', ?)",
                       [(i, f"t{i:07d}", i if apart else payload) for i in ids])  # fmt: skip
        db.execute("COMMIT")
    for start in range(0, n, CHUNK):
        db.execute("BEGIN")
        db.execute("UPDATE r SET state = 'dispatched', dispatch = ? WHERE id >= ? AND id < ?", (start, start, start + CHUNK))
        db.execute("COMMIT")
        db.execute("BEGIN")
        read = "SELECT r.id, p.payload FROM r JOIN p ON p.id = r.payload_id" if apart else "SELECT id, payload FROM r"
        rows = db.execute(f"{read} WHERE dispatch = ?", (start,)).fetchall()
        db.executemany("UPDATE r SET state = 'succeeded', text = ?, response = ? WHERE id = ?", [("billing", ANSWER, i) for i, _ in rows])
        db.execute("COMMIT")
    cpu = time.process_time() - began
    size = os.path.getsize(path)
    db.close()
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    os.rmdir(folder)
    return cpu, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()
    cases = [("payload 622 B in the row", 622, False), ("payload 274 B in the row", 274, False), ("payload 622 B apart", 622, True)]
    first = None
    print(f"SQLite alone, {args.n:,} requests: insert, claim, answer")
    for name, size, apart in cases:
        cpu, store = run(args.n, size, apart)
        first = first or cpu
        print(f"  {name:<26} CPU {cpu:6.2f} s  ({cpu / first:4.2f}x)  store {store / 1e6:6.0f} MB  {cpu / args.n * 1e6:5.1f} us/request")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
