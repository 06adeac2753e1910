"""`GET /metrics`: Prometheus text, parsed here, whose figures equal the store's. The store
holds an API batch on the echo backend and a priced job an `Engine` ran through the
server as its OpenAI batch provider (openai-batch, gpt-4o-mini: known batch prices)."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import pytest
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.engine.control import JobStatus
from lowtide.engine.loader import load_job
from lowtide.engine.report import cost_report
from lowtide.engine.runner import drive
from lowtide.engine.tick import Engine
from lowtide.store.db import Store
from lowtide.store.queries import dispatch_phases
from lowtide.store.schema import attempts, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.server.conftest import Running, chat_line, create_batch, wait_openai, wait_until

KEY_ENV = "LOWTIDE_TEST_PROVIDER_KEY"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, dict[frozenset, Decimal]]:
    """Prometheus text format 0.0.4 → {family: {labels: value}} (every family, samples or
    not); checks every line's shape."""
    out: dict[str, dict[frozenset, Decimal]] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge"), line
            types[name] = kind
            out[name] = {}
            continue
        if line.startswith("# HELP ") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        assert name in types, f"{name} has no TYPE line"
        pairs = LABEL.findall(labels or "")
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == (labels or ""), line
        out.setdefault(name, {})[frozenset((k, _unescape(v)) for k, v in pairs)] = Decimal(value)
    return out


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], value)


def scrape(s: Running, **headers: str) -> dict[str, dict[frozenset, Decimal]]:
    response = httpx.get(f"{s.url}/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


def labels(**kw: str) -> frozenset:
    return frozenset(kw.items())


def run_priced_job(s: Running, tmp_path, monkeypatch, name: str = "tickets", rows: int = 5) -> JobStatus:
    """A job of the server's own store on openai-batch (gpt-4o-mini), the server being its
    provider: the server runs it as an API batch (a second job, on echo) and the route
    prices the usage it reports at gpt-4o-mini's batch prices."""
    monkeypatch.setenv(KEY_ENV, s.server.config.api_keys[0] if s.server.config.api_keys else "any")
    source = write_csv(tmp_path / f"{name}.csv", ticket_rows(rows))
    options = {"base_url": f"{s.url}/v1", "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2]}
    spec = make_spec(source, name=name, model="gpt-4o-mini", route="openai-batch", route_options=options)
    store = Store(s.server.store.location)

    async def go():
        async with Engine(store) as engine:
            return await asyncio.wait_for(drive(engine, name), 120)  # a safety net, not a timing

    try:
        load_job(store, spec, SystemClock())
        # On a thread of its own: a test driving a browser (Playwright's sync API) holds an
        # event loop on this one.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, go()).result()
    finally:
        store.close()


def test_metrics_equal_the_store_after_an_api_batch_and_a_priced_job(serve, fault_plan, tmp_path, monkeypatch):
    plan = fault_plan({"http": [{"match": "GET /v1/batches/*", "first": 1, "status": 400}]})  # one failed poll
    with serve(faults=plan) as s:
        status = run_priced_job(s, tmp_path, monkeypatch)  # its first poll meets the fault
        assert status.counts == {"succeeded": 5}
        done = wait_openai(s.openai(), create_batch(s.openai(), [chat_line(f"q{i}", f"hello {i}") for i in range(3)]).id)
        m = scrape(s)
        store = s.server.store
        with store.begin() as conn:
            names = dict(conn.execute(sa.select(jobs.c.id, jobs.c.name)).all())
            by_state = conn.execute(
                sa.select(requests.c.job_id, requests.c.route, requests.c.state, sa.func.count())
                .group_by(requests.c.job_id, requests.c.route, requests.c.state)
            ).all()
            cost = conn.execute(
                sa.select(attempts.c.job_id, attempts.c.route, sa.func.sum(attempts.c.cost_picousd)).group_by(attempts.c.job_id, attempts.c.route)
            ).all()
            polls = dict(conn.execute(
                sa.select(events.c.job_id, sa.func.count()).where(events.c.kind == "poll_error").group_by(events.c.job_id)
            ).all())  # fmt: skip
        reports = {name: cost_report(store, job=name).total for name in names.values()}

    assert len(names) == 3 and {done.id, "tickets"} < set(names.values())  # and the route's API batch
    assert m["lowtide_requests"] == {labels(job=names[j], route=r, state=st): n for j, r, st, n in by_state}
    assert m["lowtide_requests"][labels(job="tickets", route="openai-batch", state="succeeded")] == 5
    assert m["lowtide_requests"][labels(job=done.id, route="echo", state="succeeded")] == 3
    assert m["lowtide_cost_usd_total"] == {labels(job=names[j], route=r): Decimal(c) / 10**12 for j, r, c in cost}
    assert m["lowtide_cost_usd_total"][labels(job="tickets", route="openai-batch")] > 0  # known batch prices
    assert m["lowtide_cost_usd_total"][labels(job=done.id, route="echo")] == 0  # echo is free: a known 0

    # Tokens, real-time equivalent and savings: `lowtide report`'s own figures, per job.
    for name, total in reports.items():
        job = {"job": name}
        assert m["lowtide_attempts_total"][labels(**job)] == total.attempts
        for kind in ("input", "cached_input", "cache_write", "output", "reasoning"):
            assert m["lowtide_tokens_total"][labels(**job, kind=kind)] == getattr(total, f"{kind}_tokens"), (name, kind)
        assert m["lowtide_realtime_equivalent_usd_total"][labels(**job)] == total.realtime_usd
        assert m["lowtide_savings_usd_total"][labels(**job)] == total.saving_usd
        assert m["lowtide_cost_unknown_attempts_total"][labels(**job)] == total.unknown == 0
    tickets = reports["tickets"]
    assert tickets.input_tokens > 0 and tickets.saving_usd > 0 and tickets.saving_percent == Decimal("50.0")

    assert polls == {j: 1 for j, n in names.items() if n == "tickets"}
    assert m["lowtide_poll_errors_total"] == {labels(job="tickets"): 1}
    assert m["lowtide_api_batches"] == {labels(api="openai", status="completed"): 2}  # ours, and the route's
    assert m["lowtide_jobs"] == {labels(state="finished"): 3}
    assert m["lowtide_batches"] == {}  # nothing live


def test_live_batches_by_phase_and_requests_in_flight(serve, gate):
    with serve(routes={"echo": gate}) as s:
        batch = create_batch(s.openai(), [chat_line(f"q{i}") for i in range(3)])
        gate.release(1)
        wait_until(lambda: s.openai().batches.retrieve(batch.id).request_counts.completed == 1, what="one request to run")
        m = scrape(s)
        with s.server.store.begin() as conn:
            job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == batch.id)).scalar_one()
            phases = dispatch_phases(conn, job_id)
        assert phases and m["lowtide_batches"] == {labels(job=batch.id, route="echo", phase=p): n for p, n in phases.items()}
        assert m["lowtide_requests"][labels(job=batch.id, route="echo", state="succeeded")] == 1
        assert m["lowtide_api_batches"] == {labels(api="openai", status="in_progress"): 1}
        assert m["lowtide_jobs"] == {labels(state="active"): 1}
        gate.release()
        wait_openai(s.openai(), batch.id)
        assert scrape(s)["lowtide_batches"] == {}


def test_metrics_need_a_key_when_keys_are_configured(serve):
    with serve(api_keys=("sekret",)) as s:
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        assert httpx.get(f"{s.url}/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert "lowtide_jobs" in scrape(s, authorization="Bearer sekret")
        assert "lowtide_jobs" in scrape(s, **{"x-api-key": "sekret"})


@pytest.mark.parametrize("value", ['a"b', "back\\slash", "new\nline"])
def test_label_values_are_escaped(value):
    from lowtide.server.metrics import Exposition

    out = Exposition()
    out.family("x_total", "counter", "help with a \\ and a\nnewline", [({"job": value}, 1)])
    assert parse(out.text()) == {"x_total": {labels(job=value): 1}}
