"""`lowtide trace JOB`: a job's batches and attempts as an OpenTelemetry trace, sent over
OTLP/HTTP (the `otel` extra; docs/traces.md). `run --trace-to` and `worker --trace-to`
send each job's trace when it ends, through `export_ended`."""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Annotated

import typer

from lowtide.cli.common import EXIT_USAGE, console, fail, open_store, say_error
from lowtide.core.errors import LowtideError
from lowtide.store.db import Store

ENDPOINT_HELP = (
    "The collector's OTLP/HTTP URL, e.g. http://localhost:4318 (/v1/traces is added). "
    "Default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318."
)

TraceTo = Annotated[
    str | None,
    typer.Option(
        "--trace-to", envvar="LOWTIDE_TRACE_TO", show_default=False,
        help="When a job ends, send its trace to this OTLP/HTTP collector URL (`lowtide trace`, docs/traces.md; "
        "needs lowtide[otel]). A refused export is reported and leaves the job as it is.",
    ),
]  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)  # its summary: cli/helptext.py


def trace(
    job: Annotated[str, typer.Argument(help="The job's name.", show_default=False)],
    endpoint: Annotated[str | None, typer.Option("--endpoint", help=ENDPOINT_HELP, show_default=False)] = None,
    header: Annotated[
        list[str],
        typer.Option("--header", "-H", help="A header for the collector, NAME=VALUE (repeatable), e.g. a backend's key. "
                     "Default: OTEL_EXPORTER_OTLP_HEADERS."),
    ] = [],  # noqa: B006
    timeout: Annotated[
        float | None,
        typer.Option(help="Seconds to wait for the collector per request, retries included. Default: OTEL_EXPORTER_OTLP_TIMEOUT, else 10.",
                     min=0.1, show_default=False),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print what was sent as JSON: job, trace_id, spans, endpoint.")] = False,
) -> None:
    """Send a job's trace to an OpenTelemetry collector: a span for the job, one per batch,
    one per attempt, with the times, tokens and costs the store recorded.

    Span and trace ids come from the job, so sending it again gives the same trace. Attempt
    spans follow the GenAI semantic conventions (gen_ai.usage.*); costs are `lowtide.cost.*`
    at the tier each attempt was billed.

    Example: lowtide trace classify-tickets --endpoint http://localhost:4318
    Example: lowtide trace classify-tickets --endpoint https://cloud.langfuse.com/api/public/otel -H "Authorization=Basic $KEY"
    """
    headers = _headers(header)
    try:
        with open_store(create=False) as store:
            sent = _export(store, job, endpoint, headers, timeout)
    except LowtideError as err:
        raise fail(err) from None
    if as_json:
        print(json.dumps({"job": sent.job, "trace_id": sent.trace_id, "spans": sent.spans, "endpoint": sent.endpoint}))
    else:
        console.print(f"trace {sent.trace_id}: {sent.spans:,} spans of job {sent.job} sent to {sent.endpoint or 'the OTEL_* endpoint'}", markup=False)


def export_ended(store: Store, names: Iterable[str], endpoint: str) -> None:
    """`--trace-to`: send the trace of each job that just ended. A refusal is said, never
    raised: the job's results are in the store whatever the collector did, and
    `lowtide trace JOB` sends the trace again."""
    for name in names:
        try:
            sent = _export(store, name, endpoint, None, None)
        except LowtideError as err:
            say_error(f"trace of job {name} not sent: {err}")
            continue
        console.print(f"trace {sent.trace_id}: {sent.spans:,} spans of job {name} sent to {sent.endpoint}", markup=False)


def check_trace_to(endpoint: str | None) -> None:
    """Before a run starts: a bad --trace-to URL or a missing extra stops it, not its end."""
    if endpoint is None:
        return
    from lowtide.engine.otlp import otel_modules, traces_url

    try:
        traces_url(endpoint)
        otel_modules()
    except LowtideError as err:
        raise fail(err) from None


def _export(store: Store, job: str, endpoint: str | None, headers: dict[str, str] | None, timeout: float | None):
    from lowtide.engine.otlp import export_trace  # OpenTelemetry loads only here (the otel extra)

    live = console.is_terminal and not console.is_dumb_terminal
    with console.status(f"sending the trace of {job}", spinner="dots") if live else nullcontext() as status:
        def shown(n: int) -> None:
            if status is not None:
                status.update(f"sending the trace of {job}: {n:,} spans")

        return export_trace(job, store, endpoint=endpoint, headers=headers, timeout=timeout, on_spans=shown)


def _headers(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    headers = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            say_error(f"--header {pair!r}: give NAME=VALUE, e.g. --header 'Authorization=Basic <key>'")
            raise typer.Exit(EXIT_USAGE)
        headers[name.strip()] = value.strip()
    return headers
