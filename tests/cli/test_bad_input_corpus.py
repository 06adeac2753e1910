"""Bad input, case by case: the exact message and the README's exit code, nothing stored.

Each case runs the real command line (`lowtide.cli.main`, in this process for speed: ~50
cases) in a folder of its own; corpus_cases.py says what is in the folder.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from lowtide.cli import main
from tests.cli.corpus_cases import CASES, Case, prepare
from tests.cli.corpus_messages import MESSAGES


def call(argv: list[str], cwd: Path) -> tuple[int, str]:
    """(exit code, stdout + stderr) of `lowtide ARGV` run in `cwd`."""
    old = os.getcwd()
    os.chdir(cwd)
    text = io.StringIO()
    try:
        with contextlib.redirect_stderr(text), contextlib.redirect_stdout(text):
            try:
                main(argv)
                code = 0
            except SystemExit as exit_:
                code = int(exit_.code or 0)
    finally:
        os.chdir(old)
    return code, text.getvalue()


def run_case(case: Case, folder: Path) -> tuple[int, str]:
    """The case's exit code and its error: from the first `lowtide:` line to the end."""
    prepare(case, folder)
    if case.setup in ("submitted", "ran"):
        code, text = call(["run" if case.setup == "ran" else "submit", "job.yaml"], folder)
        assert code == 0, text
    code, text = call(case.argv, folder)
    lines = text.replace(str(folder), "{tmp}").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("lowtide: ")), 0)
    return code, "\n".join(lines[start:]).strip()


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("LOWTIDE_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("COLUMNS", "200")


def test_the_corpus_is_big_enough_and_every_case_has_its_message():
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    assert set(MESSAGES) == {c.id for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_its_exact_message_and_exit_code(case: Case, tmp_path):
    code, message = run_case(case, tmp_path)
    assert (code, message) == (case.code, MESSAGES[case.id])
    assert "Traceback" not in message
    if case.argv[0] in ("run", "submit") and case.setup is None:
        # Refused before anything was stored: no request (and, for read-only refusals, no store).
        db = tmp_path / "lowtide.db"
        if db.exists():
            import sqlite3

            with sqlite3.connect(db) as conn:
                assert conn.execute("select count(*) from requests").fetchone() == (0,)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.code == 3 and c.argv[0] != "submit"], ids=lambda c: c.id
)
def test_read_only_commands_leave_no_store_behind(case: Case, tmp_path):
    run_case(case, tmp_path)
    assert not (tmp_path / "lowtide.db").exists()
