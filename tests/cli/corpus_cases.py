"""The bad-input corpus: each case is a folder of files, a command line and the exit code the
README gives; corpus_messages.py holds the exact message of each (`{tmp}`: the case's folder).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

JOB = """name: tickets
source: {{path: {source}, id_column: id}}
template: {{user: "Ticket: {{{{ body }}}}"}}
model: test-model
route: echo
choices: [billing, technical]
params: {{max_tokens: 4}}
{extra}"""

CSV = "id,body\n1,billing problem\n2,technical issue\n3,billing again\n"


def job(source: str = "t.csv", extra: str = "") -> str:
    return JOB.format(source=source, extra=extra)


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    code: int
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: str | None = None  # a named extra step (see `prepare`)


def prepare(case: Case, folder: Path) -> None:
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    if case.setup == "foreign_db":
        with sqlite3.connect(folder / "other.db") as conn:
            conn.execute("create table customers (id integer)")
    if case.setup == "folder_db":
        (folder / "store.d").mkdir()


BASE = {"t.csv": CSV, "job.yaml": job()}

CASES = [
    # The store: missing, not a database, someone else's; --db in any position.
    Case("status-job-no-store", ["status", "tickets"], 3),
    Case("results-no-store", ["results", "tickets", "--out", "r.csv"], 3),
    Case("report-no-store", ["report"], 3),
    Case("cancel-no-store", ["cancel", "tickets"], 3),
    Case("retry-no-store", ["retry", "tickets", "--failed"], 3),
    Case("gateway-status-no-store", ["gateway-status"], 3),
    Case("db-not-a-database", ["--db", "notes.txt", "status"], 3,
         files={"notes.txt": "just some notes, not SQLite\n" * 20}),
    Case("db-after-the-command", ["status", "--db", "notes.txt"], 3,
         files={"notes.txt": "just some notes, not SQLite\n" * 20}),
    Case("db-equals-after-the-argument", ["status", "tickets", "--db=notes.txt"], 3,
         files={"notes.txt": "just some notes, not SQLite\n" * 20}),
    Case("db-is-a-folder", ["--db", "store.d", "status"], 3, setup="folder_db"),
    Case("db-someone-elses", ["submit", "job.yaml", "--db", "other.db"], 3,
         files=BASE, setup="foreign_db"),
    Case("db-postgres-unreachable", ["--db", "postgresql://nobody@127.0.0.1:9/none", "status"], 3),
    Case("db-postgres-password-in-query", ["--db", "postgresql://nobody@127.0.0.1:9/none?password=S3CRETPW", "status"], 3),
    # The spec.
    Case("spec-missing", ["run", "nope.yaml"], 2),
    Case("spec-not-yaml", ["run", "job.yaml"], 2, files={"job.yaml": "name: [unclosed\n"}),
    Case("spec-unknown-key", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job(extra="colour: blue\n")}),
    Case("spec-no-name", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job().replace("name: tickets\n", "")}),
    Case("spec-unknown-route", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job().replace("route: echo", "route: carrier-pigeon")}),
    Case("spec-unknown-param", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job().replace("max_tokens: 4", "max_tokens: 4, warp: 9")}),
    Case("output-url-password-in-query", ["run", "job.yaml"], 2,
         files={"t.csv": CSV, "job.yaml": job(extra='output: {url: "postgresql://etl@db.internal/w?password=S3CRETPW", table: results}\n')}),
    Case("output-unknown-extension", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job(extra="output: {path: out.txt2}\n")}),
    Case("output-in-proc", ["run", "job.yaml", "--out", "/proc/x.csv"], 2, files={"t.csv": CSV, "job.yaml": job()}),
    Case("output-under-a-file", ["run", "job.yaml", "--out", "t.csv/r.csv"], 2, files=BASE),
    Case("output-is-a-folder", ["run", "job.yaml", "--out", "outdir"], 2, files={**BASE, "outdir/keep": ""}),
    Case("budget-unknown-price", ["run", "job.yaml"], 2,
         files={"t.csv": CSV, "job.yaml": job(extra="budget_usd: 5\n").replace("route: echo", 'route: openai-compatible\nroute_options: {base_url: "http://127.0.0.1:9/v1"}')}),
    Case("results-bad-extension", ["results", "tickets", "--out", "r.txt"], 2, files=BASE),
    # The source.
    Case("source-missing", ["run", "job.yaml"], 2, files={"job.yaml": job()}),
    Case("source-folder-without-data-files", ["run", "job.yaml"], 2, files={"job.yaml": job(source="data"), "data/x": ""}),
    Case("source-unknown-extension", ["run", "job.yaml"], 2, files={"job.yaml": job(source="t.xlsx"), "t.xlsx": "x"}),
    Case("source-no-id-column", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "key,body\n1,a\n"}),
    Case("source-template-column-missing", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "id,text\n1,a\n"}),
    Case("source-empty-file", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": ""}),
    Case("source-header-only", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "id,body\n"}),
    Case("source-repeated-header", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "id,body,body\n1,a,b\n"}),
    Case("source-not-utf8", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": b"id,body\n1,caf\xe9\n"}),
    Case("source-csv-widths-all-listed", ["run", "job.yaml"], 2,
         files={"job.yaml": job(), "t.csv": "id,body\n1,a\n2,b,extra\n3,c\n4\n5,d,e,f\n"}),
    Case("source-jsonl-all-listed", ["run", "job.yaml"], 2,
         files={"job.yaml": job(source="t.jsonl"), "t.jsonl": '{"id": 1, "body": "a"}\n{"id": 2, "body":\n[1, 2]\n{"id": 4, "body": "d"}\n"text"\n'}),
    Case("source-duplicate-ids", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "id,body\n1,a\n1,b\n2,c\n"}),
    Case("source-empty-cell", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "id,body\n1,a\n2,\n"}),
    Case("source-empty-id", ["run", "job.yaml"], 2, files={"job.yaml": job(), "t.csv": "id,body\n,a\n2,b\n"}),
    # Usage.
    Case("retry-says-what", ["retry", "tickets"], 2),
    Case("report-since-not-a-date", ["report", "--since", "last tuesday"], 2),
    Case("status-unknown-job", ["status", "nope"], 2, files=BASE, setup="submitted"),
    Case("cancel-unknown-job", ["cancel", "nope"], 2, files=BASE, setup="submitted"),
    Case("results-compare-missing-column", ["results", "tickets", "--out", "r.csv", "--compare", "gold"], 2, files=BASE, setup="ran"),
    Case("results-npy-of-answers", ["results", "tickets", "--out", "r.npy"], 2, files=BASE, setup="ran"),
    Case("unknown-command", ["frobnicate"], 2),
    Case("run-without-spec", ["run"], 2),
    Case("estimate-sample-zero", ["estimate", "job.yaml", "--sample", "0"], 2, files=BASE),
    Case("serve-tiny-request-size", ["serve", "--max-request-size", "1"], 2),
    Case("serve-option-without-equals", ["serve", "--option", "slots"], 2),
    Case("worker-ray-route-without-ray", ["worker", "--ray-route", "local"], 2),
    # What lowtide checks, it asks for: an answer is a choice or JSON, not both.
    Case("spec-choices-and-schema", ["run", "job.yaml"], 2,
         files={"t.csv": CSV, "job.yaml": job(extra="response_schema: {type: object}\n")}),
    # Silently accepted before (issue 31): each is refused before anything is stored or sent.
    # (api_key_env: HOME, a variable every machine has: the key is not what these are about.)
    Case("spec-deadline-offset-past-a-day", ["run", "job.yaml"], 2,
         files={"t.csv": CSV, "job.yaml": job(extra="deadline: 2026-12-05T10:00:00+25:00\n")}),
    Case("spec-model-empty", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job().replace("model: test-model", 'model: ""')}),
    Case("spec-model-typo", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job().replace(
         "model: test-model\nroute: echo", 'model: gpt-4o-mni\nroute: openai-batch\nroute_options: {base_url: "http://127.0.0.1:9/v1", api_key_env: HOME}')}),
    Case("spec-max-tokens-past-the-context", ["run", "job.yaml"], 2, files={"t.csv": CSV, "job.yaml": job().replace(
         "model: test-model\nroute: echo", 'model: gpt-4o-mini\nroute: openai-batch\nroute_options: {base_url: "http://127.0.0.1:9/v1", api_key_env: HOME}'
         ).replace("max_tokens: 4", "max_tokens: 10000000")}),
    Case("source-json-object-id", ["run", "job.yaml"], 2,
         files={"job.yaml": job(source="t.jsonl"), "t.jsonl": '{"id": {"n": 1}, "body": "a"}\n{"id": 2, "body": "b"}\n'}),
]  # fmt: skip
