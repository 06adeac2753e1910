"""`route: auto`: the cheapest candidate whose expected turnaround fits max_wait, decided
before anything is stored, recorded with its reason, kept on a second submission."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from lowtide.core.auto_spec import parse_duration
from lowtide.core.errors import SpecError
from lowtide.core.pricing import PRICES_ENV
from lowtide.core.spec import JobSpec
from lowtide.engine.loader import load_job
from lowtide.store.schema import dispatches, events, jobs, requests
from tests.conftest import make_spec, ticket_rows, write_csv

CANDIDATES = [
    {"route": "openai-batch"},
    {"route": "openai", "route_options": {"service_tier": "flex"}},
    {"route": "openai"},
]


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # routes are built, never called
    monkeypatch.delenv(PRICES_ENV, raising=False)


def _spec(tmp_path, max_wait, candidates=CANDIDATES, model="gpt-5-mini", rows=40, **more):
    source = write_csv(tmp_path / "t.csv", ticket_rows(rows))
    return make_spec(source, model=model, route="auto", auto={"max_wait": max_wait, "candidates": candidates}, **more)


def _stored(store, name="tickets") -> tuple[JobSpec, list[str]]:
    with store.begin() as conn:
        spec = JobSpec.model_validate_json(conn.execute(sa.select(jobs.c.spec).where(jobs.c.name == name)).scalar_one())
        notes = conn.execute(sa.select(events.c.message).where(events.c.kind == "route_choice")).scalars().all()
    return spec, notes


def test_a_short_wait_takes_flex_and_says_why(store, clock, tmp_path):
    load_job(store, _spec(tmp_path, "2h"), clock)
    spec, notes = _stored(store)
    assert (spec.route, spec.route_options) == ("openai", {"service_tier": "flex"})
    # priors: a batch's p95 is OpenAI's 24 h window; flex 10 s a request in effect, 40 requests
    assert len(notes) == 1
    assert notes[0].startswith("openai (flex): p95 7 min fits 2 h (prior: flex:")
    assert "vs openai-batch $" in notes[0] and "(too slow)" in notes[0] and " / openai $" in notes[0]
    assert spec.fallback is None and spec.deadline is None  # a direct route: no cut-over, max_wait fails nobody
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 40


def test_equal_prices_go_to_the_faster(store, clock, tmp_path):
    # gpt-5-mini's batch and flex prices are the same: flex is faster
    load_job(store, _spec(tmp_path, "1d"), clock)
    spec, notes = _stored(store)
    assert spec.route_options == {"service_tier": "flex"}
    assert notes[0].startswith("openai (flex): p95 7 min fits 24 h") and "vs openai-batch $0.0" in notes[0]


def test_a_day_takes_batch_with_real_time_as_the_next_tier_up(store, clock, tmp_path):
    load_job(store, _spec(tmp_path, "1d", candidates=[CANDIDATES[0], CANDIDATES[2]]), clock)
    spec, notes = _stored(store)
    assert spec.route == "openai-batch" and spec.auto.chosen == "openai-batch"
    assert spec.fallback is None  # the tiers are the chain's, not a fallback's
    assert [(t.route, t.route_options) for t in spec.auto.chain] == [("openai-batch", {}), ("openai", {})]
    assert spec.deadline.timestamp() == clock.now() + 86400  # the end of max_wait: the cut-over's deadline
    assert [t.margin for t in spec.auto.chain] == [0, 80]  # real time's p95 for 40 requests: it takes over that long before the end
    assert "openai-batch: p95 24 h fits 24 h" in notes[0] and "openai takes over as the end of max_wait nears" in notes[0]


def test_measured_turnarounds_replace_the_priors(store, clock, tmp_path):
    # three earlier openai-batch batches of this model took 20, 30 and 38 minutes
    with store.begin() as conn:
        job_id = conn.execute(
            sa.insert(jobs).values(name="earlier", spec="{}", route="openai-batch", state="finished", created_at=0, updated_at=0)
        ).inserted_primary_key[0]
        for i, minutes in enumerate((20, 30, 38)):
            conn.execute(sa.insert(dispatches).values(
                job_id=job_id, route="openai-batch", kind="batch", key=f"k{i}", state="ended", size=10, polls=1,
                cancel_requested=False, created_at=0, submitted_at=1000, ended_at=1000 + minutes * 60, model="gpt-5-mini",
            ))  # fmt: skip
    load_job(store, _spec(tmp_path, "2h", candidates=[CANDIDATES[0], CANDIDATES[2]]), clock)
    spec, notes = _stored(store)
    assert spec.route == "openai-batch"
    assert notes[0].startswith("openai-batch: p95 38 min fits 2 h (measured: 3 batches), $0.0104 vs openai $0.0207")


def test_a_wait_no_candidate_can_meet_is_refused_naming_the_fastest(store, clock, tmp_path):
    with pytest.raises(SpecError) as err:
        load_job(store, _spec(tmp_path, "1m"), clock)
    message = str(err.value)
    assert "auto.max_wait 60 s: no candidate is expected to finish in time" in message
    assert "the fastest, openai, takes 80 s (p95, prior:" in message and "raise max_wait, or add a faster candidate" in message
    with store.begin() as conn:  # nothing was stored
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def test_a_candidate_without_prices_is_refused_by_name(store, clock, tmp_path):
    # genai-prices lists no flex tier for gpt-4o-mini on any date
    with pytest.raises(SpecError) as err:
        load_job(store, _spec(tmp_path, "2h", model="gpt-4o-mini"), clock)
    assert "auto.candidates[1] (openai (flex)) has no price: the catalog has no flex price for gpt-4o-mini" in str(err.value)
    assert "add one to a price file (docs/costs.md) or drop the candidate" in str(err.value)


def test_submitting_again_keeps_the_choice(store, clock, tmp_path):
    spec = _spec(tmp_path, "1d")
    load_job(store, spec, clock)
    first, _ = _stored(store)
    clock.advance(3600)
    report = load_job(store, spec, clock)
    again, notes = _stored(store)
    assert again == first and len(notes) == 1 and report.new == 0


@pytest.mark.parametrize(
    ("auto", "message"),
    [
        ({"max_wait": "soon", "candidates": CANDIDATES}, "'soon' is not a duration; give e.g. 90m, 2h, 1d, or `deadline`"),
        ({"max_wait": "deadline", "candidates": CANDIDATES}, "`auto.max_wait: deadline` needs a `deadline:`"),
        ({"max_wait": "2h", "candidates": [{"route": "openai"}, {"route": "openai"}]}, "one is given twice"),
        ({"max_wait": "2h", "candidates": [{"route": "auto"}]}, "a candidate is a route that runs requests, not `auto`"),
    ],
)
def test_a_bad_auto_section_is_refused(tmp_path, auto, message):
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    with pytest.raises(Exception) as err:
        make_spec(source, route="auto", auto=auto)
    assert message in str(err.value)


def test_auto_needs_its_section_and_the_section_needs_auto(tmp_path):
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    with pytest.raises(Exception, match="go together"):
        make_spec(source, route="auto")
    with pytest.raises(Exception, match="go together"):
        make_spec(source, route="openai", auto={"max_wait": "2h", "candidates": CANDIDATES})


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("45m", 2700), ("2h", 7200), ("1.5 h", 5400), ("1d", 86400), (600, 600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_a_choice_that_is_the_specs_own_fallback_route_is_refused_naming_both(store, clock, tmp_path):
    # Found by the simulation (seed 32003): a short max_wait takes real time, the route the
    # spec's own fallback names. That was a pydantic traceback out of load_job; nothing is stored.
    fallback = {"route": "openai", "model": "gpt-4o-mini"}
    with pytest.raises(SpecError) as err:
        load_job(store, _spec(tmp_path, "30m", candidates=[CANDIDATES[0], CANDIDATES[2]], fallback=fallback), clock)
    said = str(err.value)
    assert "auto chose openai" in said and "`fallback.route` is openai too" in said
    assert "drop the fallback (a chain of candidates moves work up by itself), or name another route there" in said
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def _at(clock, seconds):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(clock.now() + seconds, UTC)


def test_a_new_deadline_of_a_decided_job_is_applied_no_later_than_the_end_of_max_wait(store, clock, tmp_path):
    # Found by the simulation: a job decided on a chain kept the deadline of its first
    # submission, and the operator's new one was dropped without a word (`applied` empty).
    two = [CANDIDATES[0], CANDIDATES[2]]
    load_job(store, _spec(tmp_path, "1d", candidates=two), clock)
    end = _at(clock, 86400)
    report = load_job(store, _spec(tmp_path, "1d", candidates=two, deadline=_at(clock, 3600).isoformat()), clock)
    spec, notes = _stored(store)
    assert spec.deadline == _at(clock, 3600) and spec.auto.chain is not None and len(notes) == 1  # the choice is kept
    assert report.applied == [f"deadline {end.isoformat().replace('+00:00', 'Z')} → {_at(clock, 3600).isoformat().replace('+00:00', 'Z')}"]
    load_job(store, _spec(tmp_path, "1d", candidates=two, deadline=_at(clock, 3 * 86400).isoformat()), clock)
    assert _stored(store)[0].deadline == end  # later than max_wait: the chain still works to its end
    load_job(store, _spec(tmp_path, "1d", candidates=two), clock)
    assert _stored(store)[0].deadline == end


def test_a_fallback_given_to_a_job_decided_on_a_chain_decides_again(store, clock, tmp_path):
    # A chain is made only without a fallback of the spec's own: the new fallback was dropped
    # without a word. Now the choice is made again, a change of lanes like any other.
    two = [CANDIDATES[0], CANDIDATES[2]]
    load_job(store, _spec(tmp_path, "1d", candidates=two), clock)
    with_fallback = _spec(tmp_path, "1d", candidates=two, fallback={"route": "echo"})
    with pytest.raises(SpecError, match=r"fallback \(none\) → set.*--requeue-changed"):
        load_job(store, with_fallback, clock)
    load_job(store, with_fallback, clock, requeue_changed=True)
    spec, notes = _stored(store)
    assert spec.route == "openai-batch" and spec.fallback.route == "echo" and spec.auto.chain is None and len(notes) == 2
