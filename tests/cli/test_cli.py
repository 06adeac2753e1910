"""The real `lowtide` command, run as a subprocess against a store in tmp_path."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.errors import SpecError
from lowtide.engine.preflight import check_output
from lowtide.routes import known_routes
from lowtide.store.schema import attempts
from tests.conftest import ticket_rows, write_csv

LOWTIDE = Path(sys.executable).with_name("lowtide")
COMMANDS = ["run", "submit", "estimate", "status", "results", "cancel", "retry", "report", "tick", "worker"]
LABELS = ["billing", "technical", "account", "shipping", "feedback"]

pytestmark = pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")


class Cli:
    """Runs `lowtide` in `cwd` against one store; returns (exit code, stdout + stderr)."""

    def __init__(self, cwd: Path, db: str):
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
        # A wide, plain terminal: rich would otherwise cut table cells to fit 80 columns.
        self.env.update(LOWTIDE_DB=db, COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONIOENCODING="utf-8")

    def __call__(self, *args: str) -> tuple[int, str]:
        return self.many(args)[0]

    def many(self, *commands: tuple[str, ...]) -> list[tuple[int, str]]:
        """Run the commands side by side (for ones that do not depend on each other)."""
        procs = [
            subprocess.Popen(
                [str(LOWTIDE), *args], cwd=self.cwd, env=self.env, text=True, encoding="utf-8",
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            for args in commands
        ]
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            results.append((proc.returncode, out))
        return results


@pytest.fixture
def cli(tmp_path) -> Cli:
    return Cli(tmp_path, str(tmp_path / "lowtide.db"))


def write_job(folder: Path, rows: int = 6, **extra: Any) -> Path:
    """tickets.csv and job.yaml (relative paths: resolved against the spec's folder)."""
    write_csv(folder / "tickets.csv", ticket_rows(rows))
    spec = {
        "name": "tickets",
        "source": {"path": "tickets.csv", "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"},
        "model": "test-model",
        "route": "echo",
        "choices": LABELS,
        "params": {"max_tokens": 16},
        "retry": {"max_attempts": 2, "backoff_seconds": 0},
        **extra,
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def status_row(output: str, job: str = "tickets") -> dict[str, str]:
    """The job's row of the status table, by column name."""
    lines = output.splitlines()

    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"[│┃|]", line)[1:-1]]

    header = next(cells(x) for x in lines if re.search(r"[│┃|]\s*job\s*[│┃|]", x))
    row = next(cells(x) for x in lines if re.search(rf"[│┃|]\s*{re.escape(job)}\s*[│┃|]", x))
    return dict(zip(header, row, strict=True))


# --help ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    # In-process (same Typer app, same parsing): eight subprocesses would cost ~6 s.
    from typer.testing import CliRunner

    from lowtide.cli import app

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Example" in result.output
    assert f"lowtide {command}" in result.output


def test_top_level_help_lists_every_command(cli):
    code, out = cli("--help")
    assert code == 0, out
    assert all(command in out for command in COMMANDS)
    assert "--db" in out and "LOWTIDE_DB" in out


# run, status, exit codes ----------------------------------------------------------------


def test_run_twice_adds_nothing_and_exits_0(tmp_path, store):
    cli = Cli(tmp_path, store.location)  # the SQLite file, or the PostgreSQL schema
    spec = write_job(tmp_path)

    code, out = cli("run", "job.yaml", "--out", "first.csv")
    assert code == 0, out
    assert "6 new, 0 already stored" in out
    assert "results: first.csv (6 rows)" in out
    assert status_row(out)["succeeded"] == "6"  # the final table is printed

    code, out = cli("run", str(spec))  # an absolute path to the same spec
    assert code == 0, out
    assert "0 new, 6 already stored" in out
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one() == 6

    (code, out), (code_all, out_all) = cli.many(("status", "tickets"), ("status",))
    assert code == 0, out
    row = status_row(out)
    assert row["state"] == "finished" and row["route"] == "echo"
    assert (row["total"], row["succeeded"], row["failed"], row["in flight"]) == ("6", "6", "0", "0")
    assert "tokens:" in out and "over 6 attempts" in out
    assert "loaded: 6 new request(s) from tickets.csv (6 rows)" in out
    assert code_all == 0 and status_row(out_all)["total"] == "6"


def test_run_exits_1_when_the_job_finished_with_failures(cli, tmp_path):
    write_job(tmp_path, route_options={"reject": ["T1002"]})
    code, out = cli("run", "job.yaml")
    assert code == 1, out
    row = status_row(out)
    assert (row["state"], row["succeeded"], row["failed"]) == ("finished", "5", "1")
    commands = [("status", "tickets"), ("status", "nope"), ("results", "nope", "--out", "x.csv")]
    (code, out), *unknown = cli.many(*commands)
    assert code == 0
    assert "failures: invalid_request × 1" in out
    for args, (code, out) in zip(commands[1:], unknown, strict=True):
        assert code == 2, (args, out)  # an unknown job name is bad input
        assert 'lowtide: no job named "nope"; jobs in this store: tickets' in out
        assert "Traceback" not in out


def test_run_writes_the_results_in_the_specs_output_format(cli, tmp_path):
    write_job(tmp_path, output={"path": "results.data", "format": "jsonl"})
    code, out = cli("run", "job.yaml")
    assert code == 0, out
    lines = (tmp_path / "results.data").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and all(json.loads(line)["state"] == "succeeded" for line in lines)
    # An embedding job's vectors are named by extension: a format given beside them is refused.
    with pytest.raises(SpecError, match="output.format 'csv'.*remove output.format"):
        check_output(tmp_path / "vectors.npy", embedding=True, fmt="csv")


def test_retryable_failures_that_recover_still_exit_0(cli, tmp_path):
    write_job(tmp_path, route_options={"fail_attempts": {"T1003": 1}})
    code, out = cli("run", "job.yaml")
    assert code == 0, out
    assert status_row(out)["succeeded"] == "6"


def _jobs_in(db: Path) -> int:
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT COUNT(*) FROM jobs")).scalar_one()
    finally:
        engine.dispose()


def test_bad_spec_exits_2_with_a_message_and_no_traceback(cli, tmp_path):
    spec = write_job(tmp_path)
    text = spec.read_text(encoding="utf-8") + "retries: 3\n"
    spec.write_text(text, encoding="utf-8")
    line = len(text.splitlines())
    for code, out in cli.many(("run", "job.yaml"), ("submit", "job.yaml")):
        assert code == 2, out
        assert "Traceback" not in out
        assert out.startswith("lowtide: job.yaml: invalid job spec")
        assert f"job.yaml line {line}: unknown key `retries`; known keys here:" in out
    assert _jobs_in(tmp_path / "lowtide.db") == 0


def test_bad_rows_exit_2_and_name_the_rows(cli, tmp_path):
    write_job(tmp_path)
    rows = ticket_rows(6)
    rows[1]["body"] = ""
    rows[4]["ticket_id"] = ""
    write_csv(tmp_path / "tickets.csv", rows)
    code, out = cli("run", "job.yaml")
    assert code == 2, out
    assert "refused, nothing was stored: 2 problem(s)" in out
    assert 'tickets.csv row 2 (line 3): column "body" is empty' in out
    assert "job.yaml template.user line 1" in out  # the template is named after the spec file
    assert 'tickets.csv row 5 (line 6): id column "ticket_id" is empty' in out
    assert _jobs_in(tmp_path / "lowtide.db") == 0


def test_unknown_route_and_missing_spec_exit_2(cli, tmp_path):
    write_job(tmp_path, route="echoo")
    (code, out), (code_missing, out_missing) = cli.many(("run", "job.yaml"), ("submit", "nope.yaml"))
    assert code == 2, out
    assert f'unknown route "echoo"; known routes: {", ".join(known_routes())}' in out  # every registered route
    assert code_missing == 2
    assert "nope.yaml: cannot read the job spec" in out_missing


# submit, worker, tick, results ----------------------------------------------------------


@pytest.mark.postgres
def test_a_stores_password_given_as_a_query_parameter_is_never_printed(tmp_path, pg_schema_url):
    """libpq (and psycopg) take `?password=` as well as `user:password@`: submit's line says
    where the job is stored with it masked, as status does when the store cannot be opened."""
    write_job(tmp_path, rows=2)
    cli = Cli(tmp_path, f"{pg_schema_url}&password=S3CRETPW")  # trust auth: accepted and unused
    code, out = cli("submit", "job.yaml")
    assert code == 0 and f'job "tickets" stored in {pg_schema_url}&password=***' in out, out
    code, out = cli("--db", "postgresql://app@127.0.0.1:1/test?password=S3CRETPW", "status")
    assert code == 3 and "cannot open the store at postgresql+psycopg://app@127.0.0.1:1/test?password=***:" in out, out
    assert "S3CRETPW" not in out


def test_submit_then_worker_then_results_with_accuracy(cli, tmp_path):
    write_job(tmp_path, rows=10)
    code, out = cli("submit", "job.yaml")
    assert code == 0, out
    assert "10 new, 0 already stored" in out and 'job "tickets" stored in' in out
    code, out = cli("status", "tickets")
    row = status_row(out)
    # Stored, not sent: queued, never "in flight" (nothing has left).
    assert (row["state"], row["queued"], row["in flight"], row["succeeded"]) == ("active", "10", "0", "0")

    code, out = cli("worker", "--until-idle")
    assert code == 0, out

    (code, out), (code_bad, out_bad), (code_status, out_status) = cli.many(
        ("results", "tickets", "--out", "x.csv", "--compare", "gold"),
        ("results", "tickets", "-o", "y.csv", "--compare", "glod"),
        ("status", "tickets"),
    )
    row = status_row(out_status)
    assert (row["state"], row["succeeded"], row["in flight"]) == ("finished", "10", "0")
    assert code == 0, out
    assert "wrote 10 rows to x.csv (10 succeeded)" in out
    assert re.search(r"accuracy against gold \(test-model on\s+echo\)", out), out
    assert re.search(r"all\s*[│|]\s*10\s*[│|]\s*10\s*[│|]\s*100\.0%", out), out
    assert re.search(r"billing\s*[│|]\s*2\s*[│|]\s*2\s*[│|]\s*100%", out), out
    assert "chance level with 5 choices: 20%" in out
    with (tmp_path / "x.csv").open(encoding="utf-8", newline="") as f:
        out_rows = list(csv.DictReader(f))
    assert [r["ticket_id"] for r in out_rows] == [r["ticket_id"] for r in ticket_rows(10)]
    assert all(r["output"] == r["gold"] for r in out_rows)

    assert code_bad == 2, out_bad
    assert '--compare: no column "glod" in the results' in out_bad


def test_tick_runs_one_pass(cli, tmp_path):
    write_job(tmp_path)
    assert cli("submit", "job.yaml")[0] == 0
    cli.env["COLUMNS"] = "80"  # a cron log: the line stays whole however narrow
    code, out = cli("tick", "--job", "tickets")
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("planned"))
    assert "6 succeeded, 0 to retry, 0 failed" in line and "finished: tickets" in line, out


# retry, cancel --------------------------------------------------------------------------


def test_retry_failed_requeues_them(cli, tmp_path):
    write_job(tmp_path, route_options={"reject": ["T1001", "T1004"]})
    assert cli("run", "job.yaml")[0] == 1

    code, out = cli("retry", "tickets")
    assert code == 2 and "--failed, --cancelled, or both" in out

    code, out = cli("retry", "tickets", "--failed")
    assert code == 0, out
    assert "queued 2 request(s) of tickets again" in out
    row = status_row(cli("status", "tickets")[1])
    # Queued again, not sent yet: never counted in flight.
    assert (row["state"], row["failed"], row["queued"], row["in flight"], row["succeeded"]) == ("active", "0", "2", "0", "4")

    # The route no longer rejects them: re-submit the fixed spec (no new rows) and work.
    write_job(tmp_path)
    code, out = cli("submit", "job.yaml")
    assert code == 0 and "0 new, 6 already stored" in out
    code, out = cli("worker", "--until-idle", "--verbose")
    assert code == 0 and "2 succeeded" in out and "finished: tickets" in out
    row = status_row(cli("status", "tickets")[1])
    assert (row["state"], row["succeeded"], row["failed"]) == ("finished", "6", "0")


def test_cancel_pending_requests(cli, tmp_path):
    write_job(tmp_path)
    assert cli("submit", "job.yaml")[0] == 0
    code, out = cli("cancel", "tickets")
    assert code == 0, out
    assert "cancelled tickets: 6 unsent request(s) cancelled" in out
    code, out = cli("status", "tickets")
    row = status_row(out)
    assert (row["state"], row["cancelled"], row["in flight"], row["succeeded"]) == ("cancelled", "6", "0", "0")
    assert "cancelled: 6 request(s) cancelled by the user" in out

    # --cancelled brings them back.
    code, out = cli("retry", "tickets", "--cancelled")
    assert code == 0 and "queued 6 request(s)" in out
    assert cli("worker", "--until-idle")[0] == 0
    assert status_row(cli("status", "tickets")[1])["succeeded"] == "6"


def test_cancel_with_every_request_in_a_batch_in_flight_says_so(cli, tmp_path):
    """No request is unsent: the job is cancelled all the same and its batch asked to stop,
    not "nothing to cancel"."""
    write_job(tmp_path, route="echo-batch", route_options={"dir": str(tmp_path / "provider"), "polls_to_complete": 50})
    assert cli("submit", "job.yaml")[0] == 0
    assert cli("tick")[0] == 0  # plan and submit: all 6 in one batch
    code, out = cli("cancel", "tickets")
    assert code == 0, out
    assert "cancelled tickets: 0 unsent request(s) cancelled; 6 request(s) in 1 live batch(es), asked to stop" in out
    assert status_row(cli("status", "tickets")[1])["state"] == "cancelled"
    # Cancelled already, but its batch is still live: say so, never "nothing to cancel".
    code, out = cli("cancel", "tickets")
    assert code == 0 and "tickets is cancelled already; 6 request(s) in 1 live batch(es), asked to stop" in out, out
    assert "nothing to cancel" not in out


def test_cancel_a_finished_job_is_a_clean_no_op(cli, tmp_path):
    write_job(tmp_path)
    assert cli("run", "job.yaml")[0] == 0
    code, out = cli("cancel", "tickets")
    assert "Traceback" not in out
    assert code in (0, 2)


def test_results_compare_with_an_unknown_column_in_jsonl_exits_2(cli, tmp_path):
    write_job(tmp_path)
    assert cli("run", "job.yaml")[0] == 0
    code, out = cli("results", "tickets", "-o", "y.jsonl", "--compare", "glod")
    assert code == 2, out
    assert 'no column "glod"' in out


def test_the_command_list_says_each_command_whole_at_80_columns(monkeypatch, capsys):
    """Click cuts a docstring's first sentence to fit (`Submit a job and drive it to...`):
    every command has its own summary, and none is cut at 80 columns."""
    from lowtide.cli import main  # noqa: PLC0415
    from lowtide.cli.helptext import SUMMARIES  # noqa: PLC0415

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out.split("Commands:")[1].strip().splitlines()
    assert {line.split()[0] for line in listed} == set(SUMMARIES), "each command needs a summary in cli/helptext.py"
    for line in listed:
        assert "..." not in line and len(line) <= 80, line


def test_read_only_commands_open_a_store_given_as_a_sqlite_url(tmp_path):
    # `run` took `sqlite:////abs/path.db`; every read-only command said "no store at sqlite:/abs/…"
    # because it checked the URL's text as a file path.
    db = tmp_path / "stores" / "nightly.db"
    db.parent.mkdir()
    cli = Cli(tmp_path, f"sqlite:///{db}")
    write_job(tmp_path)
    code, out = cli("run", "job.yaml", "--out", "first.csv")
    assert code == 0, out
    assert db.exists()
    for args in (("status", "tickets"), ("results", "tickets", "--out", "again.csv"), ("report",), ("cancel", "tickets")):
        code, out = cli(*args)
        assert "no store at" not in out, (args, out)
        assert code in (0, 1), (args, out)  # cancel of a finished job may say there is nothing left to cancel
    assert (tmp_path / "again.csv").exists()


def test_a_sqlite_url_to_a_missing_file_names_the_file(tmp_path):
    code, out = Cli(tmp_path, f"sqlite:///{tmp_path}/absent.db")("results", "tickets", "--out", "x.csv")
    assert code != 0 and f"no store at {tmp_path}/absent.db:" in out, out
