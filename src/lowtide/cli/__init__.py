"""The `lowtide` command: one module per noun, each imported when its command runs
(cli/commands.py)."""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer
from typer.exceptions import TyperException

from lowtide import __version__
from lowtide.cli import _lean  # noqa: F401  (first: what no command uses stays unimported)
from lowtide.cli.argv import hoist_global_options
from lowtide.cli.commands import LazyGroup, own_options
from lowtide.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    known_failure,
    say_error,
    state,
)
from lowtide.cli.helptext import tidy
from lowtide.core.runtime import tune_gc

app = typer.Typer(
    name="lowtide",
    cls=LazyGroup,
    help="Turn LLM work that can wait into cheap, reliable offline jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: wraps to any width, no `<bool>` beside flags
)


def _version(value: bool) -> None:
    if value:
        print(f"lowtide {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="LOWTIDE_DB",
            help="The store: a SQLite file (default ./lowtide.db) or a PostgreSQL URL.",
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", envvar="LOWTIDE_DEBUG", help="Show the traceback of an unexpected error.")
    ] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    state.db = db
    state.debug = debug
    tune_gc()  # this process is lowtide's own: collect garbage less often (core/runtime.py)


def main(argv: list[str] | None = None) -> None:
    """Run the command line; every way out is one of the README's exit codes."""
    command = typer.main.get_command(app)
    tidy(command)
    args = hoist_global_options(list(sys.argv[1:] if argv is None else argv), own_options)
    debug = "--debug" in args or state.debug
    try:
        code = command.main(args=args, prog_name="lowtide", standalone_mode=False)
    except TyperException as err:  # bad usage: click's own message (Typer's vendored click), exit 2
        ctx = getattr(err, "ctx", None)
        hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
        print(f"lowtide: {err.format_message().rstrip('.')}{hint}", file=sys.stderr)
        code = EXIT_USAGE if getattr(err, "exit_code", 2) in (1, 2) else err.exit_code
    except typer.Abort:  # Ctrl-C outside a command that handles it
        print("lowtide: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except Exception as err:
        if debug or state.debug:
            traceback.print_exc()
        elif (known := known_failure(err)) is not None:
            say_error(known)
        else:
            line = (str(err).strip().splitlines() or [""])[0][:300]
            print(f"lowtide: unexpected error: {type(err).__name__}: {line} (run again with --debug for the traceback)", file=sys.stderr)
        code = EXIT_ERROR
    sys.exit(code if isinstance(code, int) else 0)

