"""`lowtide try`: one prompt, answered in real time, stored as a one-row job.

It is an ordinary job on the ordinary path: a one-row source and a spec are written to
`lowtide-try/` beside the store (SQLite; the current folder for PostgreSQL), then loaded
and ticked to the end exactly as `lowtide run` does (load_job, the Engine, drive). So the
try shows in `lowtide status`, `report` and the dashboard, its spec can be run again with
`lowtide run lowtide-try/<job>.yaml`, and nothing here moves a request's state itself.

The default route is `echo`: it needs no key and no model, and answers with a documented
function of the request (the prompt back, a choice, an instance of the schema), so a first
`lowtide try` shows the whole path working; `--route openai` (OPENAI_API_KEY),
`--route anthropic` (ANTHROPIC_API_KEY) or `--route openai-compatible --base-url URL` ask a
real model.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from sqlalchemy import select

from lowtide.cli.common import (
    EXIT_FAILURES,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    console,
    fail,
    open_store,
    out,
    say_error,
)
from lowtide.cli.display import money
from lowtide.core.clock import SystemClock
from lowtide.core.endpoints import required_keys
from lowtide.core.errors import InputError, LowtideError, RouteError, UnknownRouteError
from lowtide.core.params import check_schema
from lowtide.core.spec import build_spec, default_endpoint
from lowtide.engine.control import JobStatus
from lowtide.engine.loader import load_job
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.routes import create_route
from lowtide.store.db import Store
from lowtide.store.queries import get_job
from lowtide.store.schema import requests

DEFAULT_ROUTE = "echo"
FOLDER = "lowtide-try"
ROW_ID = "try"
# A route whose endpoint requires an output limit (Anthropic's max_tokens) gets this one
# when --max-tokens is not given.
DEFAULT_MAX_TOKENS = 1024


def register(app: typer.Typer) -> None:
    app.command("try")(try_command)


def try_command(
    model: Annotated[str, typer.Argument(help="The model (any name on echo).", show_default=False)],
    prompt: Annotated[str, typer.Argument(help='The user message; "-" reads it from stdin.', show_default=False)],
    route: Annotated[
        str, typer.Option("--route", help="A real-time route: echo (no key, no model), openai, anthropic, gemini, openai-compatible, local.")
    ] = DEFAULT_ROUTE,
    system: Annotated[str | None, typer.Option("--system", help="A system prompt.")] = None,
    schema: Annotated[Path | None, typer.Option("--schema", help="A JSON Schema file the answer must be valid against.")] = None,
    choices: Annotated[str | None, typer.Option("--choices", help="The answer must be one of these, comma-separated: yes,no.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="The output limit (params.max_tokens).")] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="The server's root, for openai-compatible (http://127.0.0.1:8000/v1) or another endpoint.")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print {job, route, model, state, answer, parsed, error, tokens, cost_usd, ...} as JSON.")
    ] = False,
) -> None:
    """Send one prompt in real time and print the answer and its cost.

    The try is stored as a one-row job named try-<UTC time>-<4 hex>, so it shows in
    `lowtide status`, `lowtide report` and the dashboard; its spec and one-row source are kept
    in lowtide-try/ beside the store, to run again with `lowtide run`. The default route is
    echo, which needs no key and is not a model: it answers with the prompt, a choice, or an
    instance of the schema. Pass --route openai (OPENAI_API_KEY), --route anthropic
    (ANTHROPIC_API_KEY) or --route openai-compatible --base-url URL for a real model.

    Example: lowtide try gpt-4o-mini "Is this ticket about billing? I was charged twice" --choices yes,no

    Example: lowtide try gpt-4o-mini "Summarise: ..." --route openai --max-tokens 200

    Example: lowtide try claude-haiku-4-5 "Extract the name: Ada Lovelace" --route anthropic --schema person.json
    """
    text = sys.stdin.read() if prompt == "-" else prompt
    try:
        data = _spec_data(model, text, route, system, schema, choices, max_tokens, base_url)
        build_spec(_with_paths(data, "try", Path.cwd()), where="lowtide try")  # its problems, before anything is written
        with open_store() as store:
            name, spec_path = _write(store, data, text, system)
            spec = build_spec(_with_paths(data, name, spec_path.parent), where=str(spec_path))
            try:
                load_job(store, spec, SystemClock(), str(spec_path))
            except LowtideError:  # nothing was stored: nor is anything left beside the store
                spec_path.unlink(missing_ok=True)
                spec_path.with_suffix(".jsonl").unlink(missing_ok=True)
                raise
            with console.status(f"asking {model} on {route}", spinner="dots") if console.is_terminal else nullcontext():
                status = _drive(store, name)
            answer = _answer(store, name)
    except KeyboardInterrupt:
        say_error("interrupted: the try is stored; `lowtide worker --until-idle` finishes it")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except LowtideError as err:
        raise fail(err) from None
    shown = answer | {
        "job": name, "route": route, "model": model, "spec": str(spec_path),
        "cost_usd": str(status.spent_usd) if not status.unknown_costs else None,
    }  # fmt: skip
    if as_json:
        print(json.dumps(shown, indent=2))
    else:
        _print(shown, status)
    if answer["state"] != "succeeded":
        raise typer.Exit(EXIT_FAILURES)


def _usage(message: str) -> typer.Exit:
    say_error(message)
    return typer.Exit(EXIT_USAGE)


def _spec_data(
    model: str, text: str, route: str, system: str | None, schema_path: Path | None, choices: str | None,
    max_tokens: int | None, base_url: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The job spec of the try (its name and paths are added once they are known)."""
    if not text.strip():
        raise _usage('the prompt is empty; give the message to send, e.g. lowtide try MODEL "Hello"')
    if schema_path is not None and choices is not None:
        raise _usage(
            "--schema and --choices are both given; an answer is either one of the choices or JSON valid "
            "against the schema. Keep one (a schema with an enum at its root counts as choices)"
        )
    data: dict[str, Any] = {"model": model, "route": route}
    options: dict[str, Any] = {"base_url": base_url} if base_url else {}
    try:
        built = create_route(route, options)
    except UnknownRouteError as err:
        raise _usage(str(err).replace("Fix the `route:` key of the job spec", "Fix --route")) from None
    except RouteError as err:  # no key, or a missing option: the user's to fix
        if route.endswith("-batch"):
            raise _usage(_batch_route(route)) from None
        fix = "; give the server's root with --base-url" if "base_url" in str(err) and not base_url else ""
        raise _usage(f"--route {route}: {str(err).removeprefix(f'{route}: ')}{fix}") from None
    if getattr(built, "kind", "direct") != "direct":
        raise _usage(_batch_route(route))
    if options:
        data["route_options"] = options
    if schema_path is not None:
        data["response_schema"] = _read_schema(schema_path)
    if choices is not None:
        listed = [c.strip() for c in choices.split(",") if c.strip()]
        if len(set(listed)) < 2:
            raise _usage(f"--choices {choices!r}: give at least two distinct choices, comma-separated, e.g. --choices yes,no")
        data["choices"] = list(dict.fromkeys(listed))
    params: dict[str, Any] = {}
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    elif "max_tokens" in required_keys(default_endpoint(route)):
        params["max_tokens"] = DEFAULT_MAX_TOKENS
    data["params"] = params
    data["template"] = {"user": "{{ prompt }}"} | ({"system": "{{ system }}"} if system else {})
    data["retry"] = {"max_attempts": 2, "backoff_seconds": 2}  # someone is waiting: one quick retry
    return data


def _batch_route(route: str) -> str:
    return (
        f"--route {route} is a batch route (answers in minutes to hours); `lowtide try` asks in real time: "
        "use a real-time route (openai, anthropic, gemini, openai-compatible), or `lowtide run` a spec for a batch"
    )


def _read_schema(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise _usage(f"--schema {path}: cannot read the file ({err.strerror or err}); give the path of a JSON Schema file") from None
    except UnicodeDecodeError:
        raise _usage(f"--schema {path}: not UTF-8 text; give a JSON Schema file") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise _usage(f"--schema {path}: not JSON ({err.msg} at line {err.lineno} column {err.colno}); fix the file") from None
    if not isinstance(value, dict):
        raise _usage(f"--schema {path}: holds a JSON {type(value).__name__}; a JSON Schema is an object, e.g. {{\"type\": \"object\", ...}}")
    try:
        check_schema(value)
    except ValueError as err:
        raise _usage(f"--schema {path}: not a valid JSON Schema: {err}; fix the file") from None
    return value


def _folder(store: Store) -> Path:
    """lowtide-try/ beside a SQLite store; in the current folder for any other."""
    where = Path(store.describe())
    return (where.parent if store.is_sqlite and where.is_file() else Path.cwd()) / FOLDER


def _write(store: Store, data: dict[str, Any], text: str, system: str | None) -> tuple[str, Path]:
    """The try's one-row source and its spec, written under a new job name: (name, spec path)."""
    folder = _folder(store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            name = f"try-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
            spec_path = folder / f"{name}.yaml"
            try:
                with spec_path.open("x", encoding="utf-8"):  # claims the name
                    break
            except FileExistsError:
                continue
        row = {"id": ROW_ID, "prompt": text} | ({"system": system} if system else {})
        # ASCII JSON: a lone surrogate in the prompt reaches the loader, which names it.
        (folder / f"{name}.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
        # The file is the spec as `lowtide run` reads it: paths relative to its folder.
        spec_path.write_text(yaml.safe_dump(_with_paths(data, name, None), sort_keys=False, allow_unicode=True), encoding="utf-8")
    except OSError as err:
        raise InputError(f"{folder}: cannot write the try's spec and source ({err.strerror or err}); run from a folder you can write to") from None
    return name, spec_path


def _with_paths(data: dict[str, Any], name: str, base_dir: Path | None) -> dict[str, Any]:
    spec = {"name": name, "source": {"path": f"{name}.jsonl", "id_column": "id"}} | data
    return spec | ({"base_dir": str(base_dir.resolve())} if base_dir is not None else {})


def _drive(store: Store, name: str) -> JobStatus:
    async def go() -> JobStatus:
        async with Engine(store) as engine:
            return await drive(engine, name)

    return asyncio.run(go())


def _answer(store: Store, name: str) -> dict[str, Any]:
    """The stored outcome of the try's one request."""
    with store.read() as conn:
        job = get_job(conn, name)
        r = conn.execute(
            select(
                requests.c.state, requests.c.output, requests.c.parsed, requests.c.error_code, requests.c.error_message,
                requests.c.input_tokens, requests.c.output_tokens,
            ).where(requests.c.job_id == job.id)
        ).one()  # fmt: skip
    return {
        "state": r.state, "answer": r.output, "parsed": json.loads(r.parsed) if r.parsed else None,
        "error": f"{r.error_code}: {r.error_message}" if r.state != "succeeded" and r.error_code else None,
        "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
    }  # fmt: skip


def _print(shown: dict[str, Any], status: JobStatus) -> None:
    if shown["state"] == "succeeded":
        if shown["parsed"] is not None and not isinstance(shown["parsed"], str):
            out.print(json.dumps(shown["parsed"], indent=2, ensure_ascii=False), markup=False, soft_wrap=True, highlight=False)
        else:
            out.print(shown["answer"] or "", markup=False, soft_wrap=True, highlight=False)
    else:
        say_error(f"the request {shown['state']}: {shown['error'] or 'no reason given'}")
    cost = money(status.spent_usd) + (" (unknown: no price for this model and route)" if status.unknown_costs else "")
    free = " (echo is free)" if shown["route"] == "echo" else ""
    tokens = f"{shown['input_tokens'] or 0:,} in, {shown['output_tokens'] or 0:,} out"
    out.print(f"cost: {cost}{free}; tokens {tokens}; job {shown['job']} (lowtide status {shown['job']})", markup=False, soft_wrap=True)
