"""`lowtide run` / `submit` over a job already stored (issue 15 items 3 and 10): the real
command, as a subprocess, against a store in tmp_path."""

from __future__ import annotations

import csv

import pytest
import yaml

from tests.cli.test_cli import Cli, pytestmark, write_job  # noqa: F401  (pytestmark: skip without the script)
from tests.conftest import ticket_rows, write_csv


@pytest.fixture
def cli(tmp_path) -> Cli:
    return Cli(tmp_path, str(tmp_path / "lowtide.db"))


def _edit_spec(path, **changes) -> None:
    spec = yaml.safe_load(path.read_text(encoding="utf-8")) | changes
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")


def test_a_model_change_exits_2_naming_the_fix_then_requeue_changed_reruns(cli, tmp_path):
    spec = write_job(tmp_path)
    assert cli("run", "job.yaml")[0] == 0
    _edit_spec(spec, model="other-model")
    code, out = cli("submit", "job.yaml")
    assert code == 2, out
    assert 'job "tickets" was stored with model test-model; this spec says other-model' in out
    assert "pass --requeue-changed" in out and "Traceback" not in out
    code, out = cli("run", "job.yaml", "--requeue-changed")
    assert code == 0, out
    assert "6 row(s) changed since they were stored: re-queued 6" in out


def test_a_changed_row_is_reported_and_kept_and_a_budget_change_applied(cli, tmp_path):
    spec = write_job(tmp_path)
    assert cli("run", "job.yaml")[0] == 0
    rows = ticket_rows(6)
    rows[1]["body"] = "something else entirely"
    write_csv(tmp_path / "tickets.csv", rows)
    _edit_spec(spec, budget_usd=3)
    code, out = cli("run", "job.yaml", "--out", "out.csv")
    assert code == 0, out
    assert "spec change applied: budget_usd (none) → 3" in out
    assert "1 row(s) changed since they were stored: kept, with their earlier answers (pass --requeue-changed to re-run them)" in out
    with (tmp_path / "out.csv").open(encoding="utf-8") as f:
        changed = {r["ticket_id"]: r["source_changed"] for r in csv.DictReader(f)}
    assert changed["T1001"] == "True" and {v for k, v in changed.items() if k != "T1001"} == {"False"}


def test_a_source_without_rows_exits_2(cli, tmp_path):
    write_job(tmp_path)
    (tmp_path / "tickets.csv").write_text("ticket_id,channel,body,gold\n", encoding="utf-8")
    code, out = cli("run", "job.yaml")
    assert code == 2, out
    assert "tickets.csv has no rows; nothing was stored" in out and "Traceback" not in out
