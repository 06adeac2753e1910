"""The `lowtide` command: one module per noun, registered here."""

from __future__ import annotations

from typing import Annotated

import typer

from lowtide import __version__
from lowtide.cli import estimate, gateway, jobs, prices, report, serve, worker
from lowtide.cli.common import state
from lowtide.core.runtime import tune_gc

app = typer.Typer(
    name="lowtide",
    help="Turn LLM work that can wait into cheap, reliable offline jobs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    state.db = db
    tune_gc()  # this process is lowtide's own: collect garbage less often (core/runtime.py)


for command in (jobs.run, jobs.submit, estimate.estimate, prices.prices, jobs.status, jobs.results, jobs.cancel, jobs.retry, report.report, worker.tick, worker.worker, serve.serve):
    app.command()(command)
gateway.register(app)


def main() -> None:
    app()
