"""`X-Lowtide-Defer` is a finite duration no longer than `max_defer` (24 h unless the config
says otherwise); anything else is a 400 in the API's shape and nothing is stored. A row
stored with an infinite time by an older gateway still reads back (as null), never a 500,
and still runs without stalling the collector."""

from __future__ import annotations

import json
import math
import time

import pytest

from lowtide.core.errors import SpecError
from lowtide.server.gateway import build_gateway_config
from lowtide.server.gateway.config import parse_duration
from lowtide.server.gateway.records import accepted_row, insert_accepted, new_deferred_id

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "later"}]}
MESSAGE = {"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "later"}]}


@pytest.mark.parametrize("value, says", [
    ("4" * 400, "at most 18 digits"),
    ("999999999999999999999d", "at most 18 digits"),
    ("99999999999999999d", "at most 24h"),
    ("25h", "at most 24h"),
    ("86401", "at most 24h"),
    ("inf", "expected a duration"),
    ("nan", "expected a duration"),
    ("1e9", "expected a duration"),
    ("", "expected a duration"),
])  # fmt: skip
def test_an_unbounded_or_malformed_defer_is_a_400(gateway, upstream, value, says):
    with gateway() as g, g.client() as c:
        openai_style = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": value})
        anthropic_style = c.post("/v1/messages", json=MESSAGE, headers={"X-Lowtide-Defer": value})
        listed = c.get("/v1/deferred")
    assert openai_style.status_code == 400, openai_style.text
    message = openai_style.json()["error"]["message"]
    assert message.startswith("X-Lowtide-Defer: ") and says in message and len(message) < 200
    assert anthropic_style.status_code == 400 and anthropic_style.json()["error"]["type"] == "invalid_request_error"
    assert listed.status_code == 200 and listed.json()["data"] == []  # nothing was stored
    assert upstream.calls == []  # ... nor run


def test_the_bound_is_configurable_and_24h_itself_is_fine(gateway):
    with gateway(max_defer="48h") as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "36h"})
    assert r.status_code == 202 and r.json()["deadline_at"] == pytest.approx(r.json()["created_at"] + 36 * 3600)
    with gateway() as g, g.client() as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "24h"}).status_code == 202


def test_config_waits_cannot_exceed_max_defer(tmp_path):
    with pytest.raises(SpecError, match="default_max_wait .* is over max_defer"):
        build_gateway_config({"default_max_wait": "2d"})
    with pytest.raises(SpecError, match=r"rules.0.max_wait \(30h\) is over max_defer \(24h\)"):
        build_gateway_config({"rules": [{"action": "defer", "max_wait": "30h"}]})
    assert build_gateway_config({"max_defer": "3d", "default_max_wait": "2d"}).default_max_wait == 172800


@pytest.mark.parametrize("value", ["4" * 400, 10**400, math.inf, math.nan, float("-inf")])
def test_durations_are_finite(value):
    with pytest.raises(ValueError):
        parse_duration(value)


def test_a_stored_infinite_time_does_not_break_the_status_or_the_list(gateway, clock):
    with gateway(clock=clock, collector={"flush_age": 3600}) as g, g.client() as c:
        gid = new_deferred_id()
        row = accepted_row(id=gid, tenant="acme", api="openai", model="gpt-4o-mini", payload="{}", decision="deferred",
                           callback_url=None, accepted_at=clock.now(), deadline_at=math.inf, expected_at=math.inf)  # fmt: skip
        with g.gw.store.begin() as conn:  # as a gateway before the bound stored a 400-digit defer
            insert_accepted(conn, [row])
        one = c.get(f"/v1/deferred/{gid}")
        listed = c.get("/v1/deferred")
    assert one.status_code == 200 and one.json()["deadline_at"] is None and one.json()["expected_completion_at"] is None
    assert listed.status_code == 200 and [d["id"] for d in listed.json()["data"]] == [gid]


def test_a_stored_infinite_deadline_still_runs_and_does_not_stall_the_collector(gateway):
    with gateway() as g, g.client() as c:
        gid = new_deferred_id()
        now = time.time()
        row = accepted_row(id=gid, tenant="acme", api="openai", model="gpt-4o-mini", decision="deferred",
                           payload=json.dumps({"messages": CHAT["messages"], "max_tokens": 16}),
                           callback_url=None, accepted_at=now, deadline_at=math.inf, expected_at=math.inf)  # fmt: skip
        with g.gw.store.begin() as conn:
            insert_accepted(conn, [row])
        g.gw.collector.wake()
        assert g.wait_done(gid)["status"] == "succeeded"  # alone in its flush: the deadline is infinite
        later = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h"}).json()["id"]
        assert g.wait_done(later)["status"] == "succeeded"


@pytest.mark.parametrize("api, body, field", [
    ("/v1/chat/completions", CHAT | {"max_tokens": "50"}, "max_tokens"),
    ("/v1/chat/completions", CHAT | {"max_completion_tokens": 1.5}, "max_completion_tokens"),
    ("/v1/chat/completions", CHAT | {"temperature": "hot"}, "temperature"),
    ("/v1/messages", MESSAGE | {"max_tokens": []}, "max_tokens"),
    ("/v1/messages", MESSAGE | {"max_tokens": 0}, "max_tokens"),
])  # fmt: skip
def test_a_deferred_body_its_batch_route_cannot_run_is_a_400(gateway, upstream, api, body, field):
    """A limit or temperature of the wrong type was taken (202) and failed only when its
    batch ran: on echo-batch the whole batch's ingest, every poll, so every request of its
    flush (any tenant's) stayed queued for ever. Refused at the door, naming the field."""
    with gateway(batch={"openai": {"route": "echo-batch"}, "anthropic": {"route": "echo-batch"}}) as g, g.client() as c:
        answer = c.post(api, json=body, headers={"X-Lowtide-Defer": "1h"})
        listed = c.get("/v1/deferred")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(f"{field}: must be ")
    assert listed.json()["data"] == []  # nothing was stored
