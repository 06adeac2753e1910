"""Results are read before the provider deletes them (engine/results_window.py), on
mistral-batch, whose card keeps a job's results 24 h after it ends, in the simulation's
world (`lowtide serve` in this process, one ManualClock): the next poll is never later than
a quarter of that; a batch gone after its window ends its requests `results_expired`,
naming the retention and the fix; `lowtide status` warns of a batch nobody polls."""

from __future__ import annotations

import sqlalchemy as sa

from lowtide.store.schema import serve_batches, serve_files
from tests.engine.sim_world import dispatch_rows, load, request_rows, world

DAY = 86400.0
LONG_POLLS = [40000.0, 100000.0]  # an operator's poll interval longer than Mistral keeps results


def attention(store, name, clock) -> list[str]:
    # Imported here: the defect tests run on the commit before engine/attention.py too.
    from lowtide.engine.attention import attention

    return attention(store, name, clock)


def test_the_next_poll_is_never_later_than_a_quarter_of_the_cards_results_window(tmp_path):
    with world(tmp_path) as w:
        load(w, "mistral-batch", rows=3, chunk=3, poll_interval=LONG_POLLS)
        w.tick()
        [sent] = dispatch_rows(w)
        assert sent.state == "submitted"
        assert sent.next_poll_at - w.clock.now() <= DAY / 4  # it was up to 1.2 x 40,000 s


def test_a_batch_gone_after_its_results_window_ends_its_requests_by_name(tmp_path):
    with world(tmp_path) as w:
        load(w, "mistral-batch", rows=3, chunk=3, poll_interval=LONG_POLLS)
        w.tick()
        with w.providers["main"].store.begin() as conn:
            conn.execute(sa.delete(serve_batches))  # the provider deleted the job and its files
        w.clock.advance(DAY + 3600)
        w.tick()
        [gone] = dispatch_rows(w)
        assert gone.state == "failed" and gone.error.startswith("mistral-batch keeps a batch's results for 24 h")
        rows = request_rows(w)
        assert {(r.state, r.error_code) for r in rows} == {("pending", "results_expired")}  # retried: attempts remain
        assert all("lowtide worker" in r.error_message and "retention.results_s" in r.error_message for r in rows)


def test_status_warns_of_a_batch_nobody_polled_for_half_its_results_window(tmp_path):
    with world(tmp_path) as w:
        load(w, "mistral-batch", rows=3, chunk=3)
        w.tick()
        assert attention(w.store, "a", w.clock) == []
        w.clock.advance(DAY / 2 + 3600)  # no worker ran
        [said] = attention(w.store, "a", w.clock)
        assert "has not been polled for 13 h" in said and "keeps results 24 h" in said and "lowtide worker" in said


def test_requests_missing_from_files_gone_past_the_window_say_so(tmp_path):
    # Mistral's own sign: its files answer 404 past retention, and the route reads none of them.
    with world(tmp_path) as w:
        load(w, "mistral-batch", rows=3, chunk=3)
        w.tick()
        w.serve_step()  # the provider runs the job to its end
        with w.providers["main"].store.begin() as conn:
            conn.execute(sa.delete(serve_files))  # and later deletes its files
        w.clock.advance(DAY + 3600)
        w.tick()
        rows = request_rows(w)
        assert {(r.state, r.error_code) for r in rows} == {("pending", "expired")}  # retried: attempts remain
        assert all("keeps results 24 h after a batch ends" in r.error_message for r in rows)
