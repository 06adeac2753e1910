"""The real `lowtide delete` and `lowtide prune`, run as subprocesses against a SQLite store."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from lowtide.engine.retention import JOB_TABLES
from tests.cli.test_cli import LOWTIDE, Cli, write_job
from tests.conftest import ticket_rows, write_csv

pytestmark = pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")


class Quiet(Cli):
    """Runs `lowtide` with no terminal on stdin (cron, a pipe), or with one that answers."""

    def __call__(self, *args: str) -> tuple[int, str]:
        proc = subprocess.run(
            [str(LOWTIDE), *args], cwd=self.cwd, env=self.env, text=True, encoding="utf-8",
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
        )  # fmt: skip
        return proc.returncode, proc.stdout

    def answering(self, answer: str, *args: str) -> tuple[int, str]:
        """stdin a terminal that types `answer` at the confirmation prompt."""
        main, tty = pty.openpty()
        try:
            proc = subprocess.Popen(
                [str(LOWTIDE), *args], cwd=self.cwd, env=self.env, text=True, encoding="utf-8",
                stdin=tty, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            os.write(main, answer.encode() + b"\n")
            out, _ = proc.communicate(timeout=120)
        finally:
            os.close(tty)
            os.close(main)
        return proc.returncode, out


@pytest.fixture
def cli(tmp_path) -> Quiet:
    return Quiet(tmp_path, str(tmp_path / "lowtide.db"))


def _job(folder: Path, name: str, **extra) -> Path:
    """A job spec named `name` in its own folder (write_job writes job.yaml and tickets.csv)."""
    here = folder / name
    here.mkdir()
    path = write_job(here, **extra)
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec["name"] = name
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _rows(db: Path, name: str) -> dict[str, int]:
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            job_id = conn.execute(sa.text("SELECT id FROM jobs WHERE name = :n"), {"n": name}).scalar()
            if job_id is None:
                return dict.fromkeys(JOB_TABLES, 0)
            counts = {}
            for table in JOB_TABLES:
                where = {
                    "jobs": "id = :j",
                    "dispatch_phases": "dispatch_id IN (SELECT id FROM dispatches WHERE job_id = :j)",
                }.get(table, "job_id = :j")
                counts[table] = conn.execute(sa.text(f"SELECT count(*) FROM {table} WHERE {where}"), {"j": job_id}).scalar_one()
            return counts
    finally:
        engine.dispose()


def test_delete_asks_refuses_without_a_terminal_and_removes_only_that_job(cli, tmp_path):
    db = tmp_path / "lowtide.db"
    for name in ("junk", "keep"):
        code, out = cli("run", str(_job(tmp_path, name)))
        assert code == 0, out
    junk, keep = _rows(db, "junk"), _rows(db, "keep")
    assert junk["requests"] == 6 and junk["attempts"] == 6 and junk["events"] > 0

    code, out = cli("delete", "junk")  # no terminal to ask on, no --yes
    assert code == 2 and "--yes" in out, out
    assert _rows(db, "junk") == junk

    code, out = cli.answering("n", "delete", "junk")
    assert code == 2 and "delete job junk" in out and "nothing deleted" in out, out
    assert _rows(db, "junk") == junk

    code, out = cli.answering("y", "delete", "junk")
    assert code == 0 and "deleted junk: 6 requests" in out, out
    assert _rows(db, "junk") == dict.fromkeys(JOB_TABLES, 0)
    assert _rows(db, "keep") == keep

    code, out = cli("delete", "junk", "--yes")
    assert code == 2 and 'no job named "junk"' in out, out
    code, out = cli("delete", "keep", "--yes")
    assert code == 0 and _rows(db, "keep") == dict.fromkeys(JOB_TABLES, 0), out
    code, out = cli("status", "keep")
    assert code == 2, out


def test_delete_refuses_in_flight_batches_and_cancel_deletes_once_they_end(cli, tmp_path):
    db = tmp_path / "lowtide.db"
    options = {"dir": str(tmp_path / "echo-batch"), "polls_to_complete": 1000}
    spec = _job(tmp_path, "flying", route="echo-batch", route_options=options)
    for args in (("submit", str(spec)), ("tick",)):
        code, out = cli(*args)
        assert code == 0, out
    before = _rows(db, "flying")
    assert before["dispatches"] == 1

    code, out = cli("delete", "flying", "--yes")
    assert code == 2 and "in flight" in out and "echo-batch" in out and "--cancel" in out, out
    assert _rows(db, "flying") == before

    code, out = cli("delete", "flying", "--cancel")  # asks before cancelling anything
    assert code == 2 and "--yes" in out, out
    code, out = cli("status", "flying", "--json")
    assert json.loads(out)["state"] == "active"

    code, out = cli("delete", "flying", "--cancel", "--yes")  # cancelled; the batch is still out
    assert code == 2 and "still in flight" in out and "lowtide tick" in out, out
    assert _rows(db, "flying")["requests"] == 6
    code, out = cli("status", "flying", "--json")
    assert json.loads(out)["state"] == "cancelled"

    for _ in range(5):  # the provider's cancel lands at the next poll
        cli("tick")
        code, out = cli("delete", "flying", "--cancel", "--yes")
        if code == 0:
            break
    assert code == 0 and "deleted flying" in out, out
    assert _rows(db, "flying") == dict.fromkeys(JOB_TABLES, 0)


def _ended_an_hour_ago(db: Path) -> None:
    """Every job of the store as if it had ended an hour ago: the CLI prunes by the real
    clock, so the jobs age in the store, not by waiting."""
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET finished_at = finished_at - 3600, updated_at = updated_at - 3600"))
    engine.dispose()


def test_prune_keeps_the_report_and_drops_the_bodies(cli, tmp_path):
    db = tmp_path / "lowtide.db"
    code, out = cli("run", str(_job(tmp_path, "old")))
    assert code == 0, out
    code, report = cli("report", "--json")
    assert code == 0, report
    _ended_an_hour_ago(db)

    code, out = cli("prune", "--older-than", "1s")
    assert code == 2 and "--yes" in out, out
    code, out = cli("prune", "--older-than", "soon", "--yes")
    assert code == 2 and "30d" in out, out

    code, out = cli("prune", "--older-than", "1s", "--keep-results", "--yes")
    assert code == 0 and "pruned 1 job(s): 6 request(s)" in out and "freed" in out, out
    code, results = cli("results", "old", "--out", str(tmp_path / "r.jsonl"))
    assert code == 0, results
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 6 and all(row["output"] for row in lines)  # --keep-results: the answers stay

    code, out = cli("prune", "--older-than", "1s", "--yes")
    assert code == 0 and "pruned 1 job(s)" in out, out
    code, out = cli("prune", "--older-than", "1s", "--yes")
    assert code == 0 and "nothing to prune" in out, out

    code, after = cli("report", "--json")
    assert json.loads(after)["total"] == json.loads(report)["total"]
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM requests WHERE output IS NOT NULL OR response IS NOT NULL")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM requests WHERE state = 'succeeded'")).scalar_one() == 6
    engine.dispose()


def test_prune_archives_first_follows_the_specs_retention_and_vacuums(cli, tmp_path):
    import pyarrow.parquet as pq

    db = tmp_path / "lowtide.db"
    for name, extra in (("kept", {}), ("due", {"retention": {"payloads": "1s", "results": "1s"}})):
        code, out = cli("run", str(_job(tmp_path, name, **extra)))
        assert code == 0, out
    code, report = cli("report", "--json")
    _ended_an_hour_ago(db)
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")

    code, out = cli("prune", "--archive", str(blocked), "--yes")  # by each job's retention: only "due"
    assert code == 2 and f"--archive {blocked}" in out and "nothing was pruned" in out, out
    code, out = cli("prune", "--archive", str(tmp_path / "archive"), "--vacuum", "--yes")
    assert code == 0 and "pruned 1 job(s): 6 request(s)" in out and "archived due:" in out and "VACUUM: the store takes" in out, out
    (path,) = (tmp_path / "archive").iterdir()
    rows = pq.read_table(path).to_pylist()
    assert path.name.startswith("due.") and len(rows) == 6 and all(r["payload"] and r["output"] for r in rows)
    code, out = cli("prune", "--yes")
    assert code == 0 and "nothing to prune" in out and "--older-than" in out, out
    code, out = cli("prune", "--older-than", "1s", "--yes")  # every job alike: "kept" too
    assert code == 0 and "pruned 1 job(s)" in out and "--vacuum" in out, out
    code, after = cli("report", "--json")
    assert json.loads(after)["total"] == json.loads(report)["total"]

    code, out = cli("run", str(_job(tmp_path, "bad", retention={"payloads": "30x"})))
    assert code == 2 and "retention.payloads" in out and "30d, 12h or 90m" in out and "job.yaml" in out, out
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM jobs WHERE name = 'bad'")).scalar_one() == 0
    engine.dispose()


def test_delete_says_how_many_notifications_it_drops_unsent(cli, tmp_path):
    # Nothing listens on the receiver's port: `run` tries the job's notification once and
    # leaves it for a retry, which the delete takes away.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    notify = {"urls": [url], "secret_env": "NOTIFY_SECRET", "allow_loopback": True, "backoff_seconds": 3600}
    cli.env["NOTIFY_SECRET"] = "s3cret-for-the-test"
    code, out = cli("run", str(_job(tmp_path, "noisy", notify=notify)))
    assert code == 0, out
    assert _rows(tmp_path / "lowtide.db", "noisy")["notifications"] == 1

    code, out = cli.answering("n", "delete", "noisy")
    assert code == 2 and "its 1 notification(s) not yet delivered will never be sent?" in out, out
    code, out = cli("delete", "noisy", "--yes")
    assert code == 0 and "noisy: 1 notification(s) not yet delivered were deleted with it and will never be sent" in out, out
    assert "s3cret" not in out

    code, out = cli("run", str(_job(tmp_path, "quiet")))  # without notify: nothing said
    assert code == 0, out
    code, out = cli("delete", "quiet", "--yes")
    assert code == 0 and "notification" not in out, out


def test_a_run_after_a_prune_keeps_the_answers_its_sql_table_has_and_says_so(cli, tmp_path):
    """The nightly run of a pruned job (a new row in its source) adds that row to its SQL
    table and leaves the answers already there: the store no longer has them."""
    url = f"sqlite:///{tmp_path / 'warehouse.db'}"
    spec = _job(tmp_path, "nightly", output={"url": url, "table": "answers"})
    code, out = cli("run", str(spec))
    assert code == 0, out
    engine = sa.create_engine(url)
    query = sa.text("SELECT custom_id, state, output FROM answers ORDER BY custom_id")
    with engine.connect() as conn:
        before = conn.execute(query).all()
    assert len(before) == 6 and all(state == "succeeded" and output for _, state, output in before)
    _ended_an_hour_ago(tmp_path / "lowtide.db")
    code, out = cli("prune", "--older-than", "1s", "--yes")
    assert code == 0 and "pruned 1 job(s)" in out, out
    write_csv(spec.parent / "tickets.csv", ticket_rows(7))  # tonight's new row

    code, out = cli("run", str(spec))

    assert code == 0, out
    with engine.connect() as conn:
        after = conn.execute(query).all()
    engine.dispose()
    assert after[:6] == before and after[6][0] == "T1006" and after[6][1] == "succeeded" and after[6][2]
    said = " ".join(out.split())  # rich wraps a line longer than the terminal (a long tmp_path)
    assert f"results: {url} table answers (7 rows; 6 answers pruned from the store: their rows in the table are kept as they were)" in said, out
