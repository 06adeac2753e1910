"""Webhooks: signed with HMAC-SHA256 over timestamp + "." + body, retried with backoff,
dead-lettered after max_attempts, visible in the status document and in the CLI."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from lowtide.cli import app as cli
from lowtide.server.gateway import sign, verify

from .conftest import SECRET, wait_until

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "call me back"}]}


def _defer(c, receiver, **headers):
    r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": f"{receiver.url}/hook", **headers})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_a_delivery_is_signed_and_the_signature_verifies(gateway, receiver):
    with gateway() as g, g.client() as c:
        gid = _defer(c, receiver)
        wait_until(lambda: receiver.deliveries, what="the webhook")
        status = wait_until(lambda: (s := g.status(gid).json())["delivery"]["state"] == "delivered" and s, what="delivered")
    hook = receiver.deliveries[0]
    h = hook["headers"]
    assert h["x-lowtide-delivery"] == gid and h["x-lowtide-event"] == "deferred.succeeded" and h["x-lowtide-attempt"] == "1"
    assert h["x-lowtide-signature"].startswith("sha256=")
    assert verify(SECRET.encode(), h["x-lowtide-timestamp"], hook["raw"], h["x-lowtide-signature"])
    assert not verify(b"another secret", h["x-lowtide-timestamp"], hook["raw"], h["x-lowtide-signature"])
    assert not verify(SECRET.encode(), h["x-lowtide-timestamp"], hook["raw"] + b" ", h["x-lowtide-signature"])
    assert not verify(SECRET.encode(), str(int(h["x-lowtide-timestamp"]) + 1), hook["raw"], h["x-lowtide-signature"])
    body = hook["body"]
    assert body["id"] == gid and body["status"] == "succeeded"
    assert body["response"]["choices"][0]["message"]["content"] == "call me back"
    assert "delivery" not in body and status["delivery"]["attempts"] == 1


def test_a_failed_delivery_is_retried_with_backoff_until_it_lands(gateway, receiver, clock):
    receiver.fail = 2
    with gateway(clock=clock, webhooks={"backoff": 10, "max_backoff": 600}) as g, g.client() as c:
        gid = _defer(c, receiver)
        wait_until(lambda: len(receiver.deliveries) == 1, what="the first attempt")
        first = wait_until(lambda: (s := g.status(gid).json())["delivery"]["attempts"] == 1 and s, what="attempt 1 recorded")
        assert first["delivery"]["state"] == "pending" and first["delivery"]["last_error"] == "HTTP 500"
        clock.advance(5)  # not due yet: 10 s ± 20 %
        g.gw.collector.wake()
        assert len(receiver.deliveries) == 1
        clock.advance(8)
        wait_until(lambda: len(receiver.deliveries) == 2, what="the second attempt")
        wait_until(lambda: g.status(gid).json()["delivery"]["attempts"] == 2, what="attempt 2 recorded")
        clock.advance(25)  # 20 s ± 20 % after the second
        wait_until(lambda: g.status(gid).json()["delivery"]["state"] == "delivered", what="the third attempt")
    attempts = [d["headers"]["x-lowtide-attempt"] for d in receiver.deliveries]
    assert attempts == ["1", "2", "3"]
    assert {d["headers"]["x-lowtide-delivery"] for d in receiver.deliveries} == {gid}  # one idempotency key


def test_after_max_attempts_a_delivery_is_a_dead_letter(gateway, receiver, clock, tmp_path):
    receiver.fail = 100
    with gateway(clock=clock, webhooks={"max_attempts": 2, "backoff": 1}) as g, g.client() as c:
        gid = _defer(c, receiver)
        wait_until(lambda: len(receiver.deliveries) == 1, what="the first attempt")
        wait_until(lambda: g.status(gid).json()["delivery"]["attempts"] == 1, what="attempt 1 recorded")
        clock.advance(2)
        status = wait_until(lambda: (s := g.status(gid).json())["delivery"]["state"] == "dead" and s, what="dead letter")
        assert status["status"] == "succeeded"  # the result itself is still there to GET
        assert "lowtide_gateway_dead_letters 1" in c.get("/metrics").text
        clock.advance(3600)
        g.gw.collector.wake()
    assert len(receiver.deliveries) == 2  # no more attempts after it died
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "lowtide.db"), "gateway-status"])
    assert result.exit_code == 0, result.output
    assert "dead letters" in result.output and gid in result.output and "HTTP 500" in result.output
    # README: every table-printing command takes --json
    shape = json.loads(CliRunner().invoke(cli, ["--db", str(tmp_path / "lowtide.db"), "gateway-status", "--json"]).stdout)
    assert shape["requests"]["delivery"] == {"dead": 1} and shape["redelivered"] is None
    assert [(d["id"], d["attempts"]) for d in shape["dead_letters"]] == [(gid, 2)] and "HTTP 500" in shape["dead_letters"][0]["last_error"]
    again = CliRunner().invoke(cli, ["--db", str(tmp_path / "lowtide.db"), "gateway-status", "--redeliver"])
    assert "1 dead-letter" in again.output


def test_without_a_webhook_secret_callbacks_are_refused(gateway, receiver, monkeypatch):
    monkeypatch.delenv("GW_TEST_WEBHOOK_SECRET")
    with gateway() as g, g.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": f"{receiver.url}/hook"})
        assert r.status_code == 400 and "GW_TEST_WEBHOOK_SECRET" in r.json()["error"]["message"]
        assert c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h"}).status_code == 202


def test_the_delivered_body_is_the_status_document(gateway, receiver):
    with gateway() as g, g.client() as c:
        gid = _defer(c, receiver)
        wait_until(lambda: receiver.deliveries, what="the webhook")
        status = g.status(gid).json()
    status.pop("delivery")
    assert json.loads(receiver.deliveries[0]["raw"]) == status


def test_verify_is_false_for_malformed_headers_and_never_raises():
    body, now = b'{"id":"dfr_x"}', time.time()
    stamp = str(int(now))
    good = sign(SECRET.encode(), stamp, body)
    assert verify(SECRET.encode(), stamp, body, good)
    for timestamp, signature in [(stamp, "sha256=é" + good[8:]), (stamp, "sha256=" + "☃" * 64), (stamp, good.encode()[:-1] + b"\xff"),
                                 ("１７００", good), ("nan", good), ("inf", good), ("", good), (stamp, "")]:  # fmt: skip
        assert verify(SECRET.encode(), timestamp, body, signature) is False


def test_verify_refuses_a_replay_even_when_the_caller_gives_no_clock():
    body = b'{"id":"dfr_x"}'
    old = str(int(time.time()) - 3600)  # an hour-old delivery, signed correctly, sent again
    signature = sign(SECRET.encode(), old, body)
    assert verify(SECRET.encode(), old, body, signature) is False
    assert verify(SECRET.encode(), old, body, signature, tolerance=7200) is True
    assert verify(SECRET.encode(), old, body, signature, now=float(old) + 1) is True
