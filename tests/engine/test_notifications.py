"""Job notifications (`notify:` in a spec): signed POSTs to real HTTP receivers on loopback,
from the real engine driving `echo` / `echo-batch` jobs on both stores, with the engine's
injected clock. At least once, with a delivery id; a slow receiver holds up nobody.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import sqlalchemy as sa

from lowtide.core.callbacks import verify
from lowtide.core.errors import SpecError
from lowtide.core.spec import load_spec
from lowtide.engine.control import job_status
from lowtide.engine.loader import load_job
from lowtide.engine.notifier import CLAIM_SLACK
from lowtide.engine.tick import Engine
from lowtide.routes.own.echo import EchoRoute
from lowtide.store.schema import events, jobs, notifications
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.engine.ledger_helpers import stored_job

SECRET = "notify-test-secret-7788"
SECRET_ENV = "LT_TEST_NOTIFY_SECRET"
HOUR = 3600.0


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A real HTTP server on loopback: records each POST; answers the next of `answers`
    (then 200); with `hang`, answers nothing until the test ends; with `hold`, answers once
    `release` is set."""

    def __init__(self, hang: bool = False, hold: bool = False):
        self.hits: list[Hit] = []
        self.answers: list[int] = []
        self.hang = hang
        self.hold = hold
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.hits.append(Hit(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if receiver.hang or receiver.hold:
                    receiver.release.wait(30)
                if receiver.hang:
                    return
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def hanging():
    r = Receiver(hang=True)
    yield r
    r.close()


@pytest.fixture
def holding():
    r = Receiver(hold=True)
    yield r
    r.close()


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)


def _notify(*urls: str, **extra) -> dict:
    return {"urls": list(urls), "secret_env": SECRET_ENV, "allow_loopback": True, **extra}


def _spec(tmp_path, notify: dict, rows: int = 5, **overrides):
    return make_spec(write_csv(tmp_path / "t.csv", ticket_rows(rows)), notify=notify, **overrides)


def _outbox(store) -> list:
    with store.begin() as conn:
        return conn.execute(sa.select(notifications).order_by(notifications.c.created_at, notifications.c.id)).all()


def _events(store, kind: str) -> list[str]:
    with store.begin() as conn:
        return list(conn.scalars(sa.select(events.c.message).where(events.c.kind == kind).order_by(events.c.id)))


async def _ticks(engine: Engine, clock, n: int, step: float = 60.0) -> None:
    for _ in range(n):
        await engine.tick("tickets")
        await engine.notifier.settle()
        clock.advance(step)


def _signed(hit: Hit, clock) -> bool:
    """Signed with the secret, at a time of the engine's clock (not after it)."""
    h = hit.headers
    at = float(h["x-lowtide-timestamp"])
    return at <= clock.now() and verify(SECRET.encode(), h["x-lowtide-timestamp"], hit.body, h["x-lowtide-signature"], now=at)


def test_a_finished_job_is_notified_once_signed_with_its_counts(store, clock, tmp_path, receiver):
    spec = _spec(tmp_path, _notify(receiver.url("/hook?token=abc")))
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await _ticks(engine, clock, 6)

    asyncio.run(go())
    [hit] = receiver.hits
    h = hit.headers
    body = json.loads(hit.body)
    assert h["x-lowtide-event"] == "job.finished" and h["x-lowtide-attempt"] == "1"
    assert _signed(hit, clock)
    assert not verify(b"another secret", h["x-lowtide-timestamp"], hit.body, h["x-lowtide-signature"], now=clock.now())
    assert not verify(SECRET.encode(), h["x-lowtide-timestamp"], hit.body, h["x-lowtide-signature"])  # signed in 2023: too old
    assert body["delivery_id"] == h["x-lowtide-delivery"]
    assert body["event"] == "job.finished" and body["job"] == "tickets" and body["state"] == "finished"
    assert body["counts"]["succeeded"] == 5 and body["total"] == 5 and body["counts"]["failed"] == 0
    assert {"cost_usd", "realtime_usd", "savings_usd", "at", "created_at", "finished_at"} <= set(body)
    [row] = _outbox(store)
    assert (row.id, row.state, row.attempts) == (h["x-lowtide-delivery"], "delivered", 1)
    assert SECRET not in row.body
    # `lowtide status` shows it among the job's events, without the URL's query.
    shown = [e for e in job_status(store, "tickets").events if e.startswith("notified:")]
    assert shown == [f"notified: job.finished to {receiver.url('/hook')} (delivery {row.id}, attempt 1): delivered"]


def test_a_job_that_ended_with_failed_requests_is_notified_as_failed(store, clock, tmp_path, receiver):
    spec = _spec(tmp_path, _notify(receiver.url(), events=["failed"]), route_options={"reject": ["T1001"]})
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await _ticks(engine, clock, 6)

    asyncio.run(go())
    [hit] = receiver.hits
    body = json.loads(hit.body)
    assert (body["event"], body["counts"]["failed"], body["counts"]["succeeded"]) == ("job.failed", 1, 4)
    assert body["reason"] == "1 request(s) failed"


def test_a_receiver_that_answers_500_gets_the_same_delivery_again(store, clock, tmp_path, receiver):
    receiver.answers = [500, 503]
    spec = _spec(tmp_path, _notify(receiver.url(), backoff_seconds=30))
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await _ticks(engine, clock, 2, step=1.0)  # finished; the first attempt answered 500
            [row] = _outbox(store)
            assert (row.state, row.attempts, row.last_error) == ("pending", 1, "HTTP 500")
            assert job_status(store, "tickets").notifications == {"pending": 1}  # `lowtide status` counts them
            assert row.next_at > clock.now()  # its backoff: nothing is sent before it
            await _ticks(engine, clock, 1, step=0.0)
            assert len(receiver.hits) == 1
            clock.advance(row.next_at - clock.now())
            await _ticks(engine, clock, 1, step=0.0)  # 503
            clock.advance(_outbox(store)[0].next_at - clock.now())
            await _ticks(engine, clock, 1, step=0.0)  # 200

    asyncio.run(go())
    assert [h.headers["x-lowtide-attempt"] for h in receiver.hits] == ["1", "2", "3"]
    assert len({h.headers["x-lowtide-delivery"] for h in receiver.hits}) == 1
    assert len({h.body for h in receiver.hits}) == 1  # the same document each time
    assert all(_signed(h, clock) for h in receiver.hits)
    [row] = _outbox(store)
    assert (row.state, row.attempts) == ("delivered", 3)
    assert job_status(store, "tickets").notifications == {"delivered": 1}
    assert [m.split(": ", 1)[1] for m in _events(store, "notify_retry")][0].startswith("HTTP 500; again in")


def _fail_marks_once(store) -> None:
    """A fault in the database itself: the transaction that marks a delivery delivered fails."""
    with store.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(sa.text(
                "CREATE TRIGGER fail_mark BEFORE UPDATE OF state ON notifications WHEN NEW.state = 'delivered' "
                "BEGIN SELECT RAISE(ABORT, 'injected: marking failed'); END"
            ))  # fmt: skip
        else:
            conn.execute(sa.text(
                "CREATE OR REPLACE FUNCTION fail_mark() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'injected: marking failed'; END $$ LANGUAGE plpgsql"
            ))  # fmt: skip
            conn.execute(sa.text(
                "CREATE TRIGGER fail_mark BEFORE UPDATE ON notifications FOR EACH ROW "
                "WHEN (NEW.state = 'delivered') EXECUTE FUNCTION fail_mark()"
            ))  # fmt: skip


def _heal(store) -> None:
    with store.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER fail_mark" + ("" if conn.dialect.name == "sqlite" else " ON notifications")))


def test_a_crash_between_sending_and_marking_sends_the_same_delivery_again(store, clock, tmp_path, receiver, caplog):
    spec = _spec(tmp_path, _notify(receiver.url(), timeout_seconds=5))
    load_job(store, spec, clock)
    _fail_marks_once(store)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await _ticks(engine, clock, 2, step=0.0)  # sent, answered 200; the mark failed
            assert len(receiver.hits) == 1
            [row] = _outbox(store)
            assert (row.state, row.attempts) == ("pending", 0) and row.claimed_until is not None
            _heal(store)
            await _ticks(engine, clock, 1, step=0.0)  # still claimed: not sent twice meanwhile
            assert len(receiver.hits) == 1
            clock.advance(5 + CLAIM_SLACK + 1)  # the claim of the attempt that "died" lapses
            await _ticks(engine, clock, 2, step=0.0)

    asyncio.run(go())
    assert "recording the notification attempt" in caplog.text
    first, again = receiver.hits
    assert first.headers["x-lowtide-delivery"] == again.headers["x-lowtide-delivery"]
    assert first.body == again.body
    [row] = _outbox(store)
    assert (row.state, row.id) == ("delivered", first.headers["x-lowtide-delivery"])


def test_a_hanging_receiver_delays_neither_the_tick_nor_another_receiver(store, clock, tmp_path, receiver, hanging):
    # Told by order, not by wall time: the ticks return while both attempts are in flight,
    # and the fast one is delivered while the slow one still hangs; the slow one then ends
    # at its deadline, and says so.
    timeout = 2.0
    spec = _spec(tmp_path, _notify(hanging.url("/slow"), receiver.url("/fast"), timeout_seconds=timeout))
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            for _ in range(3):  # the job finishes; both attempts start
                await engine.tick("tickets")
            assert engine.notifier.in_flight == 2  # the ticks did not wait for either
            while not receiver.hits or _state(store, "/fast") != "delivered":
                await asyncio.sleep(0.01)  # lets the attempts run; the loop ends on the store's word
            assert _state(store, "/slow") == "pending" and engine.notifier.in_flight == 1  # still hanging
            await engine.notifier.settle()  # ends at its deadline

    asyncio.run(go())
    row = next(r for r in _outbox(store) if r.url.endswith("/slow"))
    assert (row.state, row.attempts, row.last_error) == ("pending", 1, f"no answer within {timeout:g} s")


def test_an_attempt_that_recorded_its_outcome_is_no_longer_in_flight(store, clock, tmp_path, receiver):
    # The store's word and in_flight agree at every turn of the loop: the task's
    # bookkeeping callback runs a turn later, and in_flight must not wait for it.
    load_job(store, _spec(tmp_path, _notify(receiver.url("/fast"))), clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            for _ in range(3):
                await engine.tick("tickets")
            seen = []
            while _state(store, "/fast") != "delivered":
                seen.append(engine.notifier.in_flight)
                assert len(seen) < 100_000, "the attempt was never recorded"
                await asyncio.sleep(0)
            return seen, engine.notifier.in_flight

    seen, after = asyncio.run(go())
    assert set(seen) <= {1} and after == 0  # (the ticks may have let it finish already: seen empty)


async def _until_sent(engine: Engine, receiver: Receiver, hits: int) -> None:
    """Tick until the receiver holds `hits` attempts (told by the receiver, not by time)."""
    for _ in range(100_000):
        if len(receiver.hits) >= hits:
            return
        await engine.tick("tickets")
        await asyncio.sleep(0.001)  # the attempt's task runs; the receiver's thread records it
    raise AssertionError(f"the receiver never got attempt {hits}")


def test_a_2xx_that_comes_after_a_stall_past_the_claim_is_delivered_not_sent_again(store, clock, tmp_path, holding):
    """The worker stalls past its attempt's claim (a long ingest on its event loop; here the
    clock jumps) and nobody took the delivery over: the receiver's 2xx is the delivery. It
    was counted a failed attempt and sent again, and after max_attempts such stalls given up
    while the receiver had every one."""
    timeout = 5.0
    load_job(store, _spec(tmp_path, _notify(holding.url(), timeout_seconds=timeout)), clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await _until_sent(engine, holding, 1)
            clock.advance(timeout + CLAIM_SLACK + 600)  # past the claim, and past any backoff
            holding.release.set()
            await engine.notifier.settle()
            await _ticks(engine, clock, 3, step=HOUR)

    asyncio.run(go())
    [row] = _outbox(store)
    assert (row.state, row.attempts, row.last_error) == ("delivered", 1, None)
    assert len(holding.hits) == 1 and _events(store, "notify_retry") == []


def test_a_late_2xx_after_another_worker_took_the_delivery_over_is_not_recorded(store, clock, tmp_path, holding):
    """Once the claim lapsed and another worker claimed and sent the delivery, the first
    attempt's late answer records nothing: the outcome is the second attempt's (the receiver
    gets the same delivery id twice, as at least once allows)."""
    timeout = 5.0
    load_job(store, _spec(tmp_path, _notify(holding.url(), timeout_seconds=timeout)), clock)

    async def go():
        async with Engine(store, clock, seed=1) as first, Engine(store, clock, seed=2) as second:
            await _until_sent(first, holding, 1)
            clock.advance(timeout + CLAIM_SLACK + 1)
            await _until_sent(second, holding, 2)  # the lapsed claim, taken over
            holding.release.set()
            await first.notifier.settle()
            await second.notifier.settle()

    asyncio.run(go())
    [row] = _outbox(store)
    assert (row.state, row.attempts) == ("delivered", 1)  # the second's attempt; the first's was not counted
    one, two = holding.hits
    assert one.headers["x-lowtide-delivery"] == two.headers["x-lowtide-delivery"] == row.id
    assert len(_events(store, "notified")) == 1


def _state(store, path: str) -> str:
    return next(r.state for r in _outbox(store) if r.url.endswith(path))


class PricedEcho(EchoRoute):
    """`echo`, answering as the `openai` route (and so priced as OpenAI real time)."""

    name = "openai"


def test_a_job_that_runs_out_of_budget_is_notified(store, clock, tmp_path, receiver):
    stored_job(store, tmp_path, n=5, model="gpt-4o-mini", route="openai", params={"max_tokens": 16}, budget_usd="0.00001",
               notify=_notify(receiver.url(), events=["budget_exhausted"]))  # fmt: skip

    async def go():
        async with Engine(store, clock, routes={"openai": PricedEcho({"dispatch_size": 2})}) as engine:
            await _ticks(engine, clock, 3)

    asyncio.run(go())
    [hit] = receiver.hits
    body = json.loads(hit.body)
    assert (body["event"], body["state"], body["budget_usd"]) == ("job.budget_exhausted", "budget_exhausted", "0.00001")
    assert "would pass the budget of $0.00001" in body["reason"] and body["counts"]["pending"] == 5
    assert len(_outbox(store)) == 1  # exhausted once: enqueued once, however many ticks saw it


def test_the_deadline_cut_over_is_notified_once(store, clock, tmp_path, receiver):
    deadline = datetime.fromtimestamp(clock.now() + 2 * HOUR, UTC).isoformat()
    spec = _spec(tmp_path, _notify(receiver.url()), rows=10, route="echo-batch", deadline=deadline,
                 route_options={"dir": str(tmp_path / "provider"), "polls_to_complete": 10},
                 fallback={"route": "echo", "expected_turnaround": 600})  # fmt: skip
    load_job(store, spec, clock)
    cut_at = spec.deadline.timestamp() - spec.fallback.safety_margin

    async def go():
        async with Engine(store, clock, seed=3) as engine:
            await _ticks(engine, clock, 2, step=10)
            assert receiver.hits == []
            clock.advance(cut_at - clock.now())
            await _ticks(engine, clock, 5, step=1)

    asyncio.run(go())
    got = sorted(json.loads(h.body)["event"] for h in receiver.hits)  # sent at once, each on its own
    assert got == ["job.deadline_cutover", "job.finished"]  # five ticks past the cut-over: one notification
    [cut] = [json.loads(h.body) for h in receiver.hits if h.headers["x-lowtide-event"] == "job.deadline_cutover"]
    assert cut["reason"] == "deadline cut-over: what echo-batch has not finished goes to echo"
    assert cut["deadline"] == deadline.replace("+00:00", "Z")


def test_a_job_that_ends_twice_is_notified_twice_each_once(store, clock, tmp_path, receiver):
    """A retried job that ends again is a new occurrence; each ending is enqueued once."""
    from lowtide.engine.control import retry_job

    spec = _spec(tmp_path, _notify(receiver.url()), route_options={"reject": ["T1001"]})
    load_job(store, spec, clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await _ticks(engine, clock, 4)
            retry_job(store, "tickets", clock)
            await _ticks(engine, clock, 4)

    asyncio.run(go())
    assert [json.loads(h.body)["event"] for h in receiver.hits] == ["job.failed", "job.failed"]
    assert len({h.headers["x-lowtide-delivery"] for h in receiver.hits}) == 2
    assert [r.dedupe_key.split("|")[0] for r in _outbox(store)] == ["ended:1", "ended:2"]


# --- bad input: refused at load, naming the file, the field and the fix, before anything is stored


def _spec_file(tmp_path, notify_yaml: str):
    write_csv(tmp_path / "t.csv", ticket_rows(2))
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: tickets\nsource: {path: t.csv, id_column: ticket_id}\ntemplate: {user: 'Ticket: {{ body }}'}\n"
        "model: test-model\nroute: echo\nparams: {max_tokens: 16}\n" + notify_yaml,
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("notify_yaml", "said"),
    [
        ("notify: {urls: ['http://127.0.0.1:9/hook']}\n",
         "line 7: `notify.urls`: URL 1 (http://127.0.0.1:9/hook): host 127.0.0.1 resolves to a loopback address (127.0.0.1); "
         "callbacks there are not allowed; point it at a public receiver, or set notify.allow_loopback: true"),
        ("notify: {urls: ['http://169.254.169.254/latest/meta-data'], allow_loopback: true}\n",
         "`notify.urls`: URL 1 (http://169.254.169.254/latest/meta-data): host 169.254.169.254 resolves to a link-local address"),
        ("notify: {urls: ['http://[::ffff:10.0.0.1]/x']}\n", "resolves to a private address (10.0.0.1, embedded in ::ffff:a00:1)"),
        ("notify: {urls: ['ftp://hooks.example.com/x']}\n", "`notify.urls`: URL 1 (ftp://hooks.example.com/x): scheme 'ftp' is not allowed; use https or http"),
        ("notify: {urls: ['https://user:pw@hooks.example.com/x']}\n", "credentials in the URL are not allowed"),
        ("notify: https://hooks.example.com/x\n", "`notify`: give a mapping, e.g. notify: {urls: [https://hooks.example.com/lowtide]"),
        ("notify: {urls: https://hooks.example.com/x}\n", "`notify.urls`: give a list of URLs, e.g. urls: [https://hooks.example.com/x]"),
        ("notify: {urls: []}\n", "`notify.urls`: List should have at least 1 item"),
        ("notify: {urls: ['https://a.example.com/x', 'https://a.example.com/x']}\n", "a URL is given twice; give each receiver once"),
        ("notify: {urls: ['https://a.example.com/x'], events: [done]}\n",
         "`notify.events.0`: Input should be 'finished', 'failed', 'budget_exhausted' or 'deadline_cutover'"),
        ("notify: {urls: ['https://a.example.com/x'], secret_env: whsec_Zq3xY9a1B2c3D4}\n",
         "`notify.secret_env`: must name an environment variable (capitals, digits, _), not hold the secret itself"),
        ("notify: {urls: ['https://a.example.com/x'], retries: 3}\n", "`notify.retries`"),
        ("notify: {urls: ['https://a.example.com/x'], timeout_seconds: 0}\n", "`notify.timeout_seconds`"),
    ],
)  # fmt: skip
def test_bad_notify_values_are_refused_at_load_naming_file_field_and_fix(tmp_path, notify_yaml, said):
    path = _spec_file(tmp_path, notify_yaml)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert str(path) in message and said in message, message
    assert "whsec_Zq3xY9a1B2c3D4" not in message


def test_a_host_that_resolves_to_loopback_or_an_unset_secret_is_refused_before_anything_is_stored(store, clock, tmp_path, monkeypatch):
    path = _spec_file(tmp_path, "notify: {urls: ['http://localhost:9/hook'], secret_env: LT_TEST_NOTIFY_SECRET}\n")
    with pytest.raises(SpecError) as caught:
        load_job(store, load_spec(path), clock, where=str(path))
    said = str(caught.value)
    assert said.startswith(f"{path}: notify.urls: URL 1 (http://localhost:9/hook): host localhost resolves to a loopback address")
    assert "allow_loopback" in said

    monkeypatch.delenv(SECRET_ENV)
    path = _spec_file(tmp_path, "notify: {urls: ['http://localhost:9/hook'], allow_loopback: true, secret_env: LT_TEST_NOTIFY_SECRET}\n")
    with pytest.raises(SpecError) as caught:
        load_job(store, load_spec(path), clock, where=str(path))
    assert str(caught.value) == (
        f"{path}: notify.secret_env: the environment variable {SECRET_ENV} is not set; set it to the signing secret your "
        "receivers verify with, here and where the worker runs"
    )
    with store.begin() as conn:  # nothing stored
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def test_until_idle_waits_for_a_delivery_in_flight_and_the_retry_it_schedules(store, clock, tmp_path, receiver):
    """`worker --until-idle` stopped once nothing was due *for it to start*: a delivery in
    flight was not counted, so it ended with that attempt's retry (a 503) never sent, and
    deliveries waiting for a busy receiver's slot never started (docs/notifications.md:
    it keeps going while notifications are due)."""
    from lowtide.engine.runner import work

    receiver.answers = [503]
    load_job(store, _spec(tmp_path, _notify(receiver.url(), backoff_seconds=0)), clock)

    async def go():
        async with Engine(store, clock, seed=1) as engine:
            await asyncio.wait_for(work(engine, stop_when_idle=True), timeout=60)  # (a safety net, not a timing)

    asyncio.run(go())
    assert [h.headers["x-lowtide-attempt"] for h in receiver.hits] == ["1", "2"]
    assert [(row.state, row.attempts) for row in _outbox(store)] == [("delivered", 2)]
