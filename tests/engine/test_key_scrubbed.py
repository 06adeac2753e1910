"""A provider or proxy that echoes the request's key in an error (a self-hosted server that
prints its Authorization header, a gateway's debug message) must not get the key into the
store, the events or what `lowtide status` shows: the batch routes scrub it from every
error text the engine keeps, as the direct routes did already (docs/direct-routes.md).
Against `lowtide serve` (echo backend), its fault plan answering with the key in the message."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.clock import SystemClock
from lowtide.engine.loader import load_job
from lowtide.store.schema import attempts, dispatches, events, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, ROUTES, _options, _run, serve  # noqa: F401  (the `serve` fixture)

KEY = "sk-proj-" + "Zq3xY9a1B2c3D4" * 3
BATCHES = {"openai-batch": "/v1/batches", "anthropic-batch": "/v1/messages/batches"}


def _stored_text(store) -> str:
    with store.begin() as conn:
        rows = [tuple(r) for t in (requests, attempts, dispatches, events) for r in conn.execute(sa.select(t))]
    return repr(rows)


def _job(tmp_path, route, serve, monkeypatch, rules):  # noqa: F811
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump(rules))
    url = serve("--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, KEY)  # the server takes any key; the route sends this one
    return make_spec(write_csv(tmp_path / "t.csv", ticket_rows(4)), route=route, route_options=_options(route, url))


@pytest.mark.parametrize("route", ROUTES)
def test_a_key_echoed_by_transient_errors_and_a_failed_validation_is_not_kept(route, serve, store, tmp_path, monkeypatch):  # noqa: F811
    echoed = f"bad auth header: Bearer {KEY}"
    rules = {
        "http": [
            {"match": f"POST {BATCHES[route]}", "first": 1, "status": 500, "message": echoed},  # submit_error
            {"match": f"GET {BATCHES[route]}/*", "first": 3, "status": 500, "message": echoed},  # poll_error (past the SDK's retries)
        ],
        "batches": [{"first": 1, "fail_validation": {"code": "invalid", "message": echoed}}],
    }
    spec = _job(tmp_path, route, serve, monkeypatch, rules)
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets", timeout=60)
    assert status.counts == {"failed": 4}
    stored = _stored_text(store)
    assert "[api key]" in stored
    assert re.findall(r".{0,60}" + KEY[8:20] + ".{0,20}", stored) == []  # where it leaked, if it did
    with store.begin() as conn:
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    assert {"submit_error", "poll_error"} <= kinds  # the validation failure: the batch's (OpenAI) or each request's (Anthropic)


@pytest.mark.parametrize("route", ROUTES)
def test_a_key_echoed_by_a_refused_create_is_not_kept(route, serve, store, tmp_path, monkeypatch):  # noqa: F811
    rules = {"http": [{"match": f"POST {BATCHES[route]}", "status": 401, "message": f"Incorrect API key provided: {KEY}"}]}
    spec = _job(tmp_path, route, serve, monkeypatch, rules)
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets", timeout=60)
    assert status.counts == {"failed": 4}
    with store.begin() as conn:
        said = set(conn.scalars(sa.select(requests.c.error_message)))
    assert len(said) == 1 and "Incorrect API key provided: [api key]" in said.pop()
    assert KEY not in _stored_text(store)
