"""Which module holds each `lowtide` command, imported only when that command runs.

Importing every command module was most of a command's start-up (`lowtide compare` paid for
`lowtide run`'s engine, `lowtide serve`'s server and the estimator's pricing tables before it
read a row). The group below lists the commands from this table and imports a command's
module only when it is invoked, or when `--help` lists them all. The order is the help's.
"""

from __future__ import annotations

from difflib import get_close_matches
from functools import cache
from importlib import import_module
from typing import Any

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

# name -> "module:function" under lowtide.cli
COMMANDS = {
    "run": "jobs:run",
    "submit": "jobs:submit",
    "estimate": "estimate:estimate",
    "prices": "prices:prices",
    "routes": "routes:routes",
    "status": "jobs:status",
    "results": "jobs:results",
    "cancel": "jobs:cancel",
    "retry": "jobs:retry",
    "report": "report:report",
    "tick": "worker:tick",
    "worker": "worker:worker",
    "serve": "serve:serve",
    "compare": "evals:compare_command",
    "gateway": "gateway:gateway",
    "gateway-status": "gateway:gateway_status",
    "render": "render:render",
    "try": "trial:try_command",
    "dashboard": "dashboard:dashboard",
    "delete": "retention:delete",
    "prune": "retention:prune_command",
    "trace": "traces:trace",
}


@cache
def load_command(name: str) -> Any:
    """The click command `name`, built by Typer from its function (as `app.command` would),
    once per process."""
    from lowtide.cli.helptext import tidy

    module, _, attr = COMMANDS[name].partition(":")
    function = getattr(import_module(f"lowtide.cli.{module}"), attr)
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    one.command(name)(function)
    command = typer.main.get_group(one).commands[name]
    tidy(command)
    return command


class LazyGroup(TyperGroup):
    """A Typer group whose commands are imported on first use (`COMMANDS`)."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        try:
            return load_command(cmd_name)
        except KeyboardInterrupt:  # Ctrl-C while it imports: `main` says "interrupted", exit 130
            raise typer.Abort() from None

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:
        """As Typer's, whose "Did you mean" looks only among the commands already imported."""
        try:
            return super().resolve_command(ctx, args)
        except TyperException as err:
            message = getattr(err, "message", None)
            matches = get_close_matches(args[0], list(COMMANDS)) if args and message and "Did you mean" not in message else []
            if matches:
                err.message = f"{message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise


def own_options(name: str) -> set[str]:
    """The global options (`--db`) that command `name` defines itself (serve's, gateway's)."""
    from lowtide.cli.argv import VALUE_OPTIONS

    if name not in COMMANDS:
        return set()
    return {o for p in load_command(name).params for o in p.opts} & VALUE_OPTIONS
