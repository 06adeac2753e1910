"""Crash safety: `lowtide run` is SIGKILLed while rendering, mid-execution and during ingest,
restarted, and must end with exactly one result per row and nothing run again after success.

Kill points are found by watching the store from outside, never by sleeping for a guess.
"""

from __future__ import annotations

import collections
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ticket_rows, write_csv

LOWTIDE = str(Path(sys.executable).with_name("lowtide"))
ROWS = 20_000
WATCH_TIMEOUT = 120.0  # seconds before a watch gives up (a hung process, not a timing guess)


def _query(db: Path, sql: str) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute(sql).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # not created yet, or tables not there yet
        return -1


def _run_until(spec: Path, db: Path, condition) -> bool:
    """Start `lowtide run`, SIGKILL it as soon as `condition()` holds. True if it was killed,
    False if the run ended first."""
    proc = subprocess.Popen(
        [LOWTIDE, "--db", str(db), "run", str(spec)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + WATCH_TIMEOUT
    try:
        while proc.poll() is None:
            if condition():
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            assert time.monotonic() < deadline, "lowtide run neither finished nor reached the kill point"
            time.sleep(0.005)  # polling interval of the watcher, not a timing assumption
        assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finish(spec: Path, db: Path) -> None:
    done = subprocess.run([LOWTIDE, "--db", str(db), "run", str(spec)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _write_spec(tmp_path: Path, route: str, options: dict) -> Path:
    source = write_csv(tmp_path / "tickets.csv", ticket_rows(ROWS))
    spec = {
        "name": "crashy",
        "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"},
        "model": "test-model",
        "route": route,
        "route_options": options,
        "output": {"path": str(tmp_path / "results.csv")},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _check_exactly_once(db: Path, results: Path) -> None:
    conn = sqlite3.connect(db)
    try:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM requests GROUP BY state").fetchall())
        assert states == {"succeeded": ROWS}
        applied = conn.execute(
            "SELECT request_id, COUNT(*) FROM attempts WHERE applied AND ok GROUP BY request_id HAVING COUNT(*) != 1"
        ).fetchall()
        assert applied == []
        # Nothing ran for a request after its success was recorded.
        after = conn.execute(
            "SELECT COUNT(*) FROM attempts a JOIN attempts s ON s.request_id = a.request_id "
            "AND s.applied AND s.ok WHERE a.id > s.id"
        ).fetchone()[0]
        assert after == 0
    finally:
        conn.close()
    lines = results.read_text().splitlines()
    import csv

    ids = [r["ticket_id"] for r in csv.DictReader(lines)]
    assert len(ids) == ROWS and len(set(ids)) == ROWS


@pytest.mark.slow
def test_sigkill_while_rendering_and_mid_execution_on_a_direct_route(tmp_path):
    db = tmp_path / "lowtide.db"
    spec = _write_spec(tmp_path, "echo", {"dispatch_size": 500})
    wal = Path(f"{db}-wal")

    # 1. While rendering: the load transaction has spilled pages to the WAL, nothing is committed.
    def rendering() -> bool:
        return wal.exists() and wal.stat().st_size > 1_000_000 and _query(db, "SELECT COUNT(*) FROM requests") == 0

    assert _run_until(spec, db, rendering)
    assert _query(db, "SELECT COUNT(*) FROM requests") == 0  # rolled back whole

    # 2. Mid-execution, twice: some results are committed, others are not.
    for fraction in (0.1, 0.5):
        target = int(ROWS * fraction)

        def executing(target=target) -> bool:
            return _query(db, "SELECT COUNT(*) FROM requests WHERE state = 'succeeded'") >= target

        assert _run_until(spec, db, executing)
        assert 0 < _query(db, "SELECT COUNT(*) FROM requests WHERE state = 'succeeded'") < ROWS

    _finish(spec, db)
    _check_exactly_once(db, tmp_path / "results.csv")


@pytest.mark.slow
def test_sigkill_during_batch_submission_and_ingest_submits_each_chunk_once(tmp_path):
    db = tmp_path / "lowtide.db"
    provider = tmp_path / "provider"
    spec = _write_spec(tmp_path, "echo-batch", {"dir": str(provider), "max_requests": 1000})
    chunks = ROWS // 1000

    # 1. During submission: some chunks sent to the provider, others not yet.
    def submitting() -> bool:
        return _query(db, "SELECT COUNT(*) FROM dispatches WHERE state = 'submitted'") >= 3

    assert _run_until(spec, db, submitting)
    # 2. During ingest: some batches ingested, others not.
    def ingesting() -> bool:
        return 0 < _query(db, "SELECT COUNT(*) FROM dispatches WHERE state = 'ended'") >= 2

    assert _run_until(spec, db, ingesting)
    assert _query(db, "SELECT COUNT(*) FROM dispatches WHERE state = 'ended'") < chunks

    _finish(spec, db)
    _check_exactly_once(db, tmp_path / "results.csv")
    keys = collections.Counter(json.loads(m.read_text())["key"] for m in provider.glob("*/meta.json"))
    assert len(keys) == chunks
    assert set(keys.values()) == {1}  # no chunk was submitted twice
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM dispatches WHERE kind = 'batch'").fetchone()[0] == chunks
    finally:
        conn.close()

