"""A gateway restarted with deferred requests pending — some not flushed yet, some in
batches in flight — loses none and delivers none twice. And a deadline the batch route
cannot meet is served by the real-time route instead."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select

from lowtide.store.db import Store
from lowtide.store.gateway_schema import gateway_flushes, gateway_requests

from .conftest import UPSTREAM_KEY, base_config, running_gateway, wait_until

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "n"}]}


def _rows(tmp_path):
    with Store(str(tmp_path / "lowtide.db")) as store, store.begin() as conn:
        return list(conn.execute(select(gateway_requests))), list(conn.execute(select(gateway_flushes)))


def test_a_restart_with_deferred_requests_pending_loses_nothing_and_delivers_nothing_twice(tmp_path, upstream, receiver):
    batch = {"openai": {"route": "echo-batch", "route_options": {"dir": str(tmp_path / "provider"), "polls_to_complete": 2},
                        "expected_turnaround": 1}}
    hold = base_config(tmp_path, upstream, batch=batch, collector={"flush_size": 10, "flush_age": 3600})
    ids = []
    with running_gateway(tmp_path, hold) as g, g.client() as c:
        def send(first: int, last: int) -> None:
            for i in range(first, last):
                body = {**CHAT, "messages": [{"role": "user", "content": f"request {i}"}]}
                r = c.post("/v1/chat/completions", json=body, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": f"{receiver.url}/hook"})
                assert r.status_code == 202
                ids.append(r.json()["id"])

        # Two flushes of 10 go out as batches; 5 requests wait for a third. (Sent in steps: a
        # flush takes every request waiting when the collector looks, which may be more than 10.)
        for n, (first, last) in enumerate([(0, 10), (10, 20)], start=1):
            send(first, last)
            wait_until(lambda n=n: sum(f.state == "running" for f in _rows(tmp_path)[1]) == n, what=f"{n} flush(es) running")
        send(20, 25)
    rows, flushes = _rows(tmp_path)
    assert Counter(r.state for r in rows) == {"queued": 20, "accepted": 5}
    assert receiver.deliveries == []  # the batches were still in flight

    go = base_config(tmp_path, upstream, batch=batch, collector={"flush_size": 10, "flush_age": 0})
    with running_gateway(tmp_path, go) as g:
        wait_until(lambda: len(receiver.deliveries) >= 25, timeout=60, what="every webhook")
        wait_until(lambda: all(r.delivery == "delivered" for r in _rows(tmp_path)[0]), what="every delivery recorded")
        with g.client() as c:
            for i, gid in enumerate(ids):
                status = c.get(f"/v1/deferred/{gid}").json()
                assert status["status"] == "succeeded"
                assert status["response"]["choices"][0]["message"]["content"] == f"request {i}"
    delivered = Counter(d["headers"]["x-lowtide-delivery"] for d in receiver.deliveries)
    assert set(delivered) == set(ids) and set(delivered.values()) == {1}  # each once
    rows, flushes = _rows(tmp_path)
    assert len(rows) == 25 and {f.state for f in flushes} == {"done"} and len(flushes) == 3
    assert {r.route for r in rows} == {"echo-batch"}


def test_a_deadline_the_batch_route_cannot_meet_is_served_in_real_time(tmp_path, upstream, gateway):
    # The batch route takes an hour (as far as the store knows); the client can wait 10 minutes.
    batch = {"openai": {"route": "echo-batch", "route_options": {"dir": str(tmp_path / "provider")},
                        "expected_turnaround": "1h", "safety_margin": "2m"}}
    with gateway(batch=batch, collector={"flush_age": "5m", "flush_size": 1000}) as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "10m"})
        assert r.status_code == 202
        accepted = r.json()
        assert accepted["expected_completion_at"] <= accepted["deadline_at"]
        done = g.wait_done(accepted["id"])
    assert done["status"] == "succeeded" and done["route"] == "openai"  # lowtide's real-time route, to the upstream
    assert done["response"]["choices"][0]["message"]["content"] == "upstream: n"
    assert upstream.calls[-1]["headers"]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert not list((tmp_path / "provider").glob("*/meta.json"))  # no batch was ever sent


def test_one_request_that_cannot_wait_does_not_cut_short_another_tenants(tmp_path, upstream, gateway):
    """`X-Lowtide-Defer: 0` from one tenant made its flush's deadline "now" for every request
    of that model waiting beside it: another tenant's requests that could wait an hour were
    failed 504 (the job's deadline had passed before they were sent), the short one too. It
    now goes alone, and is served in real time; the others wait for their batch."""
    batch = {"openai": {"route": "echo-batch", "route_options": {"dir": str(tmp_path / "provider")},
                        "expected_turnaround": "1m", "safety_margin": "1m"}}  # fmt: skip
    with gateway(batch=batch, collector={"flush_age": "30m", "flush_size": 1000}) as g, g.client("globex") as globex, g.client() as acme:
        waiting = [globex.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h"}).json()["id"] for _ in range(3)]
        now = acme.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "0"})
        assert now.status_code == 202
        done = g.wait_done(now.json()["id"])
        others = [globex.get(f"/v1/deferred/{gid}").json()["status"] for gid in waiting]
    assert done["status"] == "succeeded" and done["route"] == "openai"  # the fallback, in real time
    assert others == ["accepted"] * 3  # still waiting for a batch, their hour untouched


def test_a_deadline_failure_tells_the_caller_in_its_own_terms():
    """The engine's words for a request whose job deadline passed name the job's `deadline`
    and `lowtide retry JOB --failed`: an operator's fix, which reached the gateway's caller."""
    from types import SimpleNamespace

    from lowtide.server.gateway.shape import result_of

    row = SimpleNamespace(state="failed", error_code="deadline_passed", error_message=(
        "the job's deadline (2026-12-07T05:26:38+00:00) passed before this request was sent; raise `deadline` and run "
        "`lowtide retry JOB --failed`"))  # fmt: skip
    for api in ("openai", "anthropic"):
        body, status = result_of(api, "gw-1", "m", row, 0)
        said = body["error"]["message"]
        assert status == 504 and "deadline passed" in said and "lowtide" not in said and "JOB" not in said
