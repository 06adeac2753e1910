"""Loading a job that is already stored, after its spec or its rows changed (issue 15 items
3 and 10; DESIGN invariant 9): a change that alters requests is refused with the fix, or
applied as new versions with `requeue_changed`; a changed row is reported, never silently
paired with an old answer; an id column going float → int names the same requests; a
source without rows is refused. On both stores, through the engine's own loader and tick."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError, SpecError
from lowtide.core.ids import custom_id_for
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.engine.tick import Engine
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, dispatches, jobs, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, whole_columns, write_csv


def _requests(store) -> dict[str, sa.Row]:
    with store.begin() as conn:
        return {r.custom_id: r for r in conn.execute(sa.select(*whole_columns(requests)).order_by(requests.c.id))}


def _stored_spec(store) -> dict:
    with store.begin() as conn:
        return json.loads(conn.execute(sa.select(jobs.c.spec)).scalar_one())


@pytest.fixture
def done(store, clock, tmp_path):
    """Job "tickets" over 5 rows of t.csv, run to the end on echo (which answers with the
    row's own text, so an answer shows which text it was for)."""
    source = write_csv(tmp_path / "t.csv", ticket_rows(5))
    status = drive_to_end(store, make_spec(source), clock)
    assert status.counts == {"succeeded": 5}
    return source


# item 3: a spec change under the same job name -------------------------------------------


def test_a_spec_with_another_model_is_refused_naming_the_fix(store, clock, tmp_path, done):
    before = _requests(store)
    with pytest.raises(SpecError) as info:
        load_job(store, make_spec(done, model="gpt-4o"), clock, "job.yaml")
    msg = str(info.value)
    assert 'job.yaml: job "tickets" was stored with model test-model; this spec says gpt-4o' in msg
    assert "Use a new job name, or pass --requeue-changed" in msg
    assert _stored_spec(store)["model"] == "test-model"  # nothing changed
    assert _requests(store) == before


@pytest.mark.parametrize(
    "change",
    [
        {"params": {"max_tokens": 99}}, {"template": {"user": "Say: {{ body }}"}}, {"choices": ["a", "b"]},
        {"route": "echo-batch"},
    ],
)
def test_every_change_that_alters_requests_is_refused(store, clock, tmp_path, done, change):
    with pytest.raises(SpecError, match="was stored with"):
        load_job(store, make_spec(done, **change), clock)


def test_a_fallback_given_where_there_was_none_is_applied_even_with_a_batch_in_flight(store, clock, tmp_path):
    # Nothing is on the new lane, so nothing moves: no flag, and no wait for the main
    # route's batch (which kept polling, then ended, under the new spec).
    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    options = {"dir": str(tmp_path / "batches"), "polls_to_complete": 3}
    load_job(store, make_spec(source, route="echo-batch", route_options=options), clock)
    asyncio.run(_tick_once(store, clock))
    assert _dispatch_states(store) == ["submitted"]
    fallback = {"route": "echo", "safety_margin": 60}
    report = load_job(store, make_spec(source, route="echo-batch", route_options=options, fallback=fallback), clock)
    assert "fallback (none) → set" in report.applied and "fallback.route (none) → echo" in report.applied
    assert report.requeued == 0 and _stored_spec(store)["fallback"]["route"] == "echo"
    status = drive_to_end(store, make_spec(source, route="echo-batch", route_options=options, fallback=fallback), clock)
    assert status.counts == {"succeeded": 4} and _dispatch_states(store) == ["ended"]


def test_a_fallback_taken_away_or_moved_is_still_refused_without_the_flag(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    drive_to_end(store, make_spec(source, fallback={"route": "echo-batch"}), clock)
    with pytest.raises(SpecError, match="was stored with a fallback; this spec has none"):
        load_job(store, make_spec(source), clock)
    with pytest.raises(SpecError, match=r"was stored with fallback.model \(none\); this spec says other"):
        load_job(store, make_spec(source, fallback={"route": "echo-batch", "model": "other"}), clock)
    assert _stored_spec(store)["fallback"]["route"] == "echo-batch"


async def _tick_once(store, clock) -> None:
    async with Engine(store, clock) as engine:
        await engine.tick("tickets")


def _dispatch_states(store) -> list[str]:
    with store.begin() as conn:
        return list(conn.execute(sa.select(dispatches.c.state).order_by(dispatches.c.id)).scalars())


def test_a_change_that_alters_no_request_is_applied_and_reported(store, clock, tmp_path, done):
    report = load_job(store, make_spec(done, budget_usd="5", retry={"max_attempts": 7}), clock)
    assert report.applied == ["budget_usd (none) → 5", "retry.max_attempts 3 → 7"]
    assert report.new == 0 and report.changed == 0
    spec = _stored_spec(store)
    assert spec["budget_usd"] == "5" and spec["retry"]["max_attempts"] == 7


def test_requeue_changed_re_renders_succeeded_requests_as_new_versions(store, clock, tmp_path, done):
    old = _requests(store)
    report = load_job(store, make_spec(done, model="other-model"), clock, requeue_changed=True)
    assert (report.changed, report.requeued) == (5, 5)
    assert report.changed_line() == "5 row(s) changed since they were stored: re-queued 5 (their earlier answers are kept as earlier versions)"
    now = _requests(store)
    assert {r.state for r in now.values()} == {"pending"}
    assert {r.model for r in now.values()} == {"other-model"}
    assert all(json.loads(r.payload)["body"]["model"] == "other-model" and r.version == 2 for r in now.values())
    from lowtide.store.schema import request_versions

    with store.begin() as conn:
        kept = {r.request_id: r for r in conn.execute(sa.select(*whole_columns(request_versions)))}
    assert {k.request_id: (k.version, k.state, k.output) for k in kept.values()} == {
        r.id: (1, "succeeded", r.output) for r in old.values()
    }
    status = drive_to_end(store, make_spec(done, model="other-model"), clock)
    assert status.counts == {"succeeded": 5}
    with store.begin() as conn:  # the ledger keeps both versions' attempts, each with its model
        models = sorted(conn.execute(sa.select(attempts.c.model)).scalars())
    assert models == ["other-model"] * 5 + ["test-model"] * 5


# item 3: pricing and the openai-batch planner --------------------------------------------


def test_the_openai_batch_planner_never_puts_two_models_in_one_chunk(store, clock, tmp_path, monkeypatch):
    # A store written before the fix: the spec was replaced, half the rows kept the old model.
    from lowtide.engine import batches
    from lowtide.engine.context import JobContext
    from lowtide.routes import create_route

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    source = write_csv(tmp_path / "t.csv", ticket_rows(6))
    load_job(store, make_spec(source, model="gpt-4o-mini", route="openai-batch"), clock)
    with store.begin() as conn:
        for r in conn.execute(sa.select(requests.c.id, payload_text().label("payload")).where(requests.c.id % 2 == 0)).all():
            payload = json.loads(r.payload)
            payload["body"]["model"] = "gpt-4o"
            other = {"payload": json.dumps(payload), "head_id": None} | ({"model": "gpt-4o"} if "model" in requests.c else {})
            conn.execute(requests.update().where(requests.c.id == r.id).values(**other))
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
    assert batches.plan(store, job, create_route("openai-batch", {}), clock) == 6
    with store.begin() as conn:
        rows = conn.execute(sa.select(requests.c.dispatch_id, payload_text().label("payload"))).all()
    models: dict[int, set[str]] = {}
    for dispatch_id, payload in rows:
        models.setdefault(dispatch_id, set()).add(json.loads(payload)["body"]["model"])
    assert sorted(map(sorted, models.values())) == [["gpt-4o"], ["gpt-4o-mini"]]


def test_a_batch_file_with_two_models_is_rejected_for_good(monkeypatch):
    # Sending it again cannot help: BatchRejected fails its requests instead of a retry every tick.
    import asyncio

    from lowtide.core.errors import BatchRejected
    from lowtide.core.types import Request
    from lowtide.routes import create_route

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    two = [Request.chat("a", "gpt-4o", [{"role": "user", "content": "x"}]), Request.chat("b", "gpt-4o-mini", [{"role": "user", "content": "y"}])]

    async def go():
        route = create_route("openai-batch", {"base_url": "http://127.0.0.1:9/v1"})
        try:
            await route.submit("lt-1-x", two)
        finally:
            await route.aclose()

    with pytest.raises(BatchRejected, match="one model per batch file"):
        asyncio.run(go())


# item 10: changed rows, float ids, empty sources -------------------------------------------


def test_a_changed_row_is_reported_kept_and_marked_in_the_results(store, clock, tmp_path, done):
    rows = ticket_rows(5)
    rows[2]["body"] = "an entirely new text"
    write_csv(done, rows)
    report = load_job(store, make_spec(done), clock)
    assert (report.new, report.changed, report.requeued) == (0, 1, 0)
    assert report.changed_line() == "1 row(s) changed since they were stored: kept, with their earlier answers (pass --requeue-changed to re-run them)"
    assert _requests(store)["T1002"].state == "succeeded"
    out = export_results(store, "tickets", tmp_path / "out.parquet")
    table = pq.read_table(out.path).to_pylist()
    changed = {r["ticket_id"]: r["source_changed"] for r in table}
    assert changed == {"T1000": False, "T1001": False, "T1002": True, "T1003": False, "T1004": False}
    assert "entirely new" not in table[2]["output"]  # the answer is the old text's, and says so


def test_a_changed_row_is_re_run_with_requeue_changed(store, clock, tmp_path, done):
    rows = ticket_rows(5)
    rows[2]["body"] = "an entirely new text"
    write_csv(done, rows)
    report = load_job(store, make_spec(done), clock, requeue_changed=True)
    assert (report.changed, report.requeued) == (1, 1)
    assert drive_to_end(store, make_spec(done), clock).counts == {"succeeded": 5}
    table = pq.read_table(export_results(store, "tickets", tmp_path / "out.parquet").path).to_pylist()
    assert "entirely new text" in table[2]["output"] and not any(r["source_changed"] for r in table)


def test_a_changed_template_file_is_detected(store, clock, tmp_path):
    template = tmp_path / "user.j2"
    template.write_text("Ticket: {{ body }}", encoding="utf-8")
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    spec = make_spec(source, template={"user": None, "user_file": str(template)})
    drive_to_end(store, spec, clock)
    template.write_text("Classify: {{ body }}", encoding="utf-8")
    assert load_job(store, spec, clock).changed == 3


def test_an_id_column_from_float_to_int_names_the_same_requests(store, clock, tmp_path):
    def write(ids):
        path = tmp_path / "t.jsonl"
        path.write_text("".join(json.dumps({"id": i, "body": f"row {int(i)}"}) + "\n" for i in ids), encoding="utf-8")
        return path

    spec = make_spec(write([1.0, 2.0, 3.0]), source={"id_column": "id"})
    drive_to_end(store, spec, clock)
    # A store from before the fix holds the float spelling's ids (8 hex digits then): keep one like that.
    old = "3_0-" + hashlib.sha1(b"3.0").hexdigest()[:8]
    with store.begin() as conn:
        conn.execute(requests.update().where(requests.c.custom_id == "3").values(custom_id=old))
    report = load_job(store, make_spec(write([1, 2, 3]), source={"id_column": "id"}), clock)
    assert report.new == 0  # nothing re-run, nothing billed again
    assert report.changed == 0
    assert set(_requests(store)) == {"1", "2", old}
    table = pq.read_table(export_results(store, "tickets", tmp_path / "out.parquet").path).to_pylist()
    assert [r["state"] for r in table] == ["succeeded"] * 3


PHONES = "https://shop.example.com/catalog/electronics/phones/product?id="
PAIR = (PHONES + "32403", PHONES + "176634")  # one custom_id when 8 hex digits told them apart


def _pair_csv(tmp_path, keys):
    return write_csv(tmp_path / "t.csv", [{"ticket_id": k, "channel": "web", "body": f"about {k}"} for k in keys])


def test_keys_of_a_long_shared_prefix_are_no_duplicate(store, clock, tmp_path):
    report = load_job(store, make_spec(_pair_csv(tmp_path, PAIR)), clock)
    assert report.new == 2
    assert {r.source_key for r in _requests(store).values()} == set(PAIR)


def test_a_job_stored_with_8_digit_ids_is_found_under_them(store, clock, tmp_path):
    # A store from before the 16-digit hash holds the first URL under the id both URLs had
    # then; the second is added to the source since, before the first: it is a new request
    # and takes nothing of the first's.
    old = "https_shop_example_com_catalog_electronics_phones_produ-" + hashlib.sha1(PAIR[0].encode()).hexdigest()[:8]
    drive_to_end(store, make_spec(_pair_csv(tmp_path, PAIR[:1])), clock)
    with store.begin() as conn:
        conn.execute(requests.update().values(custom_id=old))
    before = _requests(store)[old]
    report = load_job(store, make_spec(_pair_csv(tmp_path, PAIR[::-1])), clock)
    assert (report.new, report.changed) == (1, 0)  # the first not sent again
    now = _requests(store)
    assert now[old] == before
    assert now[custom_id_for(PAIR[1])].source_key == PAIR[1] and now[custom_id_for(PAIR[1])].state == "pending"
    table = pq.read_table(export_results(store, "tickets", tmp_path / "out.parquet").path).to_pylist()
    states = {r["ticket_id"]: (r["custom_id"], r["state"]) for r in table}
    assert states == {PAIR[0]: (old, "succeeded"), PAIR[1]: (custom_id_for(PAIR[1]), "pending")}


def test_a_source_without_rows_is_refused(store, clock, tmp_path):
    empty = tmp_path / "t.csv"
    empty.write_text("ticket_id,channel,body\n", encoding="utf-8")
    with pytest.raises(SourceError, match=r"source .*t\.csv has no rows; nothing was stored"):
        load_job(store, make_spec(empty), clock)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def test_requeue_changed_refuses_while_a_changed_request_is_in_a_sent_batch(store, clock, tmp_path):
    # The batch at the provider answers the old payload: re-rendering under it would pair
    # that answer with the new one. Refused, nothing changed; so is a route change then.
    import asyncio

    from lowtide.engine.tick import Engine

    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    spec = make_spec(source, route="echo-batch", route_options={"dir": str(tmp_path / "provider"), "polls_to_complete": 5})
    load_job(store, spec, clock)

    async def one_tick():
        async with Engine(store, clock, seed=7) as engine:
            await engine.tick("tickets")

    asyncio.run(one_tick())
    before = _requests(store)
    assert {r.state for r in before.values()} == {"dispatched"}
    with pytest.raises(SpecError, match=r"4 changed request\(s\) are in batches or calls already sent"):
        load_job(store, make_spec(source, **{**spec.model_dump(), "model": "other-model"}), clock, requeue_changed=True)
    with pytest.raises(SpecError, match="has batches in flight on echo-batch"):
        load_job(store, make_spec(source, **{**spec.model_dump(), "route": "echo", "route_options": {}}), clock, requeue_changed=True)
    assert _requests(store) == before and _stored_spec(store)["model"] == "test-model"


def test_requeue_changed_takes_a_planned_batch_apart(store, clock, tmp_path):
    from lowtide.core.states import DispatchState
    from lowtide.engine import batches
    from lowtide.engine.context import JobContext
    from lowtide.routes import create_route
    from lowtide.store.schema import dispatches

    source = write_csv(tmp_path / "t.csv", ticket_rows(4))
    options = {"dir": str(tmp_path / "provider")}
    spec = make_spec(source, route="echo-batch", route_options=options)
    load_job(store, spec, clock)
    with store.begin() as conn:
        job = JobContext.from_row(conn.execute(sa.select(jobs)).one())
    assert batches.plan(store, job, create_route("echo-batch", options), clock) == 4
    report = load_job(store, make_spec(source, **{**spec.model_dump(), "model": "other-model"}), clock, requeue_changed=True)
    assert report.requeued == 4
    with store.begin() as conn:
        assert conn.execute(sa.select(dispatches.c.state)).scalars().all() == [DispatchState.CANCELLED.value]
    now = _requests(store)
    assert {(r.state, r.attempts, r.model, r.version) for r in now.values()} == {("pending", 0, "other-model", 1)}


def test_requests_stored_before_fingerprints_are_compared_by_payload(store, clock, tmp_path, done):
    # As m008 leaves them: no fingerprint; the model is read back from the payload (whole, as
    # every payload was stored before m026).
    from lowtide.store.migrations import _backfill_rendered

    with store.begin() as conn:
        conn.execute(requests.update().values(fingerprint=None, model=None, payload=payload_text(), head_id=None))
        _backfill_rendered(conn)
    assert {r.model for r in _requests(store).values()} == {"test-model"}
    assert load_job(store, make_spec(done), clock).changed == 0
    rows = ticket_rows(5)
    rows[4]["body"] = "changed"
    write_csv(done, rows)
    assert load_job(store, make_spec(done), clock).changed == 1
    table = pq.read_table(export_results(store, "tickets", tmp_path / "out.parquet").path).to_pylist()
    assert [r["source_changed"] for r in table] == [False, False, False, False, True]


def test_requeue_changed_queues_a_failed_request_again_with_a_fresh_attempt_budget(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    status = drive_to_end(store, make_spec(source, route_options={"reject": ["T1001"]}), clock)
    assert status.counts == {"succeeded": 2, "failed": 1}
    report = load_job(store, make_spec(source, model="other-model"), clock, requeue_changed=True)
    assert report.requeued == 3 and "model test-model → other-model" in report.applied
    failed = _requests(store)["T1001"]
    assert (failed.state, failed.attempts, failed.model, failed.version, failed.error_code) == ("pending", 0, "other-model", 1, None)
    assert drive_to_end(store, make_spec(source, model="other-model"), clock).counts == {"succeeded": 3}


def test_a_new_id_column_is_refused_even_with_requeue_changed(store, clock, tmp_path, done):
    with pytest.raises(SpecError, match='stored with ids from column "ticket_id"; this spec takes them from "body".*new job name'):
        load_job(store, make_spec(done, source={"id_column": "body"}), clock, requeue_changed=True)
