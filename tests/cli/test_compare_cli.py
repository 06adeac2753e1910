"""`lowtide run` of an eval spec and `lowtide compare`: the table, --json, --out CSV/Parquet,
an unknown eval, exit codes."""

from __future__ import annotations

import json

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import yaml
from typer.testing import CliRunner

from lowtide.cli import app
from tests.conftest import ticket_rows, write_csv


def _run_eval(tmp_path, monkeypatch) -> tuple[CliRunner, str]:
    monkeypatch.setenv("LOWTIDE_DB", str(tmp_path / "s.db"))
    monkeypatch.setenv("COLUMNS", "200")
    write_csv(tmp_path / "t.csv", ticket_rows(10))
    spec = {
        "name": "cli-ev", "source": {"path": "t.csv", "id_column": "ticket_id"}, "template": {"system": "Sort it."},
        "choices": ["billing", "technical", "account", "shipping", "feedback"], "params": {"max_tokens": 8},
        "variants": {"models": [{"name": "e", "model": "echo-model", "route": "echo"}],
                     "prompts": [{"name": "right", "user": "Ticket: {{ body }}"}, {"name": "wrong", "user": "technical or {{ body }}"}]},
        "scoring": {"method": "choice", "expected": "gold"},
    }  # fmt: skip
    (tmp_path / "ev.yaml").write_text(yaml.safe_dump(spec))
    runner = CliRunner()
    ran = runner.invoke(app, ["run", str(tmp_path / "ev.yaml")])
    assert ran.exit_code == 0, ran.output
    return runner, ran.output


def test_run_an_eval_spec_then_compare(tmp_path, monkeypatch):
    runner, output = _run_eval(tmp_path, monkeypatch)
    assert "e-right" in output and "100.0%" in output and "McNemar" in output
    shown = runner.invoke(app, ["compare", "cli-ev", "--json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert [(v["variant"], v["scored"], v["correct"]) for v in report["variants"]] == [("e-right", 10, 10), ("e-wrong", 10, 2)]
    assert report["pairs"][0]["a_only"] == 8 and report["confusion"]["e-wrong"]["billing"] == {"technical": 2}
    for name, read in (("r.csv", pcsv.read_csv), ("r.parquet", pq.read_table)):
        wrote = runner.invoke(app, ["compare", "cli-ev", "--out", str(tmp_path / name)])
        assert wrote.exit_code == 0, wrote.output
        table = read(tmp_path / name).to_pylist()
        assert [(r["variant"], r["accuracy"]) for r in table] == [("e-right", 1.0), ("e-wrong", 0.2)]
    assert runner.invoke(app, ["compare", "cli-ev", "--out", str(tmp_path / "r.txt")]).exit_code == 2
    monkeypatch.setenv("COLUMNS", "80")  # a log or a small terminal: every figure shown is whole
    narrow = runner.invoke(app, ["compare", "cli-ev"])
    assert narrow.exit_code == 0, narrow.output
    assert all(len(line) <= 80 for line in narrow.output.splitlines()), narrow.output
    assert "100.0%" in narrow.output and "0.00781" in narrow.output and "20.0%" in narrow.output and "not shown at 80 columns" in narrow.output
    missing = runner.invoke(app, ["compare", "nope"])
    assert missing.exit_code != 0 and 'no eval named "nope"' in missing.output and "cli-ev" in missing.output
    assert "failed" in narrow.output.splitlines()[1] + narrow.output.splitlines()[2], narrow.output  # never left out


def test_results_of_an_eval_is_one_long_table_with_variant_and_verdict(tmp_path, monkeypatch):
    # `lowtide results EVAL` was refused ("no job named"): an eval's answers had no one table.
    runner, _ = _run_eval(tmp_path, monkeypatch)
    for name, read in (("long.parquet", pq.read_table), ("long.csv", pcsv.read_csv)):
        wrote = runner.invoke(app, ["results", "cli-ev", "--out", str(tmp_path / name)])
        assert wrote.exit_code == 0, wrote.output
        rows = read(tmp_path / name).to_pylist()
        assert len(rows) == 20 and {r["variant"] for r in rows} == {"e-right", "e-wrong"}
        verdicts = {(r["variant"], r["ticket_id"]): r["correct"] for r in rows}
        assert sum(v is True for (variant, _), v in verdicts.items() if variant == "e-right") == 10
        assert sorted(v for (variant, _), v in verdicts.items() if variant == "e-wrong").count(True) == 2
        assert all(r["state"] == "succeeded" and r["output"] for r in rows)
    refused = runner.invoke(app, ["results", "cli-ev", "--out", str(tmp_path / "x.csv"), "--compare", "gold"])
    assert refused.exit_code != 0 and "lowtide compare" in refused.output


def test_a_pair_with_no_row_scored_by_both_has_no_p_value_and_small_costs_show_their_digits():
    from lowtide.cli.evals import _usd
    from lowtide.engine.compare import _pair

    assert _pair("a", "b", {"1": True}, {"2": False}).p_value is None  # was 1: a test of nothing
    assert _usd(0.0000123) == "$0.000012" and _usd(3e-9) == "$3e-09" and _usd(0.5) == "$0.5000" and _usd(0) == "$0.0000"
