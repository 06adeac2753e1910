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


def test_run_an_eval_spec_then_compare(tmp_path, monkeypatch):
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
    assert "e-right" in ran.output and "100.0%" in ran.output and "McNemar" in ran.output
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
