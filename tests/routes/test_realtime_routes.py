"""The direct routes (`openai-compatible`, `openai`, `anthropic`) against a real HTTP server on
loopback (tests/routes/upstream.py): answers and usage, retries, Retry-After, dropped
connections, the concurrency cap, rate limits, and that the API key never leaks.

Timing is asserted on what the server recorded, never on sleeps in the test."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from lowtide.core.errors import RouteError
from lowtide.core.types import Outcome, Request
from lowtide.routes import DirectRoute, create_route
from lowtide.routes.anthropic.direct import AnthropicMessagesRoute
from lowtide.routes.openai.direct import OpenAIChatRoute
from lowtide.routes.pool.direct import retry_after
from lowtide.store.schema import attempts
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv
from tests.routes.upstream import Reply, Upstream

FAST_RETRY = {"retry_backoff": [0.01, 0.02]}
KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def upstream():
    with Upstream() as server:
        yield server


def reqs(n: int, **kw) -> list[Request]:
    return [
        Request.chat(
            custom_id=f"r{i}",
            model="m",
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"r{i}"}],
            max_tokens=8,
            **kw,
        )
        for i in range(n)
    ]


def run(route: DirectRoute, requests: list[Request]) -> dict[str, Outcome]:
    async def go() -> list[Outcome]:
        try:
            return [o async for o in route.execute(requests)]
        finally:
            await route.aclose()

    outcomes = asyncio.run(go())
    assert sorted(o.custom_id for o in outcomes) == sorted(r.custom_id for r in requests)  # one each
    return {o.custom_id: o for o in outcomes}


def compatible(upstream: Upstream, **options) -> OpenAIChatRoute:
    return OpenAIChatRoute("openai-compatible", {"base_url": f"{upstream.url}/v1", **FAST_RETRY, **options})


# -- answers and usage ----------------------------------------------------------------------


def test_openai_compatible_answers_with_the_providers_usage(upstream):
    route = create_route("openai-compatible", {"base_url": f"{upstream.url}/v1", "concurrency": 4})
    assert isinstance(route, DirectRoute) and route.kind == "direct"
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    requests = reqs(20) + [
        Request.chat("s", "m", [{"role": "user", "content": "s"}], response_schema=schema, choices=["a", "b"])
    ]
    out = run(route, requests)
    assert all(o.ok for o in out.values())
    assert out["r7"].text == "ok r7" and out["r7"].finish_reason == "stop"
    u = out["r7"].usage
    assert (u.input_tokens, u.cached_input_tokens, u.output_tokens, u.reasoning_tokens) == (11, 3, 5, 2)
    body = upstream.arrivals("s")[0].body
    # response_schema is sugar for a strict json_schema response_format
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}
    assert "choices" not in body  # choices travel in the prompt text only
    assert upstream.arrivals("r7")[0].path == "/v1/chat/completions"
    assert upstream.arrivals("r7")[0].body["max_tokens"] == 8


def test_openai_sends_the_key_from_the_environment_and_the_service_tier(upstream, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    route = OpenAIChatRoute("openai", {"base_url": f"{upstream.url}/v1", "service_tier": "flex"})
    assert route.timeout == 900  # flex answers slowly: a long default timeout
    out = run(route, reqs(3))
    assert all(o.ok for o in out.values())
    seen = upstream.arrivals("r0")[0]
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.body["service_tier"] == "flex"
    # The SDK's telemetry headers are left out (each header costs on every request).
    assert seen.headers["content-type"] == "application/json"
    assert not [h for h in seen.headers if h.startswith("x-stainless")]


def test_openai_without_a_key_says_which_variable_to_set(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RouteError, match="OPENAI_API_KEY"):
        create_route("openai", {})
    with pytest.raises(RouteError, match="base_url is required"):
        create_route("openai-compatible", {})
    with pytest.raises(RouteError, match="unknown route_options"):
        create_route("openai-compatible", {"base_url": "http://x/v1", "concurency": 3})


def test_anthropic_answers_with_cache_usage_and_the_system_prompt_apart(upstream, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    route = create_route("anthropic", {"base_url": upstream.url, "cache_prefix": True, **FAST_RETRY})
    out = run(route, reqs(5))
    assert all(o.ok for o in out.values())
    assert out["r2"].text == "ok r2" and out["r2"].finish_reason == "end_turn"
    u = out["r2"].usage
    assert (u.input_tokens, u.cached_input_tokens, u.cache_write_tokens, u.output_tokens) == (11, 3, 4, 5)
    seen = upstream.arrivals("r2")[0]
    assert seen.path == "/v1/messages"
    assert KEY in (seen.headers.get("x-api-key"), seen.headers.get("authorization", "").removeprefix("Bearer "))
    assert seen.headers["anthropic-version"] and not [h for h in seen.headers if h.startswith("x-stainless")]
    assert seen.body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    assert [m["role"] for m in seen.body["messages"]] == ["user"]


def test_anthropic_overload_is_retried_and_a_bad_request_is_not(upstream, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    upstream.plan("r0", Reply(529, code="overloaded_error"))
    upstream.plan("r1", Reply(400, code="invalid_request_error", message="max_tokens: too large"))
    out = run(AnthropicMessagesRoute({"base_url": upstream.url, **FAST_RETRY}), reqs(2))
    assert out["r0"].ok and len(upstream.arrivals("r0")) == 2
    assert (out["r1"].ok, out["r1"].retryable, out["r1"].error_code) == (False, False, "invalid_request_error")
    assert "max_tokens: too large" in out["r1"].error_message


# -- errors and retries ----------------------------------------------------------------------


def test_retry_after_pauses_every_send_of_the_route(upstream):
    # r0 is refused with a 300 ms Retry-After; r1 finishes 100 ms in, and its worker must
    # wait out the same pause before sending r2.
    upstream.plan("r0", Reply(429, headers={"retry-after-ms": "300"}, message="slow down"))
    upstream.plan("r1", Reply(delay=0.1))
    out = run(compatible(upstream, concurrency=2, adaptive=False), reqs(4))
    assert all(o.ok for o in out.values())
    refused, again = upstream.arrivals("r0")
    assert refused.status == 429 and again.status == 200
    # From the 429's arrival, not its `answered` mark: the upstream thread stamps that after
    # its write, and the client may read the 429 and start the pause before that stamp (a
    # loaded machine showed 4 ms). Without the pause r2 would come ~0.1 s in, well before.
    resume = refused.arrived + 0.3
    assert again.arrived >= resume
    assert upstream.arrivals("r2")[0].arrived >= resume
    assert upstream.arrivals("r3")[0].arrived >= resume


def test_retry_after_header_forms():
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after({"retry-after": "2"}) == 2.0
    assert 0 <= retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert retry_after({}) is None and retry_after({"retry-after": "soon"}) is None


def test_a_server_error_is_retried_in_the_route_until_it_succeeds(upstream):
    upstream.plan("r0", Reply(500), Reply(502))
    out = run(compatible(upstream), reqs(3))
    assert out["r0"].ok
    assert [s.status for s in upstream.arrivals("r0")] == [500, 502, 200]


def test_exhausted_retries_give_a_retryable_outcome(upstream):
    upstream.plan("r0", *[Reply(503, message="warming up")] * 4)
    out = run(compatible(upstream, max_retries=3), reqs(2))
    o = out["r0"]
    assert (o.ok, o.retryable, o.error_code) == (False, True, "service_unavailable")
    assert "warming up" in o.error_message and "after 4 tries" in o.error_message
    assert len(upstream.arrivals("r0")) == 4
    assert out["r1"].ok


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [(400, None, "invalid_request"), (404, "model_not_found", "model_not_found"), (422, None, "invalid_request")],
)
def test_a_client_error_is_final_and_carries_the_providers_message(upstream, status, code, expected):
    upstream.plan("r0", Reply(status, code=code, message="The model `m` does not exist"))
    out = run(compatible(upstream), reqs(2))
    o = out["r0"]
    assert (o.ok, o.retryable, o.error_code) == (False, False, expected)
    assert o.error_message.startswith(f"HTTP {status}: The model `m` does not exist")
    assert len(upstream.arrivals("r0")) == 1


def test_a_dropped_connection_is_retried(upstream):
    upstream.plan("r0", Reply(drop=True))
    out = run(compatible(upstream), reqs(3))
    assert out["r0"].ok
    assert len(upstream.arrivals("r0")) == 2


def test_a_dropped_connection_is_named_as_such_not_as_a_timeout(upstream):
    upstream.plan("r0", Reply(drop=True))
    out = run(compatible(upstream, max_retries=0), reqs(1))
    assert (out["r0"].ok, out["r0"].retryable, out["r0"].error_code) == (False, True, "connection_error")
    assert out["r0"].error_message.startswith("connection failed or dropped")


def test_a_timeout_is_retried_then_given_back_as_retryable(upstream):
    upstream.plan("r0", Reply(delay=2.0))  # answered after the route gave up: retried
    upstream.plan("r1", *[Reply(delay=2.0)] * 2)
    out = run(compatible(upstream, timeout=0.2, max_retries=1), reqs(3))
    assert out["r0"].ok
    assert (out["r1"].ok, out["r1"].retryable, out["r1"].error_code) == (False, True, "timeout")


def test_the_api_key_never_appears_in_an_outcome(upstream, monkeypatch):
    monkeypatch.setenv("MY_SERVER_KEY", KEY)
    upstream.plan("r0", Reply(401, message="Incorrect API key provided: {key}"))
    upstream.plan("r1", Reply(400, message="bad request from {key}"))
    upstream.plan("r2", *[Reply(500, message="upstream said {key}")] * 2)
    out = run(compatible(upstream, api_key_env="MY_SERVER_KEY", max_retries=1), reqs(4))
    assert upstream.arrivals("r0")[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent
    assert (out["r0"].error_code, out["r0"].retryable) == ("authentication_error", False)
    for cid in ("r0", "r1", "r2"):
        assert KEY not in out[cid].error_message
        assert "[api key]" in out[cid].error_message
    assert out["r3"].ok


# -- concurrency and rate limits ---------------------------------------------------------------


def test_concurrency_never_exceeds_the_cap():
    with Upstream(batching=(0.005, 0.001)) as server:
        out = run(compatible(server, concurrency=4, max_concurrency=6), reqs(300))
    assert all(o.ok for o in out.values())
    assert 2 <= server.max_in_flight <= 6


def test_a_fixed_concurrency_is_kept_full():
    with Upstream(latency=0.02) as server:
        out = run(compatible(server, concurrency=5, adaptive=False), reqs(60))
    assert len(out) == 60
    assert server.max_in_flight == 5


def test_a_llama_cpp_servers_slot_count_sets_the_concurrency():
    with Upstream(latency=0.02, total_slots=3) as server:
        route = compatible(server, adaptive=False)
        run(route, reqs(12))
        assert route.controller.limit == 3 and server.max_in_flight == 3
    with Upstream() as server:  # no /props: the default stays
        route = compatible(server, adaptive=False)
        run(route, reqs(2))
        assert route.controller.limit == 256
    with Upstream(total_slots=3) as server:  # said outright: no probe
        route = compatible(server, max_num_seqs=7, adaptive=False)
        run(route, reqs(2))
        assert route.controller.limit == 7


def test_rpm_is_respected_on_the_routes_clock(upstream):
    now = [0.0]
    sends: list[float] = []

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        await asyncio.sleep(0)

    route = OpenAIChatRoute(
        "openai-compatible", {"base_url": f"{upstream.url}/v1", "rpm": 60, "concurrency": 4}, clock=lambda: now[0], sleep=sleep
    )
    send = route.send

    async def recorded(request):
        sends.append(now[0])
        return await send(request)

    route.send = recorded
    out = run(route, reqs(10))
    assert all(o.ok for o in out.values()) and len(upstream.seen) == 10
    gaps = [b - a for a, b in zip(sends, sends[1:], strict=False)]
    assert min(gaps) >= 1.0 - 1e-9  # 60 a minute: one a second, burst of one
    assert sends[-1] == pytest.approx(9.0)  # and no slower than that


def test_plan_for_raises_the_concurrency_floor(upstream):
    route = compatible(upstream, concurrency=2, max_concurrency=50, expected_latency=0.1)
    route.plan_for(1000, 10.0)  # 1000 × 0.1 s / 10 s = 10 in flight, + 25 % headroom
    assert route.controller.limit == 13
    route.plan_for(100_000, 1.0)
    assert route.controller.limit == 50  # as far as max_concurrency allows
    assert route.controller.floor == 50
    run(route, reqs(3))
    assert route.controller.floor == 1  # the floor lasted one execute call


# -- a whole job ---------------------------------------------------------------------------------


def test_a_job_runs_end_to_end_on_an_openai_compatible_server(upstream, sqlite_store, clock, tmp_path):
    rows = ticket_rows(30)
    source = write_csv(tmp_path / "t.csv", rows)
    first, flaky = f"Ticket: {rows[0]['body']}", f"Ticket: {rows[1]['body']}"
    upstream.plan(first, Reply(400, message="prompt is not allowed"))
    upstream.plan(flaky, Reply(500))
    spec = make_spec(
        source,
        route="openai-compatible",
        route_options={"base_url": f"{upstream.url}/v1", "concurrency": 4, **FAST_RETRY},
    )
    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts == {"succeeded": 29, "failed": 1}
    assert len(upstream.arrivals(flaky)) == 2  # retried inside the route
    with sqlite_store.begin() as conn:
        rows_ = conn.execute(sa.select(attempts.c.input_tokens, attempts.c.output_tokens)).all()
    assert sorted(rows_) == [(0, 0)] + [(11, 5)] * 29  # the refused request used nothing
    from lowtide.engine.export import export_results

    export_results(sqlite_store, "tickets", tmp_path / "out.jsonl")
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    done = {r["ticket_id"]: r for r in out}
    assert done["T1005"]["output"] == f"ok Ticket: {rows[5]['body']}"
    assert done[rows[0]["ticket_id"]]["state"] == "failed"
    assert "prompt is not allowed" in done[rows[0]["ticket_id"]]["error"]
