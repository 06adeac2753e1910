"""Send a job's trace (engine/traces.py) to an OpenTelemetry collector over OTLP/HTTP.

    export_trace("tickets", "lowtide.db", endpoint="http://localhost:4318")

OpenTelemetry is the `otel` extra (`pip install 'lowtide[otel]'`), imported only when a
trace is exported: the core install neither needs nor loads it. Spans are built from the
stored records (their real times, ids derived from the job) and sent `chunk` at a time
through the SDK's OTLP/HTTP exporter, or any `SpanExporter` given, so a job of any size
is sent in bounded memory and nothing runs on the engine's hot path.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from lowtide import __version__
from lowtide.core.errors import InputError, LowtideError
from lowtide.engine.traces import PAGE, SpanRecord, job_trace
from lowtide.store.db import Store

TRACES_PATH = "/v1/traces"
EXTRA_HINT = "install it with `pip install 'lowtide[otel]'`"


@dataclass(frozen=True, slots=True)
class TraceExport:
    job: str
    trace_id: str  # 32 hex digits, as trace viewers show it
    spans: int
    endpoint: str | None  # None: the exporter's own (a given exporter, or OTEL_* variables)


def otel_modules() -> dict[str, Any]:
    """The OpenTelemetry parts an export uses, or lowtide's message naming the extra."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.trace.export import SpanExportResult
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
    except ImportError as err:
        raise LowtideError(
            "exporting traces needs the otel extra, opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http "
            f"({err.name or 'opentelemetry'} cannot be imported); {EXTRA_HINT}"
        ) from None
    return {
        "OTLPSpanExporter": OTLPSpanExporter, "Resource": Resource, "Event": Event, "ReadableSpan": ReadableSpan,
        "SpanExportResult": SpanExportResult, "InstrumentationScope": InstrumentationScope, "SpanContext": SpanContext,
        "SpanKind": SpanKind, "Status": Status, "StatusCode": StatusCode, "TraceFlags": TraceFlags,
    }  # fmt: skip


def traces_url(endpoint: str) -> str:
    """A collector's base URL (…/v1/traces is added, as OTEL_EXPORTER_OTLP_ENDPOINT is read)
    or its full traces URL."""
    url = endpoint.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(
            f"--endpoint {endpoint!r}: give the collector's OTLP/HTTP URL, e.g. http://localhost:4318 "
            "(port 4318 is OTLP/HTTP; 4317 is gRPC, which this export does not speak)"
        )
    return url if url.endswith(TRACES_PATH) else url + TRACES_PATH


def export_trace(
    job: str,
    store: Store | str | None = None,
    *,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    exporter: Any = None,
    service_name: str | None = None,
    chunk: int = PAGE,
    now: float | None = None,
    on_spans: Callable[[int], None] | None = None,
) -> TraceExport:
    """Export the trace of `job` (its batches and attempts as stored) and return what was sent.

    `endpoint`: the collector's OTLP/HTTP URL; None reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    or OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318). `headers` (None: read
    from OTEL_EXPORTER_OTLP_HEADERS) carry a backend's key. `timeout`: seconds per request,
    retries included (None: OTEL_EXPORTER_OTLP_TIMEOUT, default 10). `exporter`: any OpenTelemetry
    `SpanExporter` instead (gRPC, console, in-memory); it is not shut down here.
    `on_spans(n)` is told after each chunk is taken. Exporting again sends the same ids."""
    otel = otel_modules()
    own = exporter is None
    url = traces_url(endpoint) if endpoint is not None else None
    if own:
        exporter = otel["OTLPSpanExporter"](endpoint=url, headers=dict(headers) if headers is not None else None, timeout=timeout)
    opened = not isinstance(store, Store)
    db = Store(store, create=False) if opened else store
    sent = 0
    try:
        trace = job_trace(db, job, now=time.time() if now is None else now, page=chunk)
        to_span = _converter(otel, service_name)
        for page in _chunks(trace.root, trace.pages(), chunk):
            with _exporter_log() as said:
                result = exporter.export([to_span(r) for r in page])
            if result != otel["SpanExportResult"].SUCCESS:
                where = url or "the exporter's endpoint"
                reason = f": {said[-1]}" if said else ""
                raise LowtideError(
                    f"{where} did not take the trace of job {job} ({sent} of its spans were sent before){reason}; "
                    "nothing in the store changed: export it again (`lowtide trace JOB`), the spans keep their ids"
                )
            sent += len(page)
            if on_spans is not None:
                on_spans(sent)
    finally:
        if own:
            exporter.shutdown()
        if opened:
            db.close()
    return TraceExport(job, f"{trace.trace_id:032x}", sent, url)


def _chunks(root: SpanRecord, pages: Iterator[list[SpanRecord]], size: int) -> Iterator[list[SpanRecord]]:
    """The job's span, then the pages, regrouped into lists of at most `size`."""
    batch = [root]
    for page in pages:
        for record in page:
            batch.append(record)
            if len(batch) >= size:
                yield batch
                batch = []
    if batch:
        yield batch


def _converter(otel: dict[str, Any], service_name: str | None) -> Callable[[SpanRecord], Any]:
    resource = otel["Resource"].create(
        {"service.name": service_name or os.environ.get("OTEL_SERVICE_NAME") or "lowtide", "service.version": __version__}
    )
    scope = otel["InstrumentationScope"]("lowtide", __version__)
    SpanContext, Status, StatusCode, Event = otel["SpanContext"], otel["Status"], otel["StatusCode"], otel["Event"]
    sampled = otel["TraceFlags"](otel["TraceFlags"].SAMPLED)
    kinds = {"internal": otel["SpanKind"].INTERNAL, "client": otel["SpanKind"].CLIENT}
    unset = Status(StatusCode.UNSET)
    ReadableSpan = otel["ReadableSpan"]

    def convert(r: SpanRecord) -> Any:
        parent = SpanContext(r.trace_id, r.parent_id, is_remote=False, trace_flags=sampled) if r.parent_id else None
        return ReadableSpan(
            name=r.name,
            context=SpanContext(r.trace_id, r.span_id, is_remote=False, trace_flags=sampled),
            parent=parent,
            resource=resource,
            attributes=r.attributes,
            events=[Event(name, attrs, timestamp=_ns(at)) for name, at, attrs in r.events],
            kind=kinds[r.kind],
            status=Status(StatusCode.ERROR, r.error) if r.error is not None else unset,
            start_time=_ns(r.start),
            end_time=_ns(r.end),
            instrumentation_scope=scope,
        )

    return convert


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().splitlines()[0][:300] if record.getMessage() else record.levelname)


@contextmanager
def _exporter_log() -> Iterator[list[str]]:
    """What the exporter logs while it sends (why a chunk was refused), kept for lowtide's
    own message instead of printed as a bare log line."""
    logger = logging.getLogger("opentelemetry.exporter")
    handler, propagate = _Said(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
