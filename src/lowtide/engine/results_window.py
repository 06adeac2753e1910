"""Results read before the provider deletes them: a route's card (core/cards.py
`retention.results_s`: Mistral keeps a job's results 24 h after it ends, OpenAI 30 days)
bounds how long an ended batch may wait unread.

    next poll     never later than SAFE_SHARE × results_s: a batch that ends just after a
                  poll is read well inside its window (the poll that finds it ended reads
                  it at once, engine/batches.py `poll`)
    results gone  a batch (or its results file) the provider no longer knows, at least
                  results_s after it was sent: its requests leave it `results_expired`,
                  retryable (engine/fate.py decides: the fallback route at once where there
                  is one, else another batch while attempts remain, else failed), with a
                  message naming the retention and the fix
    at risk       an ended batch not read, or a sent batch nobody polled, for over
                  WARN_SHARE × results_s: `lowtide status` warns (`at_risk`)

A route with no card, or a card that does not know its retention, is polled as before.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, func, select

from lowtide.core.auto_spec import duration_text
from lowtide.core.cards import CARDS, Card, card_of
from lowtide.core.errors import BatchGone
from lowtide.core.states import DispatchState
from lowtide.engine.policy import poll_delay
from lowtide.store.schema import dispatch_phases, dispatches

SAFE_SHARE = 0.25  # of results_s: the longest wait between two polls of a sent batch
WARN_SHARE = 0.5  # of results_s: an ended batch unread (or a batch unpolled) this long is at risk
RESULTS_GONE = "results_expired"


def card_for(route: Any) -> Card | None:
    """A route object's card: its own (a profile's), else its name's; None for a plugin."""
    card = getattr(route, "card", None)
    return card if isinstance(card, Card) else CARDS.get(route.name)


def results_kept(card: Card | None) -> float | None:
    return card.retention.results_s if card is not None else None


def next_poll_delay(route: Any, interval: tuple[float, float], polls: int, rng: random.Random) -> float:
    """The route's poll delay (engine/policy.py), capped by its card's results window."""
    delay = poll_delay(interval, polls, rng)
    kept = results_kept(card_for(route))
    return min(delay, SAFE_SHARE * kept) if kept else delay


def results_gone(err: BaseException) -> bool:
    """Does the error say the provider no longer has the batch or its results (404)?"""
    if isinstance(err, BatchGone):
        return True
    return any(getattr(e, "status_code", None) == 404 for e in (err, err.__cause__))


def past_retention(route: Any, submitted_at: float | None, now: float) -> float | None:
    """The card's results window if the batch, sent at `submitted_at`, may have outlived it
    (its results can be gone no sooner than that long after it was sent); else None."""
    kept = results_kept(card_for(route))
    if kept is None or submitted_at is None or now - submitted_at < kept:
        return None
    return kept


def gone_reason(route: str, provider_id: str, kept: float, sent_ago: float, said: str) -> str:
    return (
        f"{route} keeps a batch's results for {duration_text(kept)} after it ends (its card's retention.results_s); batch "
        f"{provider_id}, sent {duration_text(sent_ago)} ago, is gone ({said}): its results were not read in time. Keep a "
        f"worker running (`lowtide worker`), or tick at least every {duration_text(SAFE_SHARE * kept)}; its requests are "
        "retried, or go to the fallback route, as the job's retry policy says"
    )


def late_words(route: str, kept: float, sent_ago: float) -> str:
    """For requests missing from a batch read after its window may have passed."""
    return (
        f"the batch was sent {duration_text(sent_ago)} ago and {route} keeps results {duration_text(kept)} after a batch "
        "ends: they may have been deleted before they were read; keep a worker running (`lowtide worker`)"
    )


def at_risk(conn: Connection, job_id: int, route_options: Mapping[str, Any], job_route: str, now: float) -> list[str]:
    """Sentences for the job's sent batches whose results risk expiring at the provider:
    ended and unread, or not polled, for over WARN_SHARE of the card's results window."""
    rows = conn.execute(
        select(
            dispatches.c.route, dispatches.c.provider_id, dispatches.c.phase, dispatches.c.submitted_at,
            dispatches.c.next_poll_at, func.max(dispatch_phases.c.at),
        )
        .select_from(dispatches.outerjoin(dispatch_phases, dispatch_phases.c.dispatch_id == dispatches.c.id))
        .where(dispatches.c.job_id == job_id, dispatches.c.state == DispatchState.SUBMITTED.value, dispatches.c.kind == "batch")
        .group_by(dispatches.c.id)
    ).all()  # fmt: skip
    out = []
    for route, provider_id, phase, submitted_at, next_poll_at, phase_at in rows:
        card = card_of(route, route_options if route == job_route else None)
        kept = results_kept(card)
        if card is None or kept is None:
            continue
        window = duration_text(kept)
        if phase in card.ended_states() and phase_at is not None and now - phase_at > WARN_SHARE * kept:
            out.append(
                f"batch {provider_id} on {route} ended {duration_text(now - phase_at)} ago and its results are not read; "
                f"{route} keeps them {window}: run `lowtide worker` (or `lowtide tick`) now"
            )
        elif next_poll_at is not None and now - next_poll_at > WARN_SHARE * kept:
            since = submitted_at if submitted_at is not None else next_poll_at
            out.append(
                f"batch {provider_id} on {route} has not been polled for {duration_text(now - next_poll_at)} (sent "
                f"{duration_text(now - since)} ago); {route} keeps results {window} after a batch ends: run `lowtide worker`"
            )
    return out
