"""The gateway's simulation: `lowtide gateway` in front of `lowtide serve`, its deferred
requests flushed into lowtide jobs on openai-batch and anthropic-batch, ticked, collected
and delivered by webhook, while Hypothesis draws clients, provider faults, crashes,
restarts, a failing receiver, clock steps and the operator's actions. After every step the
engine's invariants (invariants.py) and the gateway's own (below) are checked; at the end
a drain must bring every deferred request to a terminal state and deliver each result once.

    from tests.sim.gateway import run
    run("sqlite", seed=1, examples=4, steps=30)

The gateway runs in this process on the world's clock and event loop: its HTTP side through
httpx's ASGI transport (the hot path, the group writer), its collector not started
(`create_gateway_app(run_collector=False)`), so each of its passes is a step drawn here and
nothing races the test. Its batch routes and its real-time fallback are the main provider's
(world.Provider), as a job's are in machine.py.

The gateway's invariants (each a sentence per violation):

- kept:       every request answered 202 has its row (tenant, API, body), and no row was
              stored that was not answered 202
- columns:    a row's state and columns agree: accepted ⇒ in no flush; queued ⇒ in a flush
              still loading or running (one done leaves it queued for ever); succeeded or
              failed ⇒ its result and finish time; delivery `none` exactly when it has no
              callback, and delivered or dead only once finished
- one job:    a flush holds the rows it counted; once loaded, its job holds one request per
              row and no other, and a finished row agrees with its request (succeeded with
              succeeded, failed with failed or cancelled)
- quota:      each tenant's pending count (in memory, what `max_pending` is checked against)
              is its rows still accepted or queued
- delivered:  the receiver took (2xx) at most one POST per row, only of a finished row, with
              that row's status; a row is `delivered` exactly when the receiver took it;
              `dead` only after max_attempts failed attempts

and, at the step that meets them: a call that may wait is answered 202, or 429 only when its
tenant's quota is full (`defer`); a status read shows the owner the row as stored and the
other tenant a 404 (`status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import hypothesis.strategies as st
import sqlalchemy as sa
from hypothesis.stateful import initialize, invariant, rule

from lowtide.engine.control import cancel_job
from lowtide.server.faults import FaultPlan
from lowtide.server.gateway import build_gateway_config, create_gateway_app, records
from lowtide.server.gateway.tenants import sha256_hex
from lowtide.store.gateway_schema import gateway_flushes, gateway_requests
from lowtide.store.schema import jobs, requests
from tests.sim import invariants
from tests.sim.machine import Example, fault_plan, run_machine
from tests.sim.world import (
    KEY_ENV,
    NOTIFY_ENV,
    REALTIME_CALLS,
    REALTIME_MODELS,
    ROUTE_MODELS,
    KillPoint,
    Receiver,
    World,
)

TENANTS = {"acme": "sk-gw-acme-5c1d7e2f", "globex": "sk-gw-globex-8a3b4c9d"}
ROUTES = {"openai": "openai-batch", "anthropic": "anthropic-batch"}
MODELS = {"openai": ROUTE_MODELS["openai-batch"], "anthropic": ROUTE_MODELS["anthropic-batch"]}
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
MAX_ATTEMPTS = 3  # webhooks.max_attempts
MAX_PENDING = 12  # acme's quota of unfinished deferred requests
# Faults at the provider the gateway's batches and fallback meet (machine.FAULTS, less the
# account's queue limit, which the gateway does not configure).
FAULTS = ("none", "fail_validation", "expire", "drop_lines", "duplicate_lines", "corrupt_lines", "create_429", "poll_500",
          "lost_create", "realtime_500", "realtime_429")  # fmt: skip


def gateway_fault_plan(kind: str, route: str) -> FaultPlan:
    """machine.fault_plan's, and `realtime_429`: the upstream's real time answers 429 twice
    (a call that prefers real time is then shaved into a batch; a fallback retries)."""
    if kind == "realtime_429":
        return FaultPlan.model_validate({"http": [{"match": call, "first": 2, "status": 429, "retry_after": 0} for call in REALTIME_CALLS]})
    return fault_plan(kind, route, {})


DRAIN_ROUNDS = 60
STUCK = 8


class CallbackReceiver(Receiver):
    """Where deferred results are delivered: answers 200, or 500 while it is failing."""

    def __init__(self):
        self.failing = False
        super().__init__("/hook", lambda: 500 if self.failing else 200)

    def deliveries(self) -> list[dict[str, Any]]:
        """Each POST: the delivery id it named, the id and status its body carried, the answer."""
        out = []
        for headers, raw, answered in self.posts:
            body = json.loads(raw)
            out.append({"id": headers.get("x-lowtide-delivery"), "body_id": body.get("id"), "status": body.get("status"),
                        "answered": answered})  # fmt: skip
        return out

    def taken(self) -> Counter[str]:
        return Counter(d["id"] for d in self.deliveries() if d["answered"] < 300)


@dataclass
class Sent:
    """A request the gateway answered 202."""

    tenant: str
    api: str
    text: str
    callback: bool


@dataclass
class GatewayWorld:
    """The simulation's world (world.World: client store, providers, clock, loop) with a
    gateway on its store, stepped by hand."""

    root: Path
    store_url: str
    world: World = field(init=False)
    receiver: CallbackReceiver = field(init=False)
    sent: dict[str, Sent] = field(default_factory=dict)
    generation: int = 0

    def __post_init__(self):
        self.world = World(self.root, self.store_url)
        self.receiver = CallbackReceiver()
        self._lifespan: contextlib.AsyncExitStack | None = None
        self.start()

    # The gateway -----------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        main = self.world.providers["main"].url
        # The fallback named as the gateway would derive it from `upstreams` (the upstream's real
        # time through lowtide's route), but for its retries' pause: no wall-clock waits.
        pause = [0.001, 0.002]
        batch = {}
        for api, route in ROUTES.items():
            options = self.world.route_options(route, 4)
            realtime = self.world.realtime(route)
            batch[api] = {"route": route, "route_options": options, "expected_turnaround": "1h", "safety_margin": "10m",
                          "max_attempts": 3,
                          "fallback": {"route": realtime["route"], "route_options": realtime["route_options"] | {"retry_backoff": pause},
                                       "model": REALTIME_MODELS[realtime["route"]]}}  # fmt: skip
        return {
            "data_dir": str(self.root / "gateway-data"),
            "upstreams": {"openai": {"base_url": f"{main}/v1", "api_key_env": KEY_ENV},
                          "anthropic": {"base_url": main, "api_key_env": KEY_ENV}},  # fmt: skip
            "batch": batch,
            "collector": {"flush_size": 5, "flush_age": "10m", "max_job_requests": 6},
            # acme's unfinished requests are bounded (a 429 beyond); globex's calls without a
            # defer header prefer real time, and are deferred (shaved) when the upstream answers 429.
            "tenants": [{"name": name, "key_sha256": sha256_hex(key)} | ({"quotas": {"max_pending": MAX_PENDING}} if name == "acme" else {})
                        for name, key in TENANTS.items()],
            "rules": [{"match": {"tenant": "globex"}, "action": "prefer_realtime", "max_wait": "2h"}],
            "callbacks": {"allow_loopback": True},
            "webhooks": {"secret_env": NOTIFY_ENV, "backoff": 30.0, "max_backoff": 600.0, "max_attempts": MAX_ATTEMPTS},
        }

    def start(self) -> None:
        """A gateway process on the store: its lifespan (writer, upstream clients, pending
        counts read from the store) entered on the world's loop."""
        self.generation += 1
        self.app = create_gateway_app(build_gateway_config(self.config()), db=self.store_url, clock=self.world.clock,
                                      run_collector=False)  # fmt: skip
        fastapi_app = self.app.app
        self._lifespan = contextlib.AsyncExitStack()
        self.world.run(self._lifespan.enter_async_context(fastapi_app.router.lifespan_context(fastapi_app)))
        # The deliveries' backoff jitter drawn from a seeded generator: a replayed example
        # retries at the same times (the gateway's own is unseeded, as a process's should be).
        assert self.gw.collector is not None
        self.gw.collector.deliverer.rng = random.Random(self.generation)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://gateway.test", timeout=30)

    @property
    def gw(self):
        return self.app.state.gateway

    def stop(self) -> None:
        """The gateway stops (its writer commits what it took; deliveries in flight are handed back)."""
        self.world.run(self.http.aclose())
        if self._lifespan is not None:
            self.world.run(self._lifespan.aclose())
            self._lifespan = None

    def restart(self) -> None:
        """Another gateway process on the same store, its collector on a fresh engine."""
        self.stop()
        old, self.world.engine = self.world.engine, self.world._new_engine()
        self.world.run(old.aclose())
        self.start()

    # Steps -------------------------------------------------------------------------------
    def call(self, api: str, tenant: str, text: str, defer: str | None, callback: bool) -> httpx.Response:
        body: dict[str, Any] = {"model": MODELS[api], "max_tokens": 32, "messages": [{"role": "user", "content": text}]}
        headers = {"authorization": f"Bearer {TENANTS[tenant]}"}
        if defer is not None:
            headers["x-lowtide-defer"] = defer
        if callback:
            headers["x-lowtide-callback"] = self.receiver.url
        return self.world.run(self.http.post(PATHS[api], json=body, headers=headers))

    def collect(self) -> bool:
        """One pass of the collector: flush, load, tick each running flush's job, collect."""
        assert self.gw.collector is not None
        return self.world.run(self.gw.collector.step(self.world.engine))

    def collect_killed(self, kill: KillPoint) -> bool:
        """A pass that dies at its `kill`-th route call (the process crashed there); the next
        gateway, on the same store, carries on. Whether it died."""
        engine = self.world.engine
        engine.kill, engine.calls = kill, 0
        assert self.gw.collector is not None
        task = self.world.loop.create_task(self.gw.collector.step(engine))
        try:
            self.world.loop.run_until_complete(task)
            died = False
        except asyncio.CancelledError:
            died = True
        engine.kill = None
        if died:
            self.restart()
        return died

    def deliver(self) -> int:
        assert self.gw.collector is not None
        return self.world.run(self.gw.collector.deliverer.run_due())

    def round(self, seconds: float) -> None:
        self.collect()
        self.deliver()
        self.world.serve_step()
        self.world.clock.advance(seconds)

    def close(self) -> None:
        try:
            self.stop()  # its lifespan closes its store
        finally:
            self.receiver.stop()
            self.world.close()


# The gateway's invariants ------------------------------------------------------------------


def _rows(gworld: GatewayWorld) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
    with gworld.world.store.read() as conn:
        rows = conn.execute(sa.select(gateway_requests)).all()
        flushes = conn.execute(sa.select(gateway_flushes)).all()
        names = [f.job_name for f in flushes]
        held = conn.execute(
            sa.select(jobs.c.name, requests.c.custom_id, requests.c.state).join(jobs, jobs.c.id == requests.c.job_id)
            .where(jobs.c.name.in_(names))
        ).all() if names else []  # fmt: skip
    by_job: dict[str, list[Any]] = {}
    for r in held:
        by_job.setdefault(r.name, []).append(r)
    return rows, flushes, by_job


def gateway_checks(gworld: GatewayWorld) -> list[str]:
    out: list[str] = []
    rows, flushes, by_job = _rows(gworld)
    by_id = {r.id: r for r in rows}
    sent = gworld.sent
    # kept
    for gid in sent.keys() - by_id.keys():
        out.append(f"kept: {gid} was answered 202 and has no row")
    for gid in by_id.keys() - sent.keys():
        out.append(f"kept: row {gid} was never answered 202")
    for gid, s in sent.items():
        r = by_id.get(gid)
        if r is not None and (r.tenant, r.api) != (s.tenant, s.api):
            out.append(f"kept: {gid} stored as {r.tenant}/{r.api}, sent by {s.tenant}/{s.api}")
        elif r is not None and s.text not in r.payload:
            out.append(f"kept: {gid}'s stored body lost its text {s.text!r}")
    # columns
    flush_state = {f.id: f.state for f in flushes}
    for r in rows:
        finished = r.state in ("succeeded", "failed")
        if r.state == "accepted" and r.flush_id is not None:
            out.append(f"columns: {r.id} accepted but in flush {r.flush_id}")
        if r.state == "queued" and flush_state.get(r.flush_id) not in ("loading", "running"):
            out.append(f"columns: {r.id} queued in flush {r.flush_id}, which is {flush_state.get(r.flush_id)}: it stays queued for ever")
        if finished and (r.result is None or r.finished_at is None or r.result_status is None):
            out.append(f"columns: {r.id} {r.state} without its result or finish time")
        if r.state not in ("accepted", "queued", "succeeded", "failed"):
            out.append(f"columns: {r.id} in unknown state {r.state!r}")
        if (r.delivery == "none") != (r.callback_url is None):
            out.append(f"columns: {r.id} delivery {r.delivery} with callback {r.callback_url!r}")
        if r.delivery in ("delivered", "dead") and not finished:
            out.append(f"columns: {r.id} delivery {r.delivery} while {r.state}")
    # one job
    members: dict[int, list[Any]] = {}
    for r in rows:
        if r.flush_id is not None:
            members.setdefault(r.flush_id, []).append(r)
    for f in flushes:
        mine = members.get(f.id, [])
        if len(mine) != f.size:
            out.append(f"one_job: flush {f.job_name} counted {f.size} rows, holds {len(mine)}")
        held = by_job.get(f.job_name)
        if held is None:  # not loaded yet, or never: a flush that could not be loaded fails its rows
            if f.state == "running" or (f.state == "done" and any(r.state != "failed" for r in mine)):
                out.append(f"one_job: flush {f.job_name} is {f.state} and has no job")
            continue
        ids = Counter(h.custom_id for h in held)
        out += [f"one_job: {c} has {n} requests in {f.job_name}" for c, n in ids.items() if n > 1]
        out += [f"one_job: {f.job_name} holds request {c} of no row of its flush" for c in ids.keys() - {r.id for r in mine}]
        out += [f"one_job: {r.id} of {f.job_name} has no request in its job" for r in mine if r.id not in ids]
        state_of = {h.custom_id: h.state for h in held}
        for r in mine:
            job_state = state_of.get(r.id)
            if r.state == "succeeded" and job_state != "succeeded":
                out.append(f"one_job: {r.id} succeeded, its request is {job_state}")
            if r.state == "failed" and job_state not in ("failed", "cancelled"):
                out.append(f"one_job: {r.id} failed, its request is {job_state}")
    # quota
    live = Counter(r.tenant for r in rows if r.state in records.LIVE_STATES)
    counted = {t: n for t, n in gworld.gw.tenants.pending.items() if n}
    if counted != dict(live):
        out.append(f"quota: the gateway counts {counted} pending by tenant; the store holds {dict(live)}")
    # delivered
    taken = gworld.receiver.taken()
    for gid, n in taken.items():
        if n > 1:
            out.append(f"delivered: the receiver took {gid} {n} times")
        r = by_id.get(gid)
        if r is None or r.delivery != "delivered":
            out.append(f"delivered: the receiver took {gid}, whose delivery is {None if r is None else r.delivery}")
    for p in gworld.receiver.deliveries():
        r = by_id.get(p["id"])
        if p["body_id"] != p["id"] or r is None or p["status"] not in ("succeeded", "failed") or p["status"] != r.state:
            out.append(f"delivered: a POST for {p['id']} carried {p['body_id']} in status {p['status']} (row: {None if r is None else r.state})")
    for r in rows:
        if r.delivery == "delivered" and not taken.get(r.id):
            out.append(f"delivered: {r.id} recorded delivered; the receiver never took it")
        if r.delivery == "dead" and r.delivery_attempts < MAX_ATTEMPTS:
            out.append(f"delivered: {r.id} dead after {r.delivery_attempts} attempt(s)")
    return out


def check_step(gworld: GatewayWorld) -> list[str]:
    return invariants.check_step(gworld.world) + [f"gateway_{v}" for v in gateway_checks(gworld)]


def check_drained(gworld: GatewayWorld) -> list[str]:
    """After the drain: every deferred request finished, every flush done, every callback
    delivered (the receiver answers each once it works), a succeeded answer being the echo
    of what was asked; and the engine's drained checks over the flushes' jobs."""
    out = []
    rows, flushes, _ = _rows(gworld)
    out += [f"drain: {r.id} still {r.state}" for r in rows if r.state not in ("succeeded", "failed")]
    out += [f"drain: flush {f.job_name} still {f.state}" for f in flushes if f.state != "done"]
    out += [f"drain: {r.id}'s delivery still {r.delivery}" for r in rows if r.delivery not in ("none", "delivered")]
    for r in rows:
        if r.state != "succeeded":
            continue
        answer = json.loads(r.result)
        said = answer["choices"][0]["message"]["content"] if r.api == "openai" else answer["content"][0]["text"]
        if said != gworld.sent[r.id].text:
            out.append(f"drain: {r.id} answered {said!r} to {gworld.sent[r.id].text!r}")
    out += [f"drain: {v} (a tenant's key)" for v in invariants.no_secrets(gworld.world, tuple(TENANTS.values()))]
    return out + invariants.check_drained(gworld.world) + check_step(gworld)


# The machine --------------------------------------------------------------------------------


class GatewayMachine(Example):
    """One example: a fresh world and gateway, then drawn steps."""

    name = "gwsim"
    steps_run = 0

    def __init__(self):
        super().__init__()
        self.g = GatewayWorld(self.root, self.store_url)
        self._exit.callback(self.g.close)
        self.n = 0
        self.fault = ("none", ROUTES["openai"])  # the provider's fault plan now: kind, route

    def _send(self, api: str, tenant: str, defer: str | None, callback: bool) -> None:
        self.n += 1
        text = f"request {self.n} of {tenant}"
        answer = self.g.call(api, tenant, text, defer, callback)
        hypothesis.note(f"{api} {tenant} defer={defer}: {answer.status_code}")
        if answer.status_code == 202:
            self.g.sent[answer.json()["id"]] = Sent(tenant, api, text, callback)
            return
        if defer is None:  # run now: the upstream's answer, whatever it is
            return
        # A call that must wait is stored, or refused by its tenant's quota alone, never run now.
        live = sum(1 for gid, s in self.g.sent.items() if s.tenant == tenant and self._unfinished(gid))
        if answer.status_code != 429 or tenant != "acme" or live < MAX_PENDING:
            found = f"gateway_defer: a deferrable call of {tenant} ({live} unfinished) was answered {answer.status_code}: {answer.text[:300]}"
            raise invariants.violation([found], "sending")

    def _unfinished(self, gid: str) -> bool:
        with self.g.world.store.read() as conn:
            state = conn.scalar(sa.select(gateway_requests.c.state).where(gateway_requests.c.id == gid))
        return state in records.LIVE_STATES

    @initialize(api=st.sampled_from(list(ROUTES)), count=st.integers(1, 6))
    def setup(self, api: str, count: int) -> None:
        for _ in range(count):
            self._send(api, "acme", "2h", True)

    @rule(api=st.sampled_from(list(ROUTES)), tenant=st.sampled_from(list(TENANTS)), count=st.integers(1, 5),
          wait=st.sampled_from(["15m", "2h", "1d"]), callback=st.booleans())  # fmt: skip
    def defer(self, api: str, tenant: str, count: int, wait: str, callback: bool) -> None:
        """Clients send calls that may wait `wait` (X-Lowtide-Defer), with a callback or not."""
        for _ in range(count):
            self._send(api, tenant, wait, callback)

    @rule(api=st.sampled_from(list(ROUTES)), busy=st.booleans())
    def realtime(self, api: str, busy: bool) -> None:
        """A call without a defer header (globex's prefer real time): forwarded to the
        upstream; `busy`, the upstream answers it 429, and the gateway shaves it into a batch
        (202, decision `shaved`)."""
        if busy:
            self.g.world.set_faults(gateway_fault_plan("realtime_429", ROUTES[api]))
        self._send(api, "globex", None, False)
        if busy:
            self.g.world.set_faults(gateway_fault_plan(*self.fault))

    @rule(which=st.integers(0, 10**6))
    def status(self, which: int) -> None:
        """`GET /v1/deferred/{id}`: its owner reads the row as stored; the other tenant is told
        no such request (another tenant's id is as unknown as a wrong one)."""
        if not self.g.sent:
            return
        gid = sorted(self.g.sent)[which % len(self.g.sent)]
        owner = self.g.sent[gid].tenant
        other = next(t for t in TENANTS if t != owner)
        mine, theirs = (self.g.world.run(self.g.http.get(f"/v1/deferred/{gid}", headers={"authorization": f"Bearer {TENANTS[t]}"}))
                        for t in (owner, other))  # fmt: skip
        with self.g.world.store.read() as conn:
            state = conn.scalar(sa.select(gateway_requests.c.state).where(gateway_requests.c.id == gid))
        found = []
        if mine.status_code != 200 or mine.json()["status"] != state:
            found.append(f"gateway_status: {owner} reads {gid} as {mine.status_code} {mine.text[:200]}; stored {state}")
        if theirs.status_code != 404:
            found.append(f"gateway_status: {other} reads {owner}'s {gid}: {theirs.status_code}")
        if found:
            raise invariants.violation(found, "reading a deferred request's status")

    @rule()
    def collect(self) -> None:
        self.g.collect()

    @rule(call=st.integers(1, 6), after=st.booleans())
    def crash(self, call: int, after: bool) -> None:
        """The gateway dies at its call-th route call of a collector pass; a new one starts."""
        died = self.g.collect_killed(KillPoint(call, after))
        hypothesis.note(f"crash at call {call} ({'after' if after else 'before'}): {'died' if died else 'pass ended first'}")

    @rule()
    def restart(self) -> None:
        """The gateway is stopped (a deploy) and started again on the same store."""
        self.g.restart()

    @rule()
    def deliver(self) -> None:
        self.g.deliver()

    @rule(failing=st.booleans())
    def receiver(self, failing: bool) -> None:
        self.g.receiver.failing = failing

    @rule()
    def serve_step(self) -> None:
        self.g.world.serve_step()

    @rule(seconds=st.sampled_from([1, 60, 600, 3600, 6 * 3600]))
    def advance(self, seconds: int) -> None:
        self.g.world.clock.advance(seconds)

    @rule(rounds=st.integers(1, 4), seconds=st.sampled_from([60, 600, 1800]))
    def run_a_while(self, rounds: int, seconds: int) -> None:
        for _ in range(rounds):
            self.g.round(seconds)

    @rule(kind=st.sampled_from(FAULTS), api=st.sampled_from(list(ROUTES)))
    def faults(self, kind: str, api: str) -> None:
        self.fault = (kind, ROUTES[api])
        self.g.world.set_faults(gateway_fault_plan(*self.fault))

    @rule(which=st.integers(0, 3))
    def cancel_flush(self, which: int) -> None:
        """The operator cancels a flush's job (`lowtide cancel gateway-N`): its requests end
        failed, said in their result, and are delivered so."""
        with self.g.world.store.read() as conn:
            names = conn.scalars(sa.select(gateway_flushes.c.job_name).where(gateway_flushes.c.state == "running")
                                 .order_by(gateway_flushes.c.id)).all()  # fmt: skip
        if names:
            name = names[which % len(names)]
            n = cancel_job(self.g.world.store, name, self.g.world.clock)
            hypothesis.note(f"cancelled {name}: {n}")

    @rule()
    def redeliver(self) -> None:
        """`lowtide gateway-status --redeliver`: every dead letter is due again."""
        with self.g.world.store.begin() as conn:
            records.redeliver_dead(conn, self.g.world.clock.now())

    @invariant()
    def holds(self) -> None:
        GatewayMachine.steps_run += 1
        found = check_step(self.g)
        if found:
            raise invariants.violation(found, "invariants broken")

    def _shape(self) -> tuple:
        with self.g.world.store.read() as conn:
            g = gateway_requests.c
            return tuple(conn.execute(sa.select(g.state, g.delivery, sa.func.count()).group_by(g.state, g.delivery)
                                      .order_by(g.state, g.delivery)).all())  # fmt: skip

    def _settled(self) -> bool:
        rows, flushes, _ = _rows(self.g)
        return all(r.state in ("succeeded", "failed") and r.delivery in ("none", "delivered", "dead") for r in rows) and all(
            f.state == "done" for f in flushes
        )

    def drain(self) -> list[str]:
        """Faults cleared, the receiver working, dead letters queued again; then rounds of a
        collector pass, deliveries, a provider step and ten minutes, until every deferred
        request is finished and delivered, or nothing changed for STUCK rounds."""
        self.g.world.clear_faults()
        self.g.receiver.failing = False
        self.redeliver()
        same, last = 0, None
        for _ in range(DRAIN_ROUNDS):
            self.g.round(600 if same < 3 else 6 * 3600)
            if self._settled():
                self.g.deliver()
                break
            shape = self._shape()
            same, last = (same + 1 if shape == last else 0), shape
            if same >= STUCK:
                break
        return check_drained(self.g)


def machine_for(store_kind: str) -> type[GatewayMachine]:
    return type(f"GatewaySim_{store_kind}", (GatewayMachine,), {"store_kind": store_kind})


def replay_command(store_kind: str, seed: int, examples: int, steps: int) -> str:
    return (f".venv/bin/python bench/simulate.py --route gateway --store {store_kind} --seed {seed} "
            f"--seeds 1 --examples {examples} --steps {steps}")  # fmt: skip


def run(store_kind: str, *, seed: int, examples: int, steps: int, shrink: bool = True) -> None:
    """Run the gateway simulation's examples drawn from `seed`; a failure raises with the
    shrunk sequence of steps and the command that replays it."""
    run_machine(machine_for(store_kind), seed=seed, examples=examples, steps=steps, shrink=shrink,
                replay=replay_command(store_kind, seed, examples, steps))  # fmt: skip
