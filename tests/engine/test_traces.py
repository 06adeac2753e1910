"""A job's trace, sent by the real OTLP/HTTP exporter to a real receiver on loopback
(tests/otlp_receiver.py) and decoded there: jobs run by the engine on echo-batch and echo
against a SQLite store, and ledger jobs with real prices on the provider routes."""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.core.errors import InputError, LowtideError
from lowtide.core.types import Outcome, Usage
from lowtide.engine import traces
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.schema import attempts, dispatches, jobs, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.engine.ledger_helpers import NOW, dispatch, ingest, ok, stored_job

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from lowtide.engine.otlp import export_trace, traces_url  # noqa: E402
from tests.otlp_receiver import OtlpReceiver, attrs  # noqa: E402

ERROR, UNSET = 2, 0  # opentelemetry.proto.trace.v1.Status.StatusCode
CLIENT, INTERNAL = 3, 1  # Span.SpanKind


def ns(t: float) -> int:
    return round(t * 1e9)


@pytest.fixture
def receiver():
    with OtlpReceiver() as rx:
        yield rx


def _run(store, spec):
    load_job(store, spec, SystemClock())

    async def go():
        async with Engine(store) as engine:
            return await asyncio.wait_for(drive(engine, spec.name), 120)

    return asyncio.run(go())


@pytest.fixture
def echo_batch_job(sqlite_store, tmp_path):
    """12 tickets on echo-batch in batches of 5; T1000 fails on every attempt (2 allowed)."""
    spec = make_spec(
        write_csv(tmp_path / "tickets.csv", ticket_rows(12)), route="echo-batch",
        route_options={"dir": str(tmp_path / "echo-batch"), "fail_attempts": {"T1000": 9}, "max_requests": 5},
        retry={"max_attempts": 2, "backoff_seconds": 0},
    )  # fmt: skip
    status = _run(sqlite_store, spec)
    assert status.counts == {"succeeded": 11, "failed": 1}
    return sqlite_store


def _tree(spans):
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if not s.parent_span_id]
    return by_id, roots


def test_an_engine_run_is_one_trace_of_job_batches_and_attempts_at_their_stored_times(echo_batch_job, receiver):
    store = echo_batch_job
    sent = export_trace("tickets", store, endpoint=receiver.url, chunk=7)
    spans = receiver.received.spans
    with store.begin() as conn:
        job = conn.execute(sa.select(jobs)).one()
        batches = {r.id: r for r in conn.execute(sa.select(dispatches))}
        tries = conn.execute(sa.select(attempts, requests.c.custom_id).join(requests, requests.c.id == attempts.c.request_id)).all()
    assert len(spans) == sent.spans == 1 + len(batches) + len(tries) == 1 + 4 + 13  # batches of 5, 5, 2 and T1000's retry; 12 first tries and the retry
    assert receiver.received.posts == 3  # chunks of 7: 18 spans in three posts
    assert {s.trace_id.hex() for s in spans} == {sent.trace_id}
    assert set(receiver.received.scopes) == {"lowtide"}
    assert {r["service.name"] for r in receiver.received.resources} == {"lowtide"}

    by_id, roots = _tree(spans)
    (root,) = roots
    assert root.name == "job tickets" and root.kind == INTERNAL
    assert (root.start_time_unix_nano, root.end_time_unix_nano) == (ns(job.created_at), ns(job.finished_at))
    assert root.status.code == ERROR and root.status.message == "1 of 12 requests failed"

    batch_spans = {attrs(s)["lowtide.batch.id"]: s for s in spans if s.parent_span_id == root.span_id}
    assert set(batch_spans) == {d.provider_id for d in batches.values()}
    for d in batches.values():
        span = batch_spans[d.provider_id]
        a = attrs(span)
        assert span.name == "batch echo-batch"
        assert (span.start_time_unix_nano, span.end_time_unix_nano) == (ns(d.created_at), ns(d.ended_at))
        assert (a["lowtide.batch.state"], a["lowtide.batch.size"], a["lowtide.tier"]) == ("ended", d.size, "free")
        assert [(e.name, e.time_unix_nano) for e in span.events][0] == ("submitted", ns(d.submitted_at))

    attempt_spans = [s for s in spans if s.parent_span_id not in (b"", root.span_id)]
    assert len(attempt_spans) == len(tries)
    by_try = {(attrs(s)["lowtide.custom_id"], by_id[s.parent_span_id].span_id): s for s in attempt_spans}
    for t in tries:
        span = by_try[(t.custom_id, batch_spans[batches[t.dispatch_id].provider_id].span_id)]
        a = attrs(span)
        assert span.name == "chat test-model" and span.kind == CLIENT
        assert (span.start_time_unix_nano, span.end_time_unix_nano) == (ns(batches[t.dispatch_id].submitted_at), ns(t.at))
        assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"]) == ("chat", "echo-batch", "test-model")
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (t.input_tokens, t.output_tokens)
        if t.ok:
            assert span.status.code == UNSET and "error.type" not in a
        else:  # T1000: both tries
            assert t.custom_id == "T1000"
            assert span.status.code == ERROR and a["error.type"] == t.error_code == "server_error"
            assert span.status.message == f"server_error: {t.error_message}"

    # The sums are `lowtide report`'s.
    total = cost_report(store, job="tickets").total
    root_attrs = attrs(root)
    assert sum(attrs(s)["gen_ai.usage.input_tokens"] for s in attempt_spans) == total.input_tokens == root_attrs["lowtide.usage.input_tokens"] > 0
    assert sum(attrs(s)["gen_ai.usage.output_tokens"] for s in attempt_spans) == total.output_tokens == root_attrs["lowtide.usage.output_tokens"]
    assert (root_attrs["lowtide.attempts"], root_attrs["lowtide.attempts.failed"]) == (13, 2)
    assert (root_attrs["lowtide.requests.succeeded"], root_attrs["lowtide.requests.failed"]) == (11, 1)


def test_exporting_twice_sends_the_same_trace_and_span_ids(echo_batch_job, receiver):
    first = export_trace("tickets", echo_batch_job, endpoint=receiver.url)
    ids = {(s.trace_id, s.span_id, s.parent_span_id) for s in receiver.received.spans}
    receiver.received.spans.clear()
    second = export_trace("tickets", echo_batch_job, endpoint=receiver.url + "/v1/traces", chunk=4)
    assert first.trace_id == second.trace_id
    assert {(s.trace_id, s.span_id, s.parent_span_id) for s in receiver.received.spans} == ids
    assert len(ids) == first.spans  # no two spans share an id


def test_costs_are_at_the_tier_billed_and_add_up_to_the_report(store, tmp_path, receiver):
    """openai-batch, with openai real time as the fallback; and an Anthropic batch, whose
    input tokens count cache reads and writes (gen_ai.usage.input_tokens includes them)."""
    job = stored_job(store, tmp_path, n=3, model="gpt-4o-mini", route="openai-batch", fallback={"route": "openai", "model": "gpt-4o"})
    batch = dispatch(store, job, "openai-batch", ["r0", "r1", "r2"])
    expired = Outcome("r2", False, usage=Usage(), error_code="expired", error_message="the batch expired", retryable=True)
    ingest(store, job, batch, "openai-batch", [ok("r0", input_tokens=1000, cached_input_tokens=400, output_tokens=200),
                                               ok("r1", input_tokens=2000, output_tokens=100), expired])  # fmt: skip
    direct = dispatch(store, job, "openai", ["r2"], kind="direct")
    ingest(store, job, direct, "openai", [ok("r2", input_tokens=500, output_tokens=50)], now=NOW + 60)

    export_trace("tickets", store, endpoint=receiver.url, now=NOW + 100)
    spans = receiver.received.spans
    calls = {(attrs(s)["lowtide.custom_id"], attrs(s)["lowtide.route"]): attrs(s) for s in spans if s.kind == CLIENT}
    assert calls[("r0", "openai-batch")]["lowtide.cost.picousd"] == 120_000_000  # $120 per M tokens worked out in test_report
    assert calls[("r0", "openai-batch")]["lowtide.realtime_cost.picousd"] == 240_000_000
    assert calls[("r0", "openai-batch")]["gen_ai.usage.cache_read.input_tokens"] == 400
    assert (calls[("r0", "openai-batch")]["lowtide.tier"], calls[("r2", "openai")]["lowtide.tier"]) == ("batch", "realtime")
    assert calls[("r2", "openai")]["lowtide.cost.picousd"] == 1_750_000_000
    assert calls[("r2", "openai")]["lowtide.cost.usd"] == pytest.approx(0.00175)
    assert (calls[("r2", "openai")]["gen_ai.provider.name"], calls[("r2", "openai")]["gen_ai.request.model"]) == ("openai", "gpt-4o")
    assert calls[("r2", "openai-batch")]["error.type"] == "expired" and calls[("r2", "openai-batch")]["lowtide.billed"] is False

    report = cost_report(store, job="tickets").total
    assert sum(a.get("lowtide.cost.picousd", 0) for a in calls.values()) == report.cost_picousd
    assert sum(a.get("lowtide.realtime_cost.picousd", 0) for a in calls.values()) == report.realtime_picousd
    (root,) = [s for s in spans if not s.parent_span_id]
    assert attrs(root)["lowtide.cost.picousd"] == report.cost_picousd
    assert attrs(root)["lowtide.tiers"] == "batch,realtime"
    batches = {s.name: attrs(s) for s in spans if s.parent_span_id == root.span_id}
    assert batches["batch openai-batch"]["lowtide.cost.picousd"] == 300_000_000
    assert batches["direct openai"]["lowtide.cost.picousd"] == 1_750_000_000

    claude = stored_job(store, tmp_path, name="claude", n=1, model="claude-haiku-4-5", route="anthropic-batch")
    usage = {"input_tokens": 300, "cached_input_tokens": 2000, "cache_write_tokens": 500, "output_tokens": 100}
    ingest(store, claude, dispatch(store, claude, "anthropic-batch", ["r0"]), "anthropic-batch", [ok("r0", **usage)])
    spans.clear()
    export_trace("claude", store, endpoint=receiver.url, now=NOW + 100)
    (call,) = [attrs(s) for s in spans if s.kind == CLIENT]
    assert call["gen_ai.usage.input_tokens"] == 2800 == cost_report(store, job="claude").total.input_tokens
    assert (call["gen_ai.usage.cache_read.input_tokens"], call["gen_ai.usage.cache_creation.input_tokens"]) == (2000, 500)
    assert (call["gen_ai.provider.name"], call["lowtide.cost.picousd"]) == ("anthropic", 812_500_000)


def test_a_job_still_running_ends_its_open_spans_at_the_export(store, tmp_path, receiver):
    job = stored_job(store, tmp_path, n=2, model="gpt-4o-mini", route="openai-batch")
    dispatch(store, job, "openai-batch", ["r0", "r1"])
    export_trace("tickets", store, endpoint=receiver.url, now=NOW + 500)
    spans = {s.name: s for s in receiver.received.spans}
    assert set(spans) == {"job tickets", "batch openai-batch"}  # no attempt yet
    assert spans["job tickets"].end_time_unix_nano == spans["batch openai-batch"].end_time_unix_nano == ns(NOW + 500)
    assert attrs(spans["batch openai-batch"])["lowtide.batch.state"] == "submitted"
    assert attrs(spans["job tickets"])["lowtide.requests.dispatched"] == 2


def test_a_direct_job_and_headers_reach_the_collector(sqlite_store, tmp_path, receiver):
    spec = make_spec(write_csv(tmp_path / "t.csv", ticket_rows(4)), name="direct", route="echo")
    _run(sqlite_store, spec)
    export_trace("direct", str(tmp_path / "lowtide.db"), endpoint=receiver.url, headers={"Authorization": "Basic abc"})
    assert {h.get("authorization") for h in receiver.received.headers} == {"Basic abc"}
    names = sorted(s.name for s in receiver.received.spans)
    assert names[-1] == "job direct" and "direct echo" in names and names.count("chat test-model") == 4


def test_a_refusing_collector_is_named_and_the_export_can_be_repeated(echo_batch_job, receiver):
    receiver.received.fail_next = 10**6  # 503 to every post
    started = time.monotonic()
    with pytest.raises(LowtideError) as err:
        export_trace("tickets", echo_batch_job, endpoint=receiver.url, timeout=1.0)
    assert time.monotonic() - started < 15
    message = str(err.value)
    assert f"{receiver.url}/v1/traces did not take the trace of job tickets (0 of its spans were sent before)" in message
    assert "export it again" in message
    receiver.received.fail_next = 0
    assert export_trace("tickets", echo_batch_job, endpoint=receiver.url).spans == len(receiver.received.spans) == 18


def test_endpoints_are_checked_before_anything_is_read():
    assert traces_url("http://localhost:4318/") == "http://localhost:4318/v1/traces"
    assert traces_url("https://cloud.langfuse.com/api/public/otel") == "https://cloud.langfuse.com/api/public/otel/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    with pytest.raises(InputError, match="4317 is gRPC"):
        traces_url("localhost:4317")


def test_attribute_names_are_the_installed_semantic_conventions():
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as g
    from opentelemetry.semconv.attributes import error_attributes as err

    assert traces.OPERATION == g.GEN_AI_OPERATION_NAME
    assert traces.PROVIDER == g.GEN_AI_PROVIDER_NAME
    assert traces.REQUEST_MODEL == g.GEN_AI_REQUEST_MODEL
    assert traces.INPUT_TOKENS == g.GEN_AI_USAGE_INPUT_TOKENS
    assert traces.OUTPUT_TOKENS == g.GEN_AI_USAGE_OUTPUT_TOKENS
    assert traces.CACHE_READ_TOKENS == g.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS
    assert traces.CACHE_WRITE_TOKENS == g.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
    assert traces.REASONING_TOKENS == g.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS
    assert traces.ERROR_TYPE == err.ERROR_TYPE
    ops = {"chat", "text_completion", "generate_content", "embeddings"}
    assert ops <= {v.value for v in g.GenAiOperationNameValues.__members__.values()}
    assert set(traces.PROVIDERS.values()) <= {v.value for v in g.GenAiProviderNameValues.__members__.values()}
