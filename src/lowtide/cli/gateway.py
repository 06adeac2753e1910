"""`lowtide gateway` (the peak-shaving gateway) and `lowtide gateway-status` (what it holds)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.table import Table

from lowtide.cli.common import console, env_list, fail, host_name, origin_name, out, state
from lowtide.cli.serve import HOSTS_ENV, ORIGINS_ENV
from lowtide.core.errors import LowtideError
from lowtide.server.listen import HEADER_TIMEOUT
from lowtide.store.db import Store, default_location
from lowtide.store.money import from_pico


def gateway(
    config: Annotated[Path, typer.Option("--config", "-c", help="The gateway's YAML config (docs/gateway.md).")],
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    db: Annotated[str | None, typer.Option("--db", help="The store (default: the config's `db`, then lowtide --db, LOWTIDE_DB, ./lowtide.db).")] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option("--allow-host", help=f"With no tenants, serve this name too, besides localhost, IP addresses and public_url's (repeatable; or {HOSTS_ENV})."),
    ] = None,
    allow_origin: Annotated[
        list[str] | None, typer.Option("--allow-origin", help=f"Accept calls from web pages of this origin (repeatable; or {ORIGINS_ENV}).")
    ] = None,
    header_timeout: Annotated[
        float, typer.Option("--header-timeout", min=0.01, help="Seconds a client may take to send a request's headers (then it is disconnected).")
    ] = HEADER_TIMEOUT,
) -> None:
    """Serve OpenAI- and Anthropic-compatible endpoints that forward urgent requests to the
    real-time upstream and turn deferrable ones into batch jobs (202 Accepted + webhook).

    Clients change only their base URL: OpenAI(base_url="http://127.0.0.1:8080/v1"),
    Anthropic(base_url="http://127.0.0.1:8080").

    Example: lowtide gateway --config gateway.yaml --port 8080
    """
    import uvicorn

    from lowtide.server import guard, listen
    from lowtide.server.gateway import create_gateway_app, load_gateway_config

    try:
        cfg = load_gateway_config(config)
        app = create_gateway_app(cfg, db=db or cfg.db or state.db or default_location())
    except (LowtideError, ValueError) as err:
        raise fail(err if isinstance(err, LowtideError) else LowtideError(str(err))) from None
    gw = app.state.gateway
    console.print(f"lowtide gateway: store {gw.store.describe()}, flush files in {gw.data_dir}")
    for api in ("openai", "anthropic"):
        up, target = gw.upstream_config(api), gw.target(api)
        if up is not None or target is not None:
            console.print(f"  {api}: upstream {up.base_url if up else '(none)'}; deferred → {target.route if target else '(not deferred)'}")
    console.print(f"  OpenAI:    OpenAI(base_url=\"http://{host}:{port}/v1\")")
    console.print(f"  Anthropic: Anthropic(base_url=\"http://{host}:{port}\")")
    # Other sites (server/guard.py): with no tenants any key is one tenant, so a page rebound to
    # this address could spend the upstream key; its Host is then checked. Bodies are the
    # upstream's to judge (a page cannot send a key unasked): no content-type rule.
    hosts = [host_name(h) for h in list(allow_host or []) + env_list(HOSTS_ENV)]
    if cfg.public_url:
        hosts.append(urlsplit(cfg.public_url).hostname or "")
    origins = [origin_name(o) for o in list(allow_origin or []) + env_list(ORIGINS_ENV)]
    policy = guard.Policy.of(open=not cfg.tenants, hosts=hosts, origins=origins, raw_paths=None, closing="configure tenants")
    asgi = guard.Guard(app, policy)
    uvicorn.Server(listen.config(asgi, header_timeout=header_timeout, host=host, port=port, log_level="warning")).run()


def gateway_status(
    dead: Annotated[int, typer.Option(help="List up to this many dead-letter deliveries.")] = 20,
    redeliver: Annotated[bool, typer.Option("--redeliver", help="Queue every dead-letter delivery again (a running gateway sends them).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON (shape: docs/cli.md).")] = False,
) -> None:
    """Show the gateway's deferred requests by state and decision, webhook deliveries and
    dead letters, and the money saved so far (estimated).

    Example: lowtide gateway-status --redeliver
    """
    from lowtide.server.gateway import records

    try:
        store = Store(state.db, create=False)  # a look at a store that is not there makes none
    except LowtideError as err:
        raise fail(err) from None
    try:
        # A look only reads (it never queues behind a writer); --redeliver writes.
        with store.begin() if redeliver else store.read() as conn:
            redelivered = None
            if redeliver:
                redelivered = records.redeliver_dead(conn, time.time())
                console.print(f"{redelivered} dead-letter deliver(ies) queued again")
            summary = records.summary(conn)
            letters = records.dead_letters(conn, dead)
    finally:
        store.close()
    if as_json:
        shape = {
            "requests": {by: dict(sorted(summary[by].items())) for by in ("state", "decision", "delivery")},
            "saved_usd": str(from_pico(summary["saved_picousd"])),
            "dead_letters": [{"id": r.id, "tenant": r.tenant, "attempts": r.delivery_attempts, "last_error": r.delivery_error}
                             for r in letters],
            "redelivered": redelivered,
        }  # fmt: skip
        print(json.dumps(shape, indent=2))
        return
    table = Table(title="deferred requests")
    for column in ("by", "value", "requests"):
        table.add_column(column, justify="right" if column == "requests" else "left")
    for by in ("state", "decision", "delivery"):
        for value, n in sorted(summary[by].items()):
            table.add_row(by, value, str(n))
    out.print(table)
    out.print(f"estimated saved: ${summary['saved_picousd'] / 1e12:.6f}")
    if letters:
        dl = Table(title="dead letters")
        for column in ("id", "tenant", "attempts", "last error"):
            dl.add_column(column)
        for row in letters:
            dl.add_row(row.id, row.tenant, str(row.delivery_attempts), row.delivery_error or "")
        out.print(dl)


def register(app: typer.Typer) -> None:
    app.command()(gateway)
    app.command("gateway-status")(gateway_status)
