"""A dispatch held because the provider refused the route's key while lowtide looked for a
batch it may have created (simulation finding 4: a crash mid-submit, then a key that no
longer works).

`find` answered 401 or 403, so nothing proves the create never reached the provider, and
sending the requests again could run them twice. The dispatch stays `submitting`, held:

    said once    its error begins "held: " and names the batch key and the fix; one `held`
                 event and one warning in the worker's log when the hold begins, not one a
                 tick; `lowtide status` shows it (engine/attention.py)
    ends when    the key works again (the next `find` adopts the batch, or finds none and
                 sends it); the job is cancelled; or the deadline (less a fallback's safety
                 margin) comes. The last two give the requests up as from a batch given up
                 as lost (`batch_lost`, retryable: engine/fate.py decides: cancelled in a
                 cancelled job, the fallback route where there is one, else another batch
                 while attempts remain, then `deadline_passed`)

A batch already sent whose poll is refused the key (simulation finding 5: the key changed
while a batch ran) is held the same way (`hold_poll`): the batch runs and is paid for at the
provider whatever lowtide's key, so counting the refusals toward giving it up as lost (a day
of errors) would end its requests and send them again, paid twice, answers never read. It is
polled as before and read by the first poll the key lets through; a cancelled job gives it
up (its requests cancelled); so does the card's results window passing (nothing left to read:
`results_expired`, engine/results_window.py). A deadline does not: a batch past it is still
read, as any late batch is. Nor does the cut-over's request to cancel it (a job with a
fallback): its requests go to the fallback route once the cut-over's grace has passed
(engine/fallback.py `release_stuck`), and what the batch bills is booked when it is read.
"""

from __future__ import annotations

import logging

from sqlalchemy import select, update

from lowtide.core.states import JobState
from lowtide.engine.context import JobContext
from lowtide.store.db import Store
from lowtide.store.queries import add_event
from lowtide.store.schema import dispatches
from lowtide.store.transitions import lock_job

HELD = "held: "  # how a held dispatch's error begins
log = logging.getLogger("lowtide.engine")


def key_refused(err: BaseException) -> bool:
    """Did the provider refuse the route's key (HTTP 401 or 403)? Read off the SDK's error
    (or what it was raised from): a route's `find` lets the SDK's errors through."""
    for e in (err, err.__cause__):
        status = getattr(e, "status_code", None) or getattr(e, "code", None)
        if status in (401, 403):
            return True
    return False


def hold(store: Store, job: JobContext, route: str, dispatch_id: int, key: str, said: str, now: float) -> str | None:
    """Hold the dispatch (saying so once), or, if its job is cancelled or its deadline has
    come, the reason its requests are given up with (the caller ends the dispatch with it).
    `said`: the provider's refusal, with any key scrubbed."""
    spec = job.spec
    cancelled, error = _cancelled(store, job, dispatch_id)
    margin = spec.fallback.safety_margin if spec.fallback is not None else 0.0
    late = spec.deadline is not None and now >= spec.deadline.timestamp() - margin
    if cancelled or late:
        why = "the job was cancelled" if cancelled else "the job's deadline came"
        return (
            f"{route} refused the key while lowtide looked for batch {key} ({said}), so it cannot tell whether that "
            f"batch was created; given up as {why}: if it was, it runs and is paid for at the provider, its results not "
            "brought in"
        )
    held = (
        f"{HELD}the provider refused the key while looking for batch {key}; fix the key in the variable "
        f"{_variable(job, route)} where the worker runs, and the next tick adopts the batch (or sends "
        f"it, if it was never created); or `lowtide cancel {job.name}` ends its requests cancelled ({said})"
    )[:2000]
    _say(store, job, route, dispatch_id, error, held, now)
    return None


def hold_poll(store: Store, job: JobContext, route: str, dispatch_id: int, provider_id: str, said: str, now: float,
              kept: float | None) -> tuple[str, str] | None:  # fmt: skip
    """Hold a sent batch whose poll was refused the key (saying so once), or, if its job is
    cancelled or the card's results window (`kept`: seconds since it was sent, past it; None
    inside it) has passed, the failure code and reason its requests are given up with."""
    cancelled, error = _cancelled(store, job, dispatch_id)
    if cancelled:
        return "batch_lost", (
            f"{route} refused the key on every poll of batch {provider_id} ({said}); given up as the job was cancelled: "
            "it runs and is paid for at the provider, its results not brought in"
        )
    if kept is not None:
        return "results_expired", (
            f"{route} refused the key on every poll of batch {provider_id} ({said}) until its card's results window "
            f"({kept:.0f} s after it was sent) passed: its results cannot be read any more"
        )
    held = (
        f"{HELD}the provider refused the key while polling batch {provider_id}, which runs and is paid for there; fix "
        f"the key in the variable {_variable(job, route)} where the worker runs, and the next poll reads it; or "
        f"`lowtide cancel {job.name}` gives it up, its requests cancelled ({said})"
    )[:2000]
    _say(store, job, route, dispatch_id, error, held, now)
    return None


def _cancelled(store: Store, job: JobContext, dispatch_id: int) -> tuple[bool, str | None]:
    """Whether the job is cancelled, read with the job's row locked as a cancel takes it; and
    the dispatch's error (a hold already said). Not the dispatch's `cancel_requested`: the
    deadline cut-over sets it too (engine/fallback.py `cancel_in_flight`), and a batch the
    cut-over asked to cancel is still read when it ends, as any late batch is."""
    with store.begin() as conn:
        state = lock_job(conn, job.id)
        error = conn.execute(select(dispatches.c.error).where(dispatches.c.id == dispatch_id)).scalar_one()
    return state == JobState.CANCELLED.value, error


def _variable(job: JobContext, route: str) -> str:
    """Which option names the key's variable (vertex-batch's is an access token's), and its value."""
    options = job.spec.route_options if route == job.spec.route else {}
    option = next((o for o in ("api_key_env", "access_token_env") if isinstance(options.get(o), str)), "api_key_env")
    return f"route_options.{option} names" + (f" ({options[option]})" if option in options else "")


def _say(store: Store, job: JobContext, route: str, dispatch_id: int, error: str | None, held: str, now: float) -> None:
    """Write the hold on its dispatch; the event and the warning once per hold, not once a tick."""
    with store.begin() as conn:
        conn.execute(update(dispatches).where(dispatches.c.id == dispatch_id).values(error=held, lease_until=0.0))
        if not (error or "").startswith(HELD):  # once per hold, not once per tick
            add_event(conn, job.id, "held", f"{route}: {held}", now)
            log.warning("lowtide: job %s: %s: %s", job.name, route, held)
