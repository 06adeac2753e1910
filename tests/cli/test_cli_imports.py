"""What a `lowtide` command imports before it does its work: only its own module and what that
needs (cli/commands.py). Checked by module names in a fresh interpreter, never by the clock:
`lowtide compare` pays for no engine run, server or progress display, nor for the openai
SDK (the stored eval's specs are not checked against its types again); `lowtide run` for no
scoring (numpy) and no server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lowtide.cli.commands import COMMANDS

HEAVY = ("fastapi", "uvicorn", "pyarrow", "numpy")
OTHER_COMMANDS = sorted({f"lowtide.cli.{target.split(':')[0]}" for target in COMMANDS.values()})


def imported_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_command_line_imports_no_command_until_one_runs():
    loaded = imported_after("import lowtide.cli")
    assert loaded.isdisjoint(OTHER_COMMANDS), sorted(loaded & set(OTHER_COMMANDS))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_compare_imports_no_run_path_server_or_other_command():
    loaded = imported_after("from lowtide.cli.commands import load_command\nload_command('compare')")
    others = set(OTHER_COMMANDS) - {"lowtide.cli.evals", "lowtide.cli.tables"}
    assert loaded.isdisjoint(others), sorted(loaded & others)
    shunned = {"fastapi", "uvicorn", "pyarrow", "lowtide.server", "lowtide.cli.display", "pygments"}  # pygments: httpx's CLI
    assert loaded.isdisjoint(shunned), sorted(loaded & shunned)


def test_compare_of_a_stored_eval_imports_no_provider_sdk(tmp_path, monkeypatch):
    # An eval with params (max_tokens), as most have: rebuilding its member specs from the
    # store used to check them against the openai SDK's types, importing the whole package.
    from tests.cli.test_compare_cli import _run_eval

    _run_eval(tmp_path, monkeypatch)  # sets LOWTIDE_DB, which the fresh interpreter inherits
    code = ("from lowtide.cli import main\ntry:\n    main(['compare', 'cli-ev', '--json'])\n"
            "except SystemExit as done:\n    assert not done.code, done.code")  # fmt: skip
    loaded = imported_after(code)
    assert "lowtide.engine.compare" in loaded  # the report was made
    sdks = {m for m in loaded if m.split(".")[0] in ("openai", "anthropic", "google")}
    assert not sdks, sorted(sdks)[:10]
    assert loaded.isdisjoint({"lowtide.engine.tick", "lowtide.engine.runner"}), sorted(loaded & {"lowtide.engine.tick", "lowtide.engine.runner"})


@pytest.mark.parametrize("argv", [["status", "tickets"], ["results", "tickets", "--out", "r.csv"], ["worker", "--until-idle"]])
def test_commands_that_read_a_stored_job_import_no_provider_sdk(argv, tmp_path, monkeypatch, clock):
    # A job with params (max_tokens), as nearly all have: reading its spec back from the store
    # checked them against the openai SDK's types again, importing the whole package (0.7 s of
    # CPU a command). A job on echo sends nothing that needs an SDK either.
    from lowtide.engine.loader import load_job
    from lowtide.store.db import Store
    from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

    spec = make_spec(write_csv(tmp_path / "tickets.csv", ticket_rows(4)))
    with Store(str(tmp_path / "lowtide.db")) as store:
        if argv[0] == "worker":
            load_job(store, spec, clock)
        else:
            drive_to_end(store, spec, clock)
    monkeypatch.setenv("LOWTIDE_DB", str(tmp_path / "lowtide.db"))
    monkeypatch.chdir(tmp_path)
    code = (f"from lowtide.cli import main\ntry:\n    main({argv!r})\n"
            "except SystemExit as done:\n    assert not done.code, done.code")  # fmt: skip
    loaded = imported_after(code)
    assert "lowtide.core.spec" in loaded  # the stored spec was read
    sdks = {m for m in loaded if m.split(".")[0] in ("openai", "anthropic", "google")}
    assert not sdks, sorted(sdks)[:10]


@pytest.mark.parametrize("command", ["run", "status", "results"])
def test_job_commands_import_no_scoring_or_server(command):
    loaded = imported_after(f"from lowtide.cli.commands import load_command\nload_command({command!r})")
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))
    assert "lowtide.engine.compare" not in loaded and "lowtide.server" not in loaded


def test_help_lists_every_command(capsys):
    from lowtide.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    section = capsys.readouterr().out.split("Commands:", 1)[1]
    listed = [line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()]
    assert listed == list(COMMANDS)


def test_a_mistyped_command_is_answered_with_the_closest_names(capsys):
    # Typer looks for them among the commands already imported: here, none yet.
    from lowtide.cli import main

    with pytest.raises(SystemExit) as done:
        main(["statu"])
    assert done.value.code == 2
    assert "No such command 'statu'. Did you mean 'status'" in capsys.readouterr().err
