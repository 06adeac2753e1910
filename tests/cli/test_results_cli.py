"""`lowtide results`: the column set (existing columns first, in their places, then the
answer columns) and `--full`, through the installed command."""

from __future__ import annotations

import csv
import json

from tests.cli.test_cli import cli, write_job  # noqa: F401  (cli: the fixture)

COLUMNS = [
    "custom_id", "state", "output", "error", "input_tokens", "output_tokens", "attempts", "route", "source_changed",
    "finish_reason", "tool_calls", "refusal", "reasoning", "logprobs", "choices",
]  # fmt: skip


def test_results_columns_and_full(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, rows=4)
    code, out = cli("run", "job.yaml", "--out", "first.csv")
    assert code == 0, out
    (code, out), (code_full, out_full) = cli.many(
        ("results", "tickets", "-o", "r.csv"), ("results", "tickets", "-o", "r.jsonl", "--full")
    )
    assert code == 0 and code_full == 0, out + out_full
    with (tmp_path / "r.csv").open(encoding="utf-8", newline="") as f:
        header = next(csv.reader(f))
    assert header == ["ticket_id", "channel", "body", "gold", *COLUMNS]
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4 and all(list(r)[-1] == "response" for r in rows)
    assert all(type(r["input_tokens"]) is int and r["state"] == "succeeded" for r in rows)
    code, out = cli("results", "--help")
    assert "--full" in out and "whole answer body" in " ".join(out.split())


def test_results_usage_mistakes_exit_2_like_any_usage_error(cli, tmp_path):  # noqa: F811
    # The README's codes: 2 for bad input or usage, 3 only when the store or a route failed.
    # These three exited 3.
    (tmp_path / "docs.csv").write_text("doc_id,text\n1,hello\n2,world\n", encoding="utf-8")
    (tmp_path / "vec.yaml").write_text(
        "name: vec\nsource: {path: docs.csv, id_column: doc_id}\nendpoint: embeddings\n"
        "template: {user: '{{ text }}'}\nmodel: text-embedding-3-small\nroute: echo\n",
        encoding="utf-8",
    )
    code, out = cli("run", "vec.yaml")
    assert code == 0, out
    (no_out, a), (csv_out, b), (bad_table, c) = cli.many(
        ("results", "vec"), ("results", "vec", "--out", "v.csv"),
        ("results", "vec", "--pg-url", "postgresql://127.0.0.1/none", "--pg-table", "a;b"),
    )  # fmt: skip
    assert no_out == 2 and "say where the results go: --out FILE" in a, a
    assert csv_out == 2 and "v.csv: an embedding job's results are written as .parquet, .jsonl, .npy" in b, b
    assert bad_table == 2 and "--pg-table 'a;b': use a plain table name" in c, c
