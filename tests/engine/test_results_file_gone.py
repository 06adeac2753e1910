"""An ended batch whose results file the provider answers 404 for (deleted there by a cleanup
script or in its dashboard, well inside the card's results window): after the grace a batch
the provider does not know gets (an hour), its requests leave it `batch_lost`, retryable,
naming the file, and run again; they were left `dispatched` until the card's 30-day window
passed, an `ingest_error` every poll. A download that breaks off is read again next poll, as
long as it takes. openai-batch in the simulation's world (`lowtide serve` in this process,
one ManualClock)."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.server.faults import FaultPlan
from lowtide.store.schema import serve_batches, serve_files
from tests.engine.sim_world import dispatch_rows, event_rows, load, request_rows, rounds, world
from tests.sim import invariants


def _ended(w) -> str:
    """Job a's three requests in one openai-batch batch, which the provider runs to its end;
    the id of its output file."""
    load(w, "openai-batch", rows=3, chunk=3)
    w.tick()
    w.serve_step()
    with w.providers["main"].store.read() as conn:
        [output] = conn.scalars(sa.select(serve_batches.c.output_file_id)).all()
    assert output
    return output


def test_a_results_file_the_provider_deleted_gives_its_requests_up_after_the_lost_grace(tmp_path):
    with world(tmp_path) as w:
        output = _ended(w)
        with w.providers["main"].store.begin() as conn:
            conn.execute(sa.delete(serve_files).where(serve_files.c.id == output))  # deleted at the provider
        rounds(w, 5, 600)  # 50 minutes of polls, each download answered 404: inside the grace
        assert [d.state for d in dispatch_rows(w)] == ["submitted"]
        assert [r.state for r in request_rows(w)] == ["dispatched"] * 3

        rounds(w, 4, 600)  # past the hour: given up, its requests sent again in a new batch
        first = dispatch_rows(w)[0]
        assert first.state == "failed" and output in first.error and "not found" in first.error, first.error
        [said] = event_rows(w, "batch_lost")
        assert output in said
        rounds(w, 4, 600)
        rows = request_rows(w)
        assert [r.state for r in rows] == ["succeeded"] * 3 and {r.attempts for r in rows} == {2}
        assert [d.state for d in dispatch_rows(w)] == ["failed", "ended"] and invariants.batches_created(w) == 2


def test_a_results_download_that_breaks_off_is_read_again_however_long_it_takes(tmp_path):
    with world(tmp_path) as w:
        _ended(w)
        w.set_faults(FaultPlan.model_validate({"http": [{"match": "GET /v1/files/*/content", "status": 500, "retry_after": 0}]}))
        rounds(w, 4, 1800)  # two hours of downloads that fail, none saying the file is gone
        assert [d.state for d in dispatch_rows(w)] == ["submitted"]
        assert [r.state for r in request_rows(w)] == ["dispatched"] * 3 and event_rows(w, "batch_lost") == []
        w.set_faults(FaultPlan())
        rounds(w, 2, 600)
        assert [r.state for r in request_rows(w)] == ["succeeded"] * 3 and invariants.batches_created(w) == 1
