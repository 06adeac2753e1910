"""`lowtide serve`: the Batch API server (OpenAI and Anthropic protocols) over any route."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from lowtide.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    console,
    env_list,
    fail,
    host_name,
    origin_name,
    say_error,
    state,
)
from lowtide.core.errors import LowtideError
from lowtide.server.listen import HEADER_TIMEOUT
from lowtide.server.safejson import MAX_DEPTH
from lowtide.store.db import default_location

KEYS_ENV = "LOWTIDE_SERVE_API_KEYS"
HOSTS_ENV = "LOWTIDE_SERVE_ALLOW_HOSTS"
ORIGINS_ENV = "LOWTIDE_SERVE_ALLOW_ORIGINS"

# The guard's options, shared with `lowtide dashboard` (cli/dashboard.py).
AllowHost = Annotated[
    list[str] | None,
    typer.Option("--allow-host", help=f"With no key, serve this name too, besides localhost and IP addresses (repeatable; or {HOSTS_ENV}; *: any)."),
]
AllowOrigin = Annotated[
    list[str] | None,
    typer.Option("--allow-origin", help=f"Accept calls from web pages of this origin, e.g. https://app.example.com (repeatable; or {ORIGINS_ENV})."),
]
HeaderTimeout = Annotated[
    float, typer.Option("--header-timeout", min=0.01, help="Seconds a client may take to send a request's headers (then it is disconnected).")
]
UNITS = {"": 1, "B": 1, "KB": 1024, "KIB": 1024, "MB": 1024**2, "MIB": 1024**2, "GB": 1024**3, "GIB": 1024**3}


def _options(flag: str, items: list[str] | None) -> dict:
    """Route options given as KEY=VALUE (the value read as YAML: 8, true, [a, b])."""
    options = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            say_error(f"{flag} {item!r}: write KEY=VALUE, e.g. {flag} slots=8")
            raise typer.Exit(EXIT_USAGE)
        options[key.strip()] = yaml.safe_load(value)
    return options


def _size(flag: str, text: str) -> int:
    """`32MB`, `512 KiB`, `1048576` as bytes (binary units)."""
    number = text.strip().rstrip("bBiIkKmMgG ").strip()
    unit = text.strip()[len(number):].strip().upper()
    try:
        value = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        value = -1
    if not 1024 <= value < 2**63:
        say_error(f"{flag} {text!r}: give a size of at least 1KB, e.g. {flag} 32MB")
        raise typer.Exit(EXIT_USAGE)
    return int(value)


def serve(
    backend: Annotated[str, typer.Option(help="The route batches run on: echo, local, …")] = "echo",
    port: Annotated[int, typer.Option(help="TCP port (0: any free one; the URLs printed say which).")] = 8000,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    db: Annotated[str | None, typer.Option("--db", help="The store (default: lowtide --db, LOWTIDE_DB, ./lowtide.db).")] = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where uploaded and produced files live.")] = Path("lowtide-serve"),
    model: Annotated[str | None, typer.Option(help="Run every batch on this model of the backend (default: the batch's own).")] = None,
    api_key: Annotated[
        list[str] | None,
        typer.Option("--api-key", help=f"Accept this key (repeatable). Shown in the process list: prefer --api-key-file or {KEYS_ENV}=k1,k2. None: any key."),
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", help="Accept the keys in this file (one a line; # comments).")
    ] = None,
    allow_host: AllowHost = None,
    allow_origin: AllowOrigin = None,
    time_scale: Annotated[float, typer.Option("--time-scale", min=0.000001, help="Run the server's clock N times faster (testing).")] = 1.0,
    complete_after: Annotated[float, typer.Option("--complete-after", min=0, help="Scaled seconds before a batch may finish (testing).")] = 0.0,
    faults: Annotated[Path | None, typer.Option("--faults", help="A YAML fault plan (testing); see docs/serve.md.")] = None,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="A route option of the backend, KEY=VALUE (repeatable).")
    ] = None,
    max_attempts: Annotated[int, typer.Option("--max-attempts", min=1, max=100, help="Attempts per line on the backend before it fails (or falls back).")] = 3,
    fallback: Annotated[str | None, typer.Option("--fallback", help="A route for lines the backend keeps failing or lets expire (docs/fallback.md).")] = None,
    fallback_option: Annotated[
        list[str] | None, typer.Option("--fallback-option", help="A route option of the fallback, KEY=VALUE (repeatable).")
    ] = None,
    fallback_model: Annotated[str | None, typer.Option("--fallback-model", help="The model on the fallback route (default: the line's).")] = None,
    max_request_size: Annotated[str, typer.Option("--max-request-size", help="Largest JSON body (real time, /v1/batches), e.g. 32MB.")] = "32MB",
    max_batch_size: Annotated[str, typer.Option("--max-batch-size", help="Largest message batch body (/v1/messages/batches).")] = "256MB",
    max_file_size: Annotated[str, typer.Option("--max-file-size", help="Largest upload to /v1/files.")] = "512MB",
    body_timeout: Annotated[float, typer.Option("--body-timeout", min=0.01, help="Seconds a client may pause while sending a body (then 408).")] = 30.0,
    max_json_depth: Annotated[int, typer.Option("--max-json-depth", min=2, max=MAX_DEPTH, help="Deepest nesting of a JSON body or batch line.")] = 64,
    header_timeout: HeaderTimeout = HEADER_TIMEOUT,
) -> None:
    """Serve the OpenAI Batch, Anthropic Message Batches and Gemini batch APIs; batches run as lowtide jobs.

    Point the official SDKs at it: OpenAI(base_url="http://127.0.0.1:8000/v1"),
    Anthropic(base_url="http://127.0.0.1:8000").

    Example: lowtide serve --backend echo --port 8000 --time-scale 3600
    """
    import uvicorn

    from lowtide.server import ServeConfig, create_app, guard, listen

    route_options = _options("--option", option)
    if fallback_option and not fallback:
        say_error("--fallback-option needs --fallback ROUTE")
        raise typer.Exit(EXIT_USAGE)
    lines_fallback = None if fallback is None else {
        "route": fallback, "route_options": _options("--fallback-option", fallback_option), "model": fallback_model,
    }  # fmt: skip
    keys, hosts, origins = access(api_key, api_key_file, allow_host, allow_origin)
    limits = {name: _size(flag, value) for name, flag, value in (
        ("max_request_bytes", "--max-request-size", max_request_size), ("anthropic_max_bytes", "--max-batch-size", max_batch_size),
        ("max_file_bytes", "--max-file-size", max_file_size))}  # fmt: skip
    config = ServeConfig(
        backend=backend, route_options=route_options, model=model, max_attempts=max_attempts, fallback=lines_fallback,
        data_dir=data_dir, db=db or state.db or default_location(),
        time_scale=time_scale, complete_after=complete_after, faults=faults, api_keys=tuple(keys),
        allow_hosts=tuple(hosts), allow_origins=tuple(origins),
        body_timeout=body_timeout, max_json_depth=max_json_depth, **limits,
    )  # fmt: skip
    try:
        app = create_app(config)
    except LowtideError as err:
        raise fail(err) from None
    guard.protect(app, config)  # other sites (a no-op where create_app installed it)
    server = app.state.server
    # Listening before anything is printed: the URLs below are the port it got (`--port 0`:
    # any free one), and a port already taken fails here, by name, not inside uvicorn.
    sock = bind(host, port)
    port = sock.getsockname()[1]
    console.print(f"lowtide serve: backend {backend}, store {server.store.describe()}, files in {server.data_dir}")
    console.print(f"  OpenAI:    OpenAI(base_url=\"http://{host}:{port}/v1\")")
    console.print(f"  Anthropic: Anthropic(base_url=\"http://{host}:{port}\")")
    if time_scale != 1.0 or complete_after or faults:
        console.print(f"  testing: time scale {time_scale:g}, complete after {complete_after:g} s, faults {faults or 'none'}")
    console.print(f"  {access_note(keys, hosts)}")  # with no key, the app itself warns too
    uvicorn.Server(listen.config(app, header_timeout=header_timeout, log_level="warning")).run(sockets=[sock])


# The access options serve shares with `lowtide dashboard` (cli/dashboard.py) --------------
def access(
    api_key: list[str] | None, api_key_file: Path | None, allow_host: list[str] | None, allow_origin: list[str] | None
) -> tuple[list[str], list[str], list[str]]:
    """The keys, extra host names and origins of the options and their environment variables."""
    if api_key:
        print(f"lowtide: warning: --api-key shows the key to anyone who can list processes; give it with --api-key-file PATH "
              f"or {KEYS_ENV} instead", file=sys.stderr)  # fmt: skip
    keys = list(api_key or []) + env_list(KEYS_ENV) + (_key_file(api_key_file) if api_key_file else [])
    hosts = [host_name(h) for h in list(allow_host or []) + env_list(HOSTS_ENV)]
    origins = [origin_name(o) for o in list(allow_origin or []) + env_list(ORIGINS_ENV)]
    return keys, hosts, origins


def access_note(keys: list[str], hosts: list[str]) -> str:
    """Who the server answers, in a few words (never a key)."""
    if keys:
        return f"{len(keys)} API key(s) accepted"
    names = "any name (--allow-host *)" if "*" in hosts else "only to " + ", ".join(["localhost", "IP addresses", *hosts])
    return f"no API key: answers {names}"


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is printed (`--port 0`: any free one); a
    port already taken ends the command by name (exit 3), not inside uvicorn."""
    try:
        return _listen(host, port)
    except OSError as err:
        print(f"lowtide: cannot listen on {host}:{port}: {err.strerror or err}; give another --port (0: any free one)", file=sys.stderr)
        raise typer.Exit(EXIT_ERROR) from None


def _key_file(path: Path) -> list[str]:
    """The keys of a key file: one a line; blank lines and `#` comments skipped."""
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        print(f"lowtide: --api-key-file {path}: cannot read it ({getattr(err, 'strerror', None) or err})", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:  # a key file given means keys wanted: never serve open by mistake
        print(f"lowtide: --api-key-file {path}: the file holds no key; write one key a line", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE)
    return keys


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, as uvicorn would bind it (IPv6 for an address with ':')."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind((host, port))
        # Listening now, not when uvicorn starts: a client that read the banner may connect
        # while the app still starts up, and waits in the backlog instead of being refused.
        sock.listen(2048)  # uvicorn's default backlog
    except OSError:
        sock.close()
        raise
    return sock
