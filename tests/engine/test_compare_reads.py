"""`compare` reads the store in read-only transactions: on SQLite it does not wait for a
worker that holds the write lock (an ingest, a tick). Before, its BEGIN IMMEDIATE queued
behind the writer for up to the busy timeout (60 s) and then failed "database is locked"."""

from __future__ import annotations

import sqlite3

from lowtide.engine.compare import compare
from lowtide.engine.evals import stored_eval
from lowtide.store.db import Store
from tests.cli.test_compare_cli import _run_eval


def test_compare_answers_while_a_worker_holds_the_write_lock(tmp_path, monkeypatch):
    _run_eval(tmp_path, monkeypatch)
    store = Store(str(tmp_path / "s.db"))
    writer = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # a worker mid-transaction
        writer.execute("UPDATE jobs SET updated_at = updated_at")
        report = compare(store, stored_eval(store, "cli-ev"))
        assert [(v.variant, v.scored, v.correct) for v in report.variants] == [("e-right", 10, 10), ("e-wrong", 10, 2)]
        assert report.pairs[0].a_only == 8
    finally:
        writer.rollback()
        writer.close()
        store.close()
