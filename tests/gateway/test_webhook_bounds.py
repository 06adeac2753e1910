"""Issue 34 N1/N2: a receiver that stalls or floods costs its own tenant retries and dead
letters, never another tenant's delivery time or the gateway's memory. Each attempt is its
own task (at most `per_tenant` of one tenant's at once), has one deadline over the whole
exchange, and reads at most a few KB of the answer; an answer that comes after the
attempt's claim ran out counts only while no other attempt took the delivery over. The receivers are real loopback
servers (hostile.py); the gateway's clock is the injected one."""

from __future__ import annotations

from .conftest import wait_until
from .hostile import hostile

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "call me back"}]}


def _defer(c, url: str) -> str:
    r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": f"{url}/hook"})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _delivery(g, gid: str, tenant: str = "acme") -> dict:
    return g.status(gid, tenant).json()["delivery"]


def test_a_stalled_receiver_does_not_hold_back_another_tenants_results(gateway, receiver, clock):
    """acme's receiver drips its answer's headers for ever; globex's result, finished after
    acme's attempts began, is delivered while they are still in flight."""
    hooks = {"timeout": 120, "concurrency": 4, "per_tenant": 2}
    with hostile("drip") as slow, gateway(clock=clock, webhooks=hooks) as g, g.client("acme") as acme, g.client("globex") as globex:
        stalled = [_defer(acme, slow.url) for _ in range(3)]
        wait_until(lambda: slow.requests == 2, what="acme's first two attempts at its receiver")
        gid = _defer(globex, receiver.url)
        wait_until(lambda: _delivery(g, gid, "globex")["state"] == "delivered", what="globex's delivery")
        assert [d["body"]["id"] for d in receiver.deliveries] == [gid]
        assert slow.most_open == 2  # acme's share of the slots, no more: the third waits its turn
        assert [_delivery(g, s)["attempts"] for s in stalled] == [0, 0, 0]  # acme's are still in flight


def test_a_receiver_that_never_finishes_its_answer_costs_its_own_retries_then_a_dead_letter(gateway, clock):
    with hostile("drip") as slow, gateway(clock=clock, webhooks={"timeout": 0.5, "max_attempts": 2, "backoff": 1}) as g, g.client() as c:
        gid = _defer(c, slow.url)
        first = wait_until(lambda: (d := _delivery(g, gid))["attempts"] == 1 and d, what="the first attempt's deadline")
        assert first["state"] == "pending" and "no answer within 0.5 s" in first["last_error"]
        clock.advance(2)
        g.gw.collector.wake()
        dead = wait_until(lambda: (d := _delivery(g, gid))["state"] == "dead" and d, what="the dead letter")
    assert dead["attempts"] == 2 and slow.requests == 2


def test_a_flooding_receiver_is_read_a_few_kilobytes_and_others_are_delivered(gateway, receiver, clock):
    """acme's receiver answers 200 with 600 MB; the gateway reads a few KB of it and hangs up."""
    with hostile("flood") as flood, gateway(clock=clock) as g, g.client("acme") as acme, g.client("globex") as globex:
        flooded = _defer(acme, flood.url)
        other = _defer(globex, receiver.url)
        for gid, tenant in ((flooded, "acme"), (other, "globex")):
            wait_until(lambda gid=gid, tenant=tenant: _delivery(g, gid, tenant)["state"] == "delivered", what=f"{tenant}'s delivery")
        wait_until(lambda: flood.open == 0, what="the flooding connection to close")
    assert flood.requests == 1
    # What the network took from the receiver: the gateway's reads and the kernel's buffers, not 600 MB.
    assert flood.sent < 64 * (1 << 20), flood.sent


def test_a_2xx_after_the_attempts_claim_ran_out_is_delivered_when_nobody_took_it_over(gateway, clock):
    """The gateway stalled past the claim (here the clock jumps) and no other gateway took the
    delivery: the receiver's 2xx is the delivery, not a failed attempt sent again. (Another
    gateway's takeover writes its own claim first, and then this outcome records nothing.)"""
    with hostile("hold") as held, gateway(clock=clock, webhooks={"timeout": 30, "backoff": 10}) as g, g.client() as c:
        gid = _defer(c, held.url)
        wait_until(lambda: held.requests == 1, what="the attempt at the receiver")
        clock.advance(3600)  # far past the claim (timeout + 60 s)
        held.release.set()
        after = wait_until(lambda: (d := _delivery(g, gid))["attempts"] == 1 and d, what="the attempt recorded")
    assert after["state"] == "delivered" and held.requests == 1
