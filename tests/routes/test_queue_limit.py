"""OpenAI's enqueued-token limit through `lowtide serve` (its fault plan's `enqueued_tokens`)
and the official SDK: planned within, and a batch refused for it sent again without
counting as a failure of its requests."""

from __future__ import annotations

import json
import re

import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.batch_limits import OPENAI_BATCH_QUEUE, enqueued_token_limit
from lowtide.core.clock import SystemClock
from lowtide.core.errors import RouteError
from lowtide.engine.loader import load_job
from lowtide.routes.openai.batch import OpenAIBatchRoute
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, events, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, _options, _run

ROWS = 12
CHUNK = 4  # requests per batch: three batches


def _body_tokens(spec) -> int:
    """serve's count for one batch of CHUNK requests: request bodies' characters / 4."""
    from lowtide.core import fastjson

    body = {"model": spec.model, "messages": [{"role": "system", "content": "Classify the ticket."},
                                              {"role": "user", "content": "Ticket: ticket 1000 about shipping"}], "max_tokens": 256}  # fmt: skip
    return CHUNK * len(fastjson.dumpb(body)) // 4


def _start(serve, tmp_path, limit: int) -> str:
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"enqueued_tokens": {"*": limit}}))
    # Batches stay in progress for 2 s (7200 scaled seconds): a second one sent meanwhile meets a full queue.
    return serve("--faults", str(plan), "--complete-after", "7200")


def _job(tmp_path, url: str, **route_options):
    source = write_csv(tmp_path / "t.csv", ticket_rows(ROWS))
    spec = make_spec(source, route="openai-batch", route_options=_options("openai-batch", url, max_requests=CHUNK, **route_options),
                     retry={"max_attempts": 1, "backoff_seconds": 0})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    return store, spec


def test_a_batch_refused_for_a_full_queue_is_sent_again_and_fails_nobody(serve, tmp_path):
    source_spec = make_spec(write_csv(tmp_path / "x.csv", ticket_rows(1)))
    one_batch = _body_tokens(source_spec)
    url = _start(serve, tmp_path, limit=one_batch + one_batch // 2)  # one batch fits, two do not
    # No limit told to lowtide: it sends two batches at once and the provider refuses the second.
    store, _ = _job(tmp_path, url)
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": ROWS}, status.events
    with store.begin() as conn:
        refused = conn.execute(
            sa.select(dispatches.c.error).where(dispatches.c.state == "failed")
        ).scalars().all()  # fmt: skip
        tries = conn.execute(sa.select(requests.c.attempts)).scalars().all()
        failed_attempts = conn.execute(sa.select(sa.func.count()).select_from(attempts).where(attempts.c.ok.is_(False))).scalar_one()
        notes = conn.execute(sa.select(events.c.message).where(events.c.kind == "queue_full")).scalars().all()
    assert refused and all(e.startswith("token_limit_exceeded: ") and "Enqueued token limit reached" in e for e in refused)
    # max_attempts is 1: a refusal counted as an attempt would have failed these requests
    assert tries == [1] * ROWS and failed_attempts == 0
    assert len(notes) == len(refused) and all(re.search(r"4 request\(s\) wait for [12] batch\(es\) in flight", n) for n in notes)


def test_a_job_told_the_limit_never_meets_a_full_queue(serve, tmp_path):
    one_batch = _body_tokens(make_spec(write_csv(tmp_path / "x.csv", ticket_rows(1))))
    limit = one_batch + one_batch // 2
    url = _start(serve, tmp_path, limit=limit)
    store, _ = _job(tmp_path, url, max_enqueued_tokens=limit)
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": ROWS}
    with store.begin() as conn:
        rows = conn.execute(
            sa.select(dispatches.c.state, dispatches.c.model, dispatches.c.input_tokens_est, dispatches.c.submitted_at,
                      dispatches.c.ended_at).order_by(dispatches.c.id)
        ).all()  # fmt: skip
    assert [r.state for r in rows] == ["ended"] * 3 and {r.model for r in rows} == {"test-model"}
    # lowtide's estimate (the stored request's characters / 4) is at least serve's count
    assert all(one_batch <= r.input_tokens_est <= limit for r in rows)
    # two batches never were in the queue at once: each was sent after the one before ended
    assert all(later.submitted_at >= earlier.ended_at for earlier, later in zip(rows, rows[1:], strict=False))


def test_a_request_bigger_than_the_whole_limit_fails_at_once_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    store, _ = _job(tmp_path, "http://127.0.0.1:9", max_enqueued_tokens=10)  # nothing is ever sent
    status = _run(store, "tickets", timeout=60)
    assert status.counts == {"failed": ROWS} and set(status.failures) == {"over_token_limit"}
    with store.begin() as conn:
        message = conn.execute(sa.select(requests.c.error_message).limit(1)).scalar_one()
        sent = conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one()
    assert sent == 0
    assert "over openai-batch's enqueued-token limit of 10 for test-model" in message
    assert "raise route_options.max_enqueued_tokens" in message


def test_the_tier_gives_the_documented_limit_and_an_explicit_one_wins(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    route = OpenAIBatchRoute({"tier": 1})
    assert route.token_limit("gpt-4o-mini-2024-07-18") == 2_000_000
    assert route.token_limit("gpt-4o") == 90_000
    assert route.token_limit("some-new-model") is None  # undocumented: not planned, the provider says
    assert OpenAIBatchRoute({"tier": 5}).token_limit("gpt-4o-mini") == OPENAI_BATCH_QUEUE["gpt-4o-mini"][4]
    per_model = OpenAIBatchRoute({"tier": 1, "max_enqueued_tokens": {"gpt-4o": 5, "*": 7}})
    assert (per_model.token_limit("gpt-4o"), per_model.token_limit("gpt-4o-mini")) == (5, 7)
    assert enqueued_token_limit("gpt-4o", None, None) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tier": 6}, "route_options.tier must be your OpenAI usage tier, one of 1, 2, 3, 4, 5; got 6"),
        ({"tier": True}, "route_options.tier must be your OpenAI usage tier"),
        ({"max_enqueued_tokens": -1}, "route_options.max_enqueued_tokens must be a positive whole number of tokens"),
        ({"max_enqueued_tokens": {"gpt-4o": "lots"}}, "got {'gpt-4o': 'lots'}"),
    ],
)
def test_bad_queue_options_are_refused_by_name(monkeypatch, options, message):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    with pytest.raises(RouteError, match="openai-batch: ") as err:
        OpenAIBatchRoute(options)
    assert message in str(err.value)


def test_the_fault_plan_refuses_a_bad_limit(tmp_path):
    from lowtide.core.errors import SpecError
    from lowtide.server.faults import FaultPlan

    path = tmp_path / "f.yaml"
    path.write_text(json.dumps({"enqueued_tokens": {"*": 0}}))
    with pytest.raises(SpecError, match="enqueued_tokens"):
        FaultPlan.load(path)


def test_route_auto_learns_batch_turnarounds_from_the_store(serve, tmp_path, monkeypatch):
    """A first job's batches through serve are measured; a second `route: auto` job with a
    10-minute max_wait then takes openai-batch (cheaper than real time), which the prior
    (p95 24 h) would never have allowed, and runs there."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("openai:\n  test-model:\n    realtime: {input: 2, output: 8}\n    batch: {input: 1, output: 4}\n")
    monkeypatch.setenv("LOWTIDE_PRICES", str(prices))
    monkeypatch.setenv(KEY_ENV, "test-key")
    url = serve()
    store = Store(str(tmp_path / "client.db"))
    source = write_csv(tmp_path / "t.csv", ticket_rows(ROWS))
    batch = _options("openai-batch", url, max_requests=CHUNK)
    load_job(store, make_spec(source, name="first", route="openai-batch", route_options=batch), SystemClock())
    assert _run(store, "first").counts == {"succeeded": ROWS}
    realtime = {"base_url": f"{url}/v1", "api_key_env": KEY_ENV}
    auto = {"max_wait": "10m", "candidates": [{"route": "openai-batch", "route_options": batch},
                                              {"route": "openai", "route_options": realtime}]}  # fmt: skip
    load_job(store, make_spec(source, name="second", route="auto", auto=auto), SystemClock())
    assert _run(store, "second").counts == {"succeeded": ROWS}
    with store.begin() as conn:
        reason = conn.execute(sa.select(events.c.message).where(events.c.kind == "route_choice")).scalar_one()
        routes = set(conn.execute(sa.select(dispatches.c.route).where(dispatches.c.job_id == 2)).scalars())
    assert re.match(r"openai-batch: p95 \d+ s fits 10 min \(measured: 3 batches\), \$0\.\d+ vs openai \$0\.\d+", reason), reason
    assert routes == {"openai-batch"}
