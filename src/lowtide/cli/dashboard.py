"""`lowtide dashboard`: the dashboard alone over any store, read-only (server/dashboard_app.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lowtide.cli.common import console, fail, state
from lowtide.cli.serve import (
    KEYS_ENV,
    AllowHost,
    AllowOrigin,
    HeaderTimeout,
    access,
    access_note,
    bind,
)
from lowtide.core.errors import LowtideError
from lowtide.server.listen import HEADER_TIMEOUT
from lowtide.store.db import default_location


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)  # its summary: cli/helptext.py


def dashboard(
    db: Annotated[str | None, typer.Option("--db", help="The store (default: lowtide --db, LOWTIDE_DB, ./lowtide.db).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free one; the URL printed says which).")] = 8700,
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", help=f"Ask for one of the keys in this file (one a line; # comments; or {KEYS_ENV}=k1,k2).")
    ] = None,
    allow_host: AllowHost = None,
    allow_origin: AllowOrigin = None,
    header_timeout: HeaderTimeout = HEADER_TIMEOUT,
    api_jobs: Annotated[
        bool, typer.Option("--api-jobs", help="List `lowtide serve`'s own API batch jobs too (default: left out; ?api_jobs=true on the page).")
    ] = False,
) -> None:
    """Serve the dashboard alone over a store (SQLite file or URL, PostgreSQL URL), read-only:
    the jobs run by `lowtide run`, a worker or the gateway, with their progress, failures and
    costs. No batch API is served and nothing is run; `lowtide serve`'s own API batch jobs
    are left out (--api-jobs lists them too). Host and Origin are checked as serve checks them.

    Example: lowtide dashboard --db lowtide.db --port 8700
    """
    import uvicorn

    from lowtide.server import listen
    from lowtide.server.context import ServeConfig
    from lowtide.server.dashboard_app import create_dashboard_app

    keys, hosts, origins = access(None, api_key_file, allow_host, allow_origin)
    config = ServeConfig(db=db or state.db or default_location(), api_keys=tuple(keys), allow_hosts=tuple(hosts), allow_origins=tuple(origins))
    try:
        app = create_dashboard_app(config, api_jobs=api_jobs)
    except LowtideError as err:
        raise fail(err) from None
    sock = bind(host, port)
    port = sock.getsockname()[1]
    where = f"[{host}]" if ":" in host else host
    store = app.state.server.store.describe()
    console.print(f"lowtide dashboard: http://{where}:{port}/dashboard (store {store}, read-only; {access_note(keys, hosts)})",
                  soft_wrap=True, markup=False)  # fmt: skip
    uvicorn.Server(listen.config(app, header_timeout=header_timeout, log_level="warning")).run(sockets=[sock])
