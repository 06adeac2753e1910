"""What every command shares: the store option, the console, exit codes, error printing."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from lowtide.core.errors import InputError, JobNotFoundError, LowtideError
from lowtide.store.db import BUSY_TIMEOUT_S, Store, is_busy

console = Console(stderr=True, highlight=False)
out = Console(highlight=False)

# Exit codes: scripts and cron can tell these apart.
EXIT_OK = 0  # done, every request succeeded
EXIT_FAILURES = 1  # the job finished, some requests failed or were cancelled
EXIT_USAGE = 2  # bad arguments or bad input; nothing was submitted
EXIT_ERROR = 3  # the store or a route failed
EXIT_INTERRUPTED = 130  # Ctrl-C; the job is resumable


class State:
    db: str | None = None
    debug: bool = False


state = State()


@contextmanager
def open_store(create: bool = True) -> Iterator[Store]:
    """The store of `--db`. Read-only commands pass `create=False`: they never leave a new,
    empty store behind where none was."""
    store = Store(state.db, create=create)
    try:
        yield store
    finally:
        store.close()


def say_error(message: str) -> None:
    """`lowtide: <message>` on stderr as one plain line: whole in a log however narrow, and
    a user's "[...]" is not read as Rich markup."""
    print(f"lowtide: {message}", file=sys.stderr)


def fail(err: LowtideError) -> typer.Exit:
    """Print a lowtide error the way users should see it and pick the exit code."""
    say_error(str(err))
    code = EXIT_USAGE if isinstance(err, InputError | JobNotFoundError) else EXIT_ERROR
    return typer.Exit(code)


def known_failure(err: BaseException) -> str | None:
    """What to tell the user about an error no command caught, where its cause is known
    outside lowtide: the store's database going away, a full disk. None for anything else."""
    import errno

    import sqlalchemy as sa

    reason = (str(getattr(err, "orig", None) or err).strip().splitlines() or [""])[0][:300]
    if isinstance(err, sa.exc.OperationalError) and "disk is full" in reason:  # SQLite
        return (f"the store's disk is full ({reason}); what was under way is rolled back: every change is one "
                "transaction. Free space, or `lowtide prune` finished jobs, and run the command again")  # fmt: skip
    if is_busy(err):  # SQLite, past its busy timeout
        return ("the store is busy: another process held its write lock longer than this one waits for it "
                f"({BUSY_TIMEOUT_S:.0f} s): a load of a large source, a `lowtide delete`, a `prune --vacuum`. What was under "
                "way is rolled back: every change is one transaction. Run the command again once that is done (a worker "
                "waits it out by itself); for loads of minutes beside a worker, store on PostgreSQL (docs/scale.md)")  # fmt: skip
    if isinstance(err, sa.exc.DBAPIError) and err.connection_invalidated:
        return (f"lost the store's database connection ({reason}); what was under way is rolled back: every change "
                "is one transaction. Run the command again once the database answers; a batch this process had "
                "claimed is taken over when its lease ends (a worker's: at most 15 minutes)")  # fmt: skip
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:  # writing results
        where = f" writing {err.filename}" if err.filename else ""
        return (f"no space left on the disk{where}; a results file is written under a temporary name and moved into "
                "place only when whole, so the previous one is intact and the answers stay in the store. Free space "
                "(or write elsewhere with --out) and run the command again")  # fmt: skip
    return None


# The other sites' options of serve and the gateway (server/guard.py) --------------------
def env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def host_name(name: str) -> str:
    if not name.strip() or any(c in name for c in "/@ "):
        say_error(f"--allow-host {name!r}: give a host name, e.g. --allow-host myhost.lan (no scheme, no path)")
        raise typer.Exit(EXIT_USAGE)
    return name.strip()


def origin_name(origin: str) -> str:
    scheme, sep, rest = origin.strip().rstrip("/").partition("://")
    if scheme not in ("http", "https") or not sep or not rest or any(c in rest for c in "/@ "):
        say_error(f"--allow-origin {origin!r}: give an origin, scheme and host, e.g. --allow-origin https://app.example.com")
        raise typer.Exit(EXIT_USAGE)
    return origin.strip().rstrip("/")
