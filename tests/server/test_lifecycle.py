"""Time, expiry, restarts and backends: a batch's life around the engine."""

from __future__ import annotations

import pytest

from lowtide.core.clock import ManualClock
from lowtide.core.errors import UnknownRouteError
from lowtide.engine.control import job_status
from lowtide.server import ServeConfig, create_app
from lowtide.server.clock import ScaledClock
from lowtide.server.translate import decode_key, encode_key
from lowtide.store.db import Store
from tests.server.conftest import (
    chat_line,
    create_batch,
    file_lines,
    message_request,
    wait_anthropic,
    wait_openai,
    wait_until,
)


def test_each_batch_is_a_lowtide_job_named_after_it(server):
    client = server.openai()
    batch = wait_openai(client, create_batch(client, [chat_line(f"r{i}") for i in range(3)]).id)
    status = job_status(server.server.store, batch.id)
    assert status.state == "finished" and status.route == "echo"
    assert status.counts == {"succeeded": 3}


def test_complete_after_holds_a_finished_batch_in_progress(serve):
    # The worker thread runs on a clock that moves only when the test moves it: the batch is
    # held in progress however slowly the machine runs, and completes once two hours pass.
    with serve(clock=ManualClock(1_900_000_000.0), complete_after=7200) as s:
        client = s.openai()
        batch = create_batch(client, [chat_line("a"), chat_line("b")])
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed == 2, what="the requests to run")
        assert client.batches.retrieve(batch.id).status == "in_progress"
        s.server.clock.clock.advance(7200)
        s.server.wake()
        done = wait_openai(client, batch.id)
        assert done.status == "completed"
        assert done.completed_at - done.created_at >= 7200


def test_the_24h_window_expires_with_what_ran_in_the_output(serve, gate):
    # The worker thread runs; the clock moves only when the test moves it, so the window
    # closes exactly while r0 is held at the gate, however slowly the machine starts.
    with serve(routes={"echo": gate}, clock=ManualClock(1_900_000_000.0)) as s:
        clock = s.server.clock.clock

        def close_window(expires_at: float) -> None:
            clock.advance(expires_at - clock.now() + 1)
            s.server.wake()

        client = s.openai()
        batch = create_batch(client, [chat_line(f"r{i}") for i in range(4)])
        wait_until(lambda: gate.waiting == 1, what="r0 to reach the backend")
        close_window(batch.expires_at)
        gate.release(1)  # r0 was in flight when the window closed: it finishes, and is in the output
        done = wait_openai(client, batch.id)
        assert done.status == "expired" and done.expired_at >= done.expires_at
        assert [x["custom_id"] for x in file_lines(client, done.output_file_id)] == ["r0"]
        errors = file_lines(client, done.error_file_id)
        assert sorted(e["custom_id"] for e in errors) == ["r1", "r2", "r3"]
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}

        messages = s.anthropic()
        mb = messages.messages.batches.create(requests=[message_request("m0"), message_request("m1")])
        wait_until(lambda: gate.waiting == 1, what="m0 to reach the backend")
        close_window(messages.messages.batches.retrieve(mb.id).expires_at.timestamp())
        gate.release(1)
        done = wait_anthropic(messages, mb.id)
        assert done.request_counts.model_dump() == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 0, "expired": 1}
        results = {r.custom_id: r.result.type for r in messages.messages.batches.results(mb.id)}
        assert results == {"m0": "succeeded", "m1": "expired"}


def test_batches_run_in_the_order_they_were_created(serve, gate):
    with serve(routes={"echo": gate}) as s:
        client = s.openai()
        first = create_batch(client, [chat_line(f"a{i}") for i in range(3)])
        second = create_batch(client, [chat_line(f"b{i}") for i in range(3)])
        gate.release(3)  # room for three requests: all of them the first batch's
        done = wait_openai(client, first.id)
        assert done.status == "completed" and done.request_counts.completed == 3
        later = client.batches.retrieve(second.id)
        assert later.status in ("validating", "in_progress") and later.request_counts.completed == 0
        gate.release()
        assert wait_openai(client, second.id).request_counts.completed == 3


def test_a_batch_survives_a_server_restart(serve):
    with serve(time_scale=3600, complete_after=3600 * 24 * 7) as s:  # would take a week
        client = s.openai()
        batch = create_batch(client, [chat_line(f"r{i}") for i in range(20)])
        messages = s.anthropic()
        mb = messages.messages.batches.create(requests=[message_request(f"m{i}") for i in range(5)])
        wait_openai(client, batch.id, ("in_progress",))
    with serve(time_scale=3600) as s:  # the next server, on the same store and data dir
        client, messages = s.openai(), s.anthropic()
        done = wait_openai(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 20
        assert sorted(x["custom_id"] for x in file_lines(client, done.output_file_id)) == sorted(f"r{i}" for i in range(20))
        assert wait_anthropic(messages, mb.id).request_counts.succeeded == 5
        assert client.files.retrieve(done.input_file_id).bytes > 0


def test_a_batch_route_backend_runs_batches_too(serve, tmp_path):
    with serve(backend="echo-batch", route_options={"dir": str(tmp_path / "provider")}, time_scale=3600) as s:
        client = s.openai()
        done = wait_openai(client, create_batch(client, [chat_line(f"r{i}", f"t{i}") for i in range(4)]).id)
        assert done.status == "completed"
        out = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"] for x in file_lines(client, done.output_file_id)}
        assert out == {f"r{i}": f"t{i}" for i in range(4)}


def test_a_model_the_backend_does_not_run_fails_each_request(serve):
    with serve(backend="local") as s:  # the local route runs smollm2-135m-instruct only
        client = s.openai()
        done = wait_openai(client, create_batch(client, [chat_line("a", model="gpt-4o")]).id)
        assert done.status == "completed" and done.request_counts.failed == 1
        error = file_lines(client, done.error_file_id)[0]["response"]
        assert error["status_code"] == 404 and error["body"]["error"]["code"] == "model_not_found"
        assert "smollm2" in error["body"]["error"]["message"]
        messages = s.anthropic()
        mb = messages.messages.batches.create(requests=[message_request("a", model="claude-1"), message_request("b", model="claude-2")])
        assert wait_anthropic(messages, mb.id).request_counts.errored == 2
        errors = {r.custom_id: r.result.error.error for r in messages.messages.batches.results(mb.id)}
        assert {e.type for e in errors.values()} == {"not_found_error"} and set(errors) == {"a", "b"}


def test_the_model_option_runs_every_batch_on_one_backend_model(serve):
    with serve(model="echo-model") as s:
        client = s.openai()
        done = wait_openai(client, create_batch(client, [chat_line("a", model="gpt-4o")]).id)
        assert file_lines(client, done.output_file_id)[0]["response"]["body"]["model"] == "gpt-4o"
        from lowtide.engine.control import job_spec

        assert job_spec(s.server.store, done.id).model == "echo-model"


def test_an_unknown_backend_lists_the_known_ones(tmp_path):
    with pytest.raises(UnknownRouteError, match="known routes: .*echo"):
        create_app(ServeConfig(backend="nope", data_dir=tmp_path / "d", db=str(tmp_path / "x.db")))


def test_the_clock_is_anchored_in_the_store_and_never_runs_back(tmp_path):
    now = [1000.0]
    with Store(str(tmp_path / "c.db")) as store:
        fast = ScaledClock.open(store, 100.0, real=lambda: now[0])
        assert fast.now() == 1000.0
        now[0] += 10
        assert fast.now() == 2000.0
        again = ScaledClock.open(store, 100.0, real=lambda: now[0])  # a restart: same anchor
        assert again.now() == 2000.0
        now[0] += 1
        slower = ScaledClock.open(store, 1.0, real=lambda: now[0])  # a new scale continues from there
        assert slower.now() == 2100.0
        now[0] += 5
        assert slower.now() == 2105.0


@pytest.mark.parametrize("key", ["a", " a", "a ", "~a", "", "é", "\ud800x", "x" * 200, "a\nb", "1.0", "-7.00"])
def test_custom_id_keys_round_trip(key):
    encoded = encode_key(key)
    assert encoded == encoded.strip() and encoded
    assert decode_key(encoded) == key


def test_custom_ids_one_and_one_point_zero_are_two_requests(server):
    # The loader takes a float-spelled integral key for the integer's ("1.0" is key "1"):
    # serve carried "1.0" as it was, so the load refused the file as a duplicate and every
    # line of the batch failed. At OpenAI they are two ids.
    client = server.openai()
    ids = ["1", "1.0", "-7.00", "-7", "other"]
    batch = wait_openai(client, create_batch(client, [chat_line(i, f"q {i}") for i in ids]).id)
    assert batch.status == "completed" and batch.request_counts.completed == 5 and batch.request_counts.failed == 0
    out = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"] for x in file_lines(client, batch.output_file_id)}
    assert out == {i: f"q {i}" for i in ids}


@pytest.mark.postgres
def test_the_server_runs_on_postgresql(serve, pg_schema_url):
    with serve(db=pg_schema_url) as s:
        client = s.openai()
        done = wait_openai(client, create_batch(client, [chat_line(f"r{i}") for i in range(5)]).id)
        assert done.status == "completed" and done.request_counts.completed == 5
        assert [b.id for b in client.batches.list(limit=1)][:1] == [done.id]
        messages = s.anthropic()
        mb = messages.messages.batches.create(requests=[message_request("a"), message_request("b")])
        assert wait_anthropic(messages, mb.id).request_counts.succeeded == 2


def test_a_line_the_backend_keeps_failing_falls_back_where_serve_is_told(serve):
    """serve's jobs took a fixed three attempts and had no fallback (found running Airflow's
    LLMBatchOperator against serve): `--max-attempts` and `--fallback` now say both."""
    failing = {"fail_attempts": {"b": 100}}  # echo fails line b's first 100 attempts, retryably
    with serve(time_scale=3600, route_options=failing, max_attempts=2, fallback={"route": "echo-batch"}) as s:
        client = s.openai()
        batch = wait_openai(client, create_batch(client, [chat_line("a", "one"), chat_line("b", "two")]).id)
        assert batch.status == "completed" and batch.request_counts.completed == 2 and batch.request_counts.failed == 0
        out = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"] for x in file_lines(client, batch.output_file_id)}
        assert out == {"a": "one", "b": "two"}
        status = job_status(s.server.store, batch.id)
        assert ("echo-batch", "succeeded") in {(route, state) for route, _why, state, _n in status.placement}
    with serve(time_scale=3600, route_options=failing, max_attempts=2) as s:  # no fallback: b fails after 2
        client = s.openai()
        batch = wait_openai(client, create_batch(client, [chat_line("a"), chat_line("b")]).id)
        assert batch.request_counts.failed == 1
        assert "gave up after 2 attempts" in str(file_lines(client, batch.error_file_id))


def test_a_fallback_serve_cannot_make_is_refused_at_start(tmp_path):
    with pytest.raises(UnknownRouteError, match="no-such-route"):
        create_app(ServeConfig(data_dir=tmp_path, db=str(tmp_path / "s.db"), fallback={"route": "no-such-route"}))
    with pytest.raises(Exception, match="max_attempts"):
        create_app(ServeConfig(data_dir=tmp_path, db=str(tmp_path / "s.db"), max_attempts=0))
