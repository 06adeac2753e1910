"""Evals end to end on both stores (engine/evals.py, engine/compare.py, engine/stages.py):
every (row, variant) is a request with its KEY__VARIANT custom_id; batch routes get one model
per batch; adding a variant runs only the new variant and changes no stored request; the
judge stage is a job over the first stage's answers; the report's numbers are recomputed
here from the rows; bad input is refused before anything is stored."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from lowtide.core.errors import SourceError, SpecError
from lowtide.core.evals import build_eval
from lowtide.core.stats import mcnemar_p
from lowtide.engine.compare import compare, variant_rows
from lowtide.engine.eval_export import export_eval_results
from lowtide.engine.evals import drive_jobs, load_eval, load_judge, run_eval, stored_eval
from lowtide.engine.tick import Engine
from lowtide.store.payloads import payload_text
from lowtide.store.schema import dispatches, events, jobs, requests
from tests.conftest import ticket_rows, whole_columns, write_csv


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Specs built here without a file live in the working folder: make it the test's."""
    monkeypatch.chdir(tmp_path)


CHOICES = ["billing", "technical", "account", "shipping", "feedback"]


def spec(source, prompts=("right", "wrong"), models=None, **over) -> dict:
    # echo answers with the first allowed choice the user message mentions: "right" names the
    # row's own label (its body does), "wrong" names "technical" first, whatever the row.
    users = {"right": "Ticket: {{ body }}", "wrong": "technical or {{ body }}?", "other": "Is it {{ body }}"}
    data = {
        "name": "ev",
        "source": {"path": str(source), "id_column": "ticket_id"},
        "template": {"system": "Sort the ticket."},
        "choices": CHOICES,
        "params": {"max_tokens": 8},
        "variants": {
            "models": models or [{"name": "e", "model": "echo-model", "route": "echo"}],
            "prompts": [{"name": p, "user": users[p]} for p in prompts],
        },
        "scoring": {"method": "choice", "expected": "gold"},
    }
    return data | over


def run(store, clock, data, requeue_changed=False, members_only=False):
    # The spec "lives" beside its source, so the judge stage's file is written there, not here.
    ev = build_eval(data, where=str(Path(data["source"]["path"]).with_name("ev.yaml")))
    reports = load_eval(store, ev, clock, requeue_changed=requeue_changed)

    async def idle(_seconds):
        clock.advance(3600)

    async def go():
        async with Engine(store, clock, seed=7) as engine:
            if members_only:  # a worker, or a run stopped before the judge
                return await drive_jobs(engine, [m.spec.name for m in ev.members], on_idle=idle)
            again = {"requeue_changed": True} if requeue_changed else {}
            return await run_eval(engine, ev, clock, on_idle=idle, **again)

    return ev, reports, asyncio.run(go())


def test_every_row_and_variant_runs_and_the_report_is_right(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(40))
    ev, _, statuses = run(store, clock, spec(source))
    assert [s.counts for s in statuses] == [{"succeeded": 40}, {"succeeded": 40}]
    with store.begin() as conn:
        ids = set(conn.scalars(sa.select(requests.c.custom_id)))
    assert ids == {f"T{1000 + i}__e-{p}" for i in range(40) for p in ("right", "wrong")}
    report = compare(store, stored_eval(store, "ev"))
    right, wrong = report.variants
    assert (right.scored, right.correct, right.accuracy, right.ci_low, right.ci_high) == (40, 40, 1.0, 1.0, 1.0)
    assert (wrong.scored, wrong.correct) == (40, 8)  # the 8 rows whose label is technical
    assert wrong.ci_low < 0.2 < wrong.ci_high
    (pair,) = report.pairs
    assert (pair.n, pair.a_only, pair.b_only, pair.difference) == (40, 32, 0, 0.8)
    assert pair.p_value == mcnemar_p(32, 0) == pytest.approx(2 * 0.5**32)
    assert report.confusion["e-wrong"] == {label: {"technical": 8} for label in CHOICES}
    assert report.confusion["e-right"] == {label: {label: 8} for label in CHOICES}
    assert report.disagreeing_rows == 32 and len(report.disagreements) == 20
    row = report.disagreements[0]
    assert row["answers"]["e-wrong"] == "technical" and row["correct"] == {"e-right": True, "e-wrong": False}
    assert right.input_tokens > 0 and right.turnaround_p50_s is not None and right.cost_usd is not None


def test_a_row_without_expected_is_not_scored_never_wrong(store, clock, tmp_path):
    rows = ticket_rows(10)
    for r in rows[:3]:
        r["gold"] = ""
    ev, _, _ = run(store, clock, spec(write_csv(tmp_path / "t.csv", rows)))
    right, wrong = compare(store, ev).variants
    assert (right.rows, right.scored, right.correct, right.not_scored) == (10, 7, 7, {"no expected value": 3})
    assert wrong.scored == 7 and wrong.not_scored == {"no expected value": 3}


def test_adding_a_variant_runs_only_it_and_changes_nothing_stored(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(12))
    run(store, clock, spec(source, prompts=("right",)))
    with store.begin() as conn:
        before = {r.custom_id: (r.payload, r.fingerprint, r.version, r.state) for r in conn.execute(sa.select(*whole_columns(requests)))}
        old_spec = conn.execute(sa.select(jobs.c.spec).where(jobs.c.name == "ev.e-right")).scalar_one()
    ev, reports, statuses = run(store, clock, spec(source, prompts=("right", "other")))
    assert [(r.new, r.changed, r.applied) for r in reports] == [(0, 0, []), (12, 0, [])]
    with store.begin() as conn:
        after = {r.custom_id: (r.payload, r.fingerprint, r.version, r.state) for r in conn.execute(sa.select(*whole_columns(requests)))}
        assert conn.execute(sa.select(jobs.c.spec).where(jobs.c.name == "ev.e-right")).scalar_one() == old_spec
        kinds = set(conn.scalars(sa.select(events.c.kind)))
    assert {k: v for k, v in after.items() if k in before} == before
    assert len(after) == 24 and "spec_changed" not in kinds and "rows_changed" not in kinds
    assert [v.scored for v in compare(store, ev).variants] == [12, 12]


def test_batch_variants_are_split_by_model(store, clock, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWTIDE_ECHO_BATCH_DIR", str(tmp_path / "eb"))
    models = [{"name": "m1", "model": "model-one", "route": "echo-batch"}, {"name": "m2", "model": "model-two", "route": "echo-batch"}]
    _, _, statuses = run(store, clock, spec(write_csv(tmp_path / "t.csv", ticket_rows(15)), prompts=("right",), models=models))
    assert all(s.counts == {"succeeded": 15} for s in statuses)
    with store.begin() as conn:
        per_batch = conn.execute(
            sa.select(requests.c.dispatch_id, sa.func.count(sa.distinct(requests.c.model))).group_by(requests.c.dispatch_id)
        ).all()
        kinds = set(conn.scalars(sa.select(dispatches.c.kind)))
    assert kinds == {"batch"} and len(per_batch) >= 2 and all(n == 1 for _, n in per_batch)


def test_the_judge_stage_scores_from_its_verdicts(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    data = spec(
        source,
        scoring={"method": "judge", "expected": "gold"},
        judge={"model": "judge-model", "route": "echo", "params": {"max_tokens": 64},
               "user": "Expected {{ expected }}; the {{ variant }} answer to {{ body }} was {{ output }}. Correct?"},
    )  # fmt: skip
    ev, _, statuses = run(store, clock, data)
    assert statuses[-1].name == "ev.judge" and statuses[-1].counts == {"succeeded": 20}
    with store.begin() as conn:
        judge_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == "ev.judge")).scalar_one()
        verdicts = {k: json.loads(p)["correct"] for k, p in conn.execute(
            sa.select(requests.c.source_key, requests.c.parsed).where(requests.c.job_id == judge_id))}  # fmt: skip
        payload = json.loads(conn.execute(sa.select(payload_text().label("payload")).where(requests.c.job_id == judge_id).limit(1)).scalar_one())
    assert set(verdicts) == {f"T{1000 + i}__e-{p}" for i in range(10) for p in ("right", "wrong")}
    assert "the e-" in payload["body"]["messages"][-1]["content"] and "Expected " in payload["body"]["messages"][-1]["content"]
    report = compare(store, ev)
    for v in report.variants:
        mine = [ok for k, ok in verdicts.items() if k.endswith("__" + v.variant)]
        assert (v.scored, v.correct) == (10, sum(mine))
    assert report.judge["states"] == {"succeeded": 20}
    # Run again: nothing new to judge, nothing re-run.
    _, reports, statuses = run(store, clock, data)
    assert [r.new for r in reports] == [0, 0] and statuses[-1].counts == {"succeeded": 20}


def test_a_re_run_answer_is_never_shown_with_the_verdict_on_its_old_answer_and_is_judged_again(store, clock, tmp_path):
    rows = ticket_rows(5)
    source = write_csv(tmp_path / "t.csv", rows)
    judge = {"model": "judge-model", "route": "echo", "params": {"max_tokens": 64}, "user": "Was {{ output }} right for {{ body }}?"}
    data = spec(source, prompts=("right",), scoring={"method": "judge", "expected": "gold"}, judge=judge)
    ev, _, _ = run(store, clock, data)
    assert compare(store, ev).variants[0].scored == 5
    rows[0]["body"] = "ticket 1000 about shipping"  # was billing: the member now answers shipping
    write_csv(source, rows)

    def judged(cid):
        with store.begin() as conn:
            q = sa.select(requests.c.output, requests.c.version).join(jobs)
            answer = conn.execute(q.where(jobs.c.name == "ev.e-right", requests.c.custom_id == cid)).one()
            q = sa.select(payload_text().label("payload"), requests.c.version).join(jobs).where(jobs.c.name == "ev.judge", requests.c.source_key == cid)
            payload, version = conn.execute(q).one()
        return tuple(answer), json.loads(payload)["body"]["messages"][-1]["content"], version

    # The member re-runs the row; the judge has not run yet (a worker, or a run stopped before it).
    run(store, clock, data, requeue_changed=True, members_only=True)
    assert judged("T1000__e-right") == (("shipping", 2), "Was billing right for ticket 1000 about billing?", 1)
    (v,) = compare(store, ev).variants
    assert (v.scored, v.not_scored) == (4, {"judged an earlier answer or row (run again with --requeue-changed)": 1})
    # Run with --requeue-changed: the judge's row for it is rendered from the new answer and sent again.
    run(store, clock, data, requeue_changed=True)
    assert judged("T1000__e-right") == (("shipping", 2), "Was shipping right for ticket 1000 about shipping?", 2)
    (v,) = compare(store, ev).variants
    assert (v.scored, v.not_scored) == (5, {})
    with store.begin() as conn:
        states = conn.execute(sa.select(requests.c.state, sa.func.count()).join(jobs).where(jobs.c.name == "ev.judge").group_by(requests.c.state))
        assert dict(states.all()) == {"succeeded": 5}


def test_a_verdict_batch_left_in_flight_ends_before_its_changed_answer_is_judged_again(store, clock, tmp_path, monkeypatch):
    # A run stopped while the judge's batch was out: --requeue-changed may not re-queue a row of a
    # batch already sent (its answer would be for the old row), so the run collects that batch first.
    monkeypatch.setenv("LOWTIDE_ECHO_BATCH_DIR", str(tmp_path / "eb"))
    rows = ticket_rows(3)
    source = write_csv(tmp_path / "t.csv", rows)
    judge = {"model": "judge-model", "route": "echo-batch", "route_options": {"polls_to_complete": 3},
             "params": {"max_tokens": 64}, "user": "Was {{ output }} right for {{ body }}?"}  # fmt: skip
    data = spec(source, prompts=("right",), scoring={"method": "judge", "expected": "gold"}, judge=judge)
    ev, _, _ = run(store, clock, data, members_only=True)

    async def send_the_judge():
        assert load_judge(store, ev, clock).new == 3
        async with Engine(store, clock, seed=7) as engine:
            await engine.tick("ev.judge")

    asyncio.run(send_the_judge())
    with store.begin() as conn:
        assert set(conn.scalars(sa.select(dispatches.c.state).join(jobs).where(jobs.c.name == "ev.judge"))) == {"submitted"}
    rows[0]["body"] = "ticket 1000 about shipping"
    write_csv(source, rows)
    _, _, statuses = run(store, clock, data, requeue_changed=True)
    assert [(s.name, s.counts) for s in statuses] == [("ev.e-right", {"succeeded": 3}), ("ev.judge", {"succeeded": 3})]
    with store.begin() as conn:
        q = sa.select(requests.c.source_key, requests.c.version).join(jobs).where(jobs.c.name == "ev.judge")
        assert dict(conn.execute(q).all()) == {"T1000__e-right": 2, "T1001__e-right": 1, "T1002__e-right": 1}
    assert compare(store, ev).variants[0].scored == 3


def test_an_answer_to_a_row_changed_since_is_not_scored_against_its_new_expected_value(store, clock, tmp_path):
    # Invariant 9: the stored answer was to the row's old text; scored against the new gold it
    # would pass off an answer to another question as right (or wrong).
    rows = ticket_rows(5)
    source = write_csv(tmp_path / "t.csv", rows)
    ev, _, _ = run(store, clock, spec(source, prompts=("right",)))
    rows[0] |= {"body": "ticket 1000 about shipping", "gold": "shipping"}  # answered "billing" to the old text
    rows[1]["gold"] = "account"  # a corrected label alone: the answer is still to the row as it is
    write_csv(source, rows)
    (v,) = compare(store, ev).variants
    assert (v.succeeded, v.scored, v.correct, v.failures) == (5, 4, 3, {})
    assert v.not_scored == {"source row changed since it was answered; run again with --requeue-changed": 1}
    export_eval_results(store, ev, tmp_path / "a.csv")
    with open(tmp_path / "a.csv", newline="") as f:
        got = {r["ticket_id"]: (r["source_changed"], r["correct"]) for r in csv.DictReader(f)}
    assert got["T1000"] == ("True", "") and got["T1001"] == ("False", "False") and got["T1002"] == ("False", "True")
    run(store, clock, spec(source, prompts=("right",)), requeue_changed=True)
    (v,) = compare(store, ev).variants
    assert (v.scored, v.correct, v.not_scored) == (5, 4, {})


def test_requests_still_in_flight_are_not_finished_never_failures(store, clock, tmp_path, monkeypatch):
    # A run stopped while a variant's batch is out: its requests are not answered yet, not failed.
    monkeypatch.setenv("LOWTIDE_ECHO_BATCH_DIR", str(tmp_path / "eb"))
    models = [{"name": "b", "model": "echo-model", "route": "echo-batch", "route_options": {"polls_to_complete": 3}}]
    data = spec(write_csv(tmp_path / "t.csv", ticket_rows(4)), models=models)
    ev = build_eval(data, where=str(tmp_path / "ev.yaml"))
    load_eval(store, ev, clock)

    async def send_one():
        async with Engine(store, clock, seed=7) as engine:
            await engine.tick("ev.b-right")  # its batch sent; ev.b-wrong's requests still pending

    asyncio.run(send_one())
    with store.begin() as conn:
        states = conn.execute(sa.select(jobs.c.name, requests.c.state, sa.func.count()).join(jobs).group_by(jobs.c.name, requests.c.state))
        assert sorted(states.all()) == [("ev.b-right", "dispatched", 4), ("ev.b-wrong", "pending", 4)]
    report = compare(store, ev)
    for v in report.variants:
        assert (v.rows, v.scored, v.failures) == (4, 0, {})
        assert v.not_scored == {"not answered yet (pending or in flight)": 4}
    assert [(r["failed"], r["failures"], r["not_scored"]) for r in variant_rows(report)] == [(0, "{}", 4)] * 2


def test_a_judge_template_using_a_column_the_first_stage_lacks_is_refused(store, clock, tmp_path):
    data = spec(write_csv(tmp_path / "t.csv", ticket_rows(3)), judge={"model": "j", "route": "echo", "user": "{{ output }} vs {{ reference }}"})
    with pytest.raises(SpecError) as err:
        load_eval(store, build_eval(data, where="ev.yaml"), clock)
    text = str(err.value)
    assert 'judge.user uses "reference", which the first stage does not produce' in text and "output" in text and "body" in text
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0


def test_labels_outside_the_choices_are_refused_with_row_and_fix(store, clock, tmp_path):
    rows = ticket_rows(6)
    rows[4]["gold"] = "shiping"
    with pytest.raises(SourceError) as err:
        load_eval(store, build_eval(spec(write_csv(tmp_path / "t.csv", rows)), where="ev.yaml"), clock)
    assert "t.csv row 5 (line 6): column \"gold\" (scoring.expected) holds 'shiping', which is not one of the choices" in str(err.value)
    assert "add it to `choices`" in str(err.value)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def test_a_missing_expected_column_is_refused(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(3))
    with pytest.raises(SourceError, match=r'no column "label" \(scoring.expected\)'):
        load_eval(store, build_eval(spec(source, scoring={"method": "choice", "expected": "label"})), clock)
