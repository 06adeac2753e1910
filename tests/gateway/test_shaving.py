"""Shaving under load: requests that may wait but prefer real time are deferred while the
upstream's load is above its threshold; urgent ones always pass. Load is driven by real
requests and the injected clock (no sleeps), or by the tracker's counters."""

from __future__ import annotations

import re

from .conftest import KEYS

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
PREFER = {"X-Lowtide-Defer": "2h", "X-Lowtide-Prefer": "realtime"}


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in the metrics"
    return float(m.group(1))


def test_shaving_switches_on_above_the_rpm_threshold_and_off_when_the_minute_passes(gateway, upstream, clock):
    upstreams = {"openai": {"base_url": f"{upstream.url}/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY",
                            "limits": {"rpm": 4, "threshold": 0.75}}}
    with gateway(clock=clock, upstreams=upstreams) as g, g.client() as c:
        first = [c.post("/v1/chat/completions", json=CHAT, headers=PREFER) for _ in range(3)]  # load 3/4 after these
        assert [r.status_code for r in first] == [200, 200, 200]
        shaved = c.post("/v1/chat/completions", json=CHAT, headers=PREFER)
        assert shaved.status_code == 202 and shaved.json()["decision"] == "shaved"
        assert shaved.headers["x-lowtide-decision"] == "shaved"
        assert shaved.headers["x-lowtide-reason"] == "upstream load 0.75 >= threshold 0.75 (requests in the last 60 s 3/4)"
        urgent = c.post("/v1/chat/completions", json=CHAT)  # no header: urgent, always passes
        assert urgent.status_code == 200
        deferred = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "2h"})
        assert deferred.json()["decision"] == "deferred"  # asked to wait: deferred whatever the load
        assert deferred.headers["x-lowtide-reason"] == "defer by header"
        clock.advance(61)  # the minute's requests leave the window
        assert c.post("/v1/chat/completions", json=CHAT, headers=PREFER).status_code == 200
        assert len(upstream.calls) == 5
        done = g.wait_done(shaved.json()["id"])
        assert done["status"] == "succeeded" and done["decision"] == "shaved"
        text = c.get("/metrics").text
    assert 'lowtide_gateway_requests_total{api="openai",decision="shaved"} 1' in text
    assert 'lowtide_gateway_requests_total{api="openai",decision="realtime"} 5' in text
    assert metric(text, "lowtide_gateway_shaved_ratio") == 1 / 7
    assert metric(text, "lowtide_gateway_saved_usd_total") > 0  # gpt-4o-mini's real-time price, not paid


def test_a_429_from_the_upstream_shaves_a_request_that_prefers_real_time(gateway, upstream, clock):
    with gateway(clock=clock) as g, g.client() as c:
        upstream.rate_limited = 2
        met_429 = c.post("/v1/chat/completions", json=CHAT, headers=PREFER)
        assert met_429.status_code == 202 and met_429.json()["decision"] == "shaved"  # not a 429 to the client
        assert met_429.headers["x-lowtide-reason"] == "the upstream answered 429 in real time"
        assert len(upstream.calls) == 1
        during = c.post("/v1/chat/completions", json=CHAT, headers=PREFER)
        assert during.status_code == 202 and len(upstream.calls) == 1  # cooling down: not even tried
        assert during.headers["x-lowtide-reason"] == (
            "upstream load 1.00 >= threshold 0.8 (the upstream answered 429 0 s ago; cooldown_after_429 30 s)")
        urgent = c.post("/v1/chat/completions", json=CHAT)
        assert urgent.status_code == 429  # urgent requests pass, and so do the upstream's answers
        clock.advance(31)  # past cooldown_after_429 (30 s) of the last 429
        after = c.post("/v1/chat/completions", json=CHAT, headers=PREFER)
        assert after.status_code == 200
        assert 'lowtide_gateway_upstream_rate_limited_total{api="openai"} 2' in c.get("/metrics").text


def test_in_flight_and_token_limits_count_too(gateway, upstream, clock):
    upstreams = {"openai": {"base_url": f"{upstream.url}/v1", "api_key_env": "GW_TEST_UPSTREAM_KEY",
                            "limits": {"max_in_flight": 10, "tpm": 1000, "threshold": 0.8}}}
    with gateway(clock=clock, upstreams=upstreams) as g, g.client() as c:
        load = g.gw.loads["openai"]
        load.in_flight = 8  # eight long requests still running upstream
        assert c.post("/v1/chat/completions", json=CHAT, headers=PREFER).json()["decision"] == "shaved"
        load.in_flight = 0
        big = {**CHAT, "max_tokens": 900}  # a provider's limiter counts max_tokens up front
        assert c.post("/v1/chat/completions", json=big, headers=PREFER).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT, headers=PREFER).status_code == 202
        clock.advance(60)
        assert c.post("/v1/chat/completions", json=CHAT, headers=PREFER).status_code == 200


def test_a_rule_can_say_deferrable_but_prefers_real_time(gateway, upstream, clock):
    rules = [{"match": {"tenant": "globex"}, "action": "prefer_realtime", "max_wait": "1h"}]
    with gateway(clock=clock, rules=rules) as g:
        g.gw.loads["openai"].last_429 = clock.now()
        with g.client("globex") as c:
            assert c.post("/v1/chat/completions", json=CHAT).json()["decision"] == "shaved"
        with g.client("acme") as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert KEYS  # both tenants exist
