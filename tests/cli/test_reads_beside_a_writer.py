"""The commands that only read the store answer while another process writes it.

On SQLite a writer holds the store's one write lock for its whole transaction, and a load of
a nightly job is one transaction (nothing is stored unless every row is good): minutes at a
few million rows. A command that only reads must not queue for that lock. It did: `status`,
`results`, `report` and `gateway-status` each began a writing transaction (BEGIN IMMEDIATE),
so each waited for the writer, and after the store's 60 s busy timeout failed with "database
is locked"; and while they read, they held up the writer in turn.
"""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import time

from tests.cli.test_cli import LOWTIDE, cli, status_row, write_job  # noqa: F401  (cli: the fixture)

# Far under the store's busy timeout (60 s): a command that waits for the writer fails here.
PATIENCE = 30


def side_by_side(cli, *commands: tuple[str, ...]) -> list[tuple[int, str]]:  # noqa: F811
    procs = [
        subprocess.Popen([str(LOWTIDE), *args], cwd=cli.cwd, env=cli.env, text=True, encoding="utf-8",
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        for args in commands
    ]
    out = []
    deadline = time.monotonic() + PATIENCE  # for them all: they run side by side
    try:
        for args, proc in zip(commands, procs, strict=True):
            try:
                text, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                text = f"`lowtide {' '.join(args)}` still waiting after {PATIENCE} s: it queued behind the writer"
            out.append((proc.returncode, text))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return out


def test_read_commands_answer_while_another_process_holds_the_write_lock(cli, tmp_path):  # noqa: F811
    write_job(tmp_path, rows=5)
    code, out = cli("run", "job.yaml")
    assert code == 0, out
    writer = sqlite3.connect(tmp_path / "lowtide.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # as a load, a delete or a prune holds it
        writer.execute("UPDATE requests SET output = 'not committed'")
        answers = side_by_side(
            cli, ("status",), ("status", "tickets"), ("status", "--json"), ("results", "tickets", "-o", "r.csv"),
            ("report", "--json"), ("gateway-status", "--json"),
        )  # fmt: skip
        assert [text for code, text in answers if code != 0] == []
        (_, table), (_, one), (_, as_json), _, (_, report), _ = answers
        assert status_row(table)["state"] == status_row(one)["state"] == "finished"
        assert json.loads(as_json)["jobs"][0]["requests"]["succeeded"] == 5
        assert json.loads(report)["total"]["attempts"] == 5
        with (tmp_path / "r.csv").open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 5 and "not committed" not in {r["output"] for r in rows}  # what was committed
        writer.execute("COMMIT")  # the writer was never refused: the readers took no lock from it
    finally:
        writer.close()
