"""What a store keeps, and for how long: `lowtide delete` (one job and every row of it) and
`lowtide prune` (the bodies of old finished jobs, their ledger kept).

Delete reaches every row that names the job (tests/engine/test_delete_reach.py finds them
from the schema's metadata): the job's own rows (JOB_TABLES) are deleted; rows that belong to
something that outlives the job are detached from it (DETACHED_TABLES): an ended API batch of
`lowtide serve` forgets the job among the jobs it ran as, a done gateway flush forgets the
job it made (its deferred requests, results included, are the tenant's record); an eval's
record goes with the last of its member jobs (until then `lowtide compare` reads a deleted
member as a variant not run yet).

Deleting rows is not a state move: no request changes state here. A job with batches in
flight is refused (their results would come back to nothing, and they are paid for); the
CLI's `--cancel` cancels it first through `engine.control.cancel_job`, the one cancel path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson
from sqlalchemy import Connection, case, delete, func, select, update

from lowtide.core.clock import Clock
from lowtide.core.endpoints import EMBEDDINGS
from lowtide.core.errors import InputError, LowtideError
from lowtide.core.evals import build_eval
from lowtide.core.spec import RetentionSpec, rebuilt_from_store, stored_spec
from lowtide.core.states import DispatchState, JobState
from lowtide.engine.archive import (
    dropped_requests,
    dropped_versions,
    payload_dropped,
    request_bodies,
    version_bodies,
    write_archives,
)
from lowtide.engine.kept_answers import keep_answers
from lowtide.store.db import Store
from lowtide.store.gateway_schema import gateway_flushes
from lowtide.store.queries import LIVE_DISPATCH_STATES, add_event, get_job, stored_bytes
from lowtide.store.schema import (
    attempts,
    dispatch_phases,
    dispatches,
    evals,
    events,
    jobs,
    notifications,
    payload_heads,
    repair_sends,
    request_versions,
    requests,
    serve_batches,
    watermarks,
)
from lowtide.store.transitions import lock_job

# A dispatch in these states has reached (or may have reached) its route, or is executing.
IN_FLIGHT_STATES = (DispatchState.SUBMITTING.value, DispatchState.SUBMITTED.value, DispatchState.RUNNING.value)

# Every table that holds rows of a job, children first (foreign keys point at the later ones).
# `dispatch_phases` belongs to a job through its dispatch.
JOB_TABLES = (
    "dispatch_phases", "repair_sends", "attempts", "request_versions", "requests", "payload_heads", "dispatches", "events", "notifications",
    "watermarks", "jobs",
)  # fmt: skip
# Tables whose rows name the job but belong to something else: the job is taken out of them.
DETACHED_TABLES = ("serve_batches", "gateway_flushes")
# An API batch of `lowtide serve` in one of these statuses is still running its jobs
# (server/records.py LIVE; the engine does not import the server: a test keeps them equal).
LIVE_SERVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")


class InFlightError(InputError):
    """The job has batches or direct dispatches in flight: deleting it now would lose what
    they bring back (and what they cost)."""

    def __init__(self, message: str, batches: list[str]):
        super().__init__(message)
        self.batches = batches


@dataclass(slots=True)
class InFlight:
    """A dispatch of the job that is out at its route."""

    id: int
    route: str
    kind: str
    state: str
    provider_id: str | None

    def __str__(self) -> str:
        what = "batch" if self.kind == "batch" else "direct dispatch"
        at = f" {self.provider_id}" if self.provider_id else ""
        return f"{what} {self.id}{at} on {self.route} ({self.state})"


def in_flight(store: Store, name: str) -> list[InFlight]:
    """The job's dispatches that are out at their route now."""
    with store.read() as conn:
        return _in_flight(conn, get_job(conn, name).id)


def _in_flight(conn: Connection, job_id: int) -> list[InFlight]:
    d = dispatches.c
    rows = conn.execute(
        select(d.id, d.route, d.kind, d.state, d.provider_id)
        .where(d.job_id == job_id, d.state.in_(IN_FLIGHT_STATES))
        .order_by(d.id)
    ).all()
    return [InFlight(*row) for row in rows]


def delete_job(store: Store, name: str, clock: Clock) -> dict[str, int]:
    """Delete the job and every row that belongs to it, in one transaction; rows deleted per
    table. Refused (InFlightError) while any of its dispatches is in flight, and while a
    gateway flush that made the job is still collecting its results."""
    now = clock.now()
    with store.begin() as conn:
        job = get_job(conn, name)
        lock_job(conn, job.id)  # a worker changing this job's requests finishes first, or waits
        flying = _in_flight(conn, job.id)
        if flying:
            listed = "; ".join(str(f) for f in flying[:5]) + (f"; and {len(flying) - 5} more" if len(flying) > 5 else "")
            raise InFlightError(
                f'job "{name}" has {len(flying)} batch(es) in flight ({listed}): nothing deleted. Pass --cancel to '
                "cancel the job first, then let `lowtide tick` or a worker collect what those batches end with, "
                "and delete again",
                [str(f) for f in flying],
            )
        flush = conn.execute(
            select(gateway_flushes.c.id).where(gateway_flushes.c.job_name == name, gateway_flushes.c.state != "done")
        ).first()
        if flush is not None:
            raise InFlightError(
                f'job "{name}" is a gateway flush whose results the gateway is still collecting: nothing deleted; '
                "delete it once `lowtide gateway status` shows its requests done",
                [f"gateway flush {flush.id}"],
            )
        serving = _serve_batches_of(conn, name)
        live = [(batch_id, status) for batch_id, status, _ in serving if status in LIVE_SERVE_STATUSES]
        if live:
            batch_id, status = live[0]
            raise InFlightError(
                f'job "{name}" runs API batch {batch_id} of `lowtide serve`, which is {status}: nothing deleted; cancel '
                f"the batch through its API (POST /v1/batches/{batch_id}/cancel) or let it end, then delete again",
                [f"API batch {b} ({st})" for b, st in live],
            )
        counts = _delete_rows(conn, job.id)
        counts |= _detach(conn, name, serving)
        counts["evals"] = _delete_finished_evals(conn, name)
        add_event(conn, None, "deleted", f'job "{name}" deleted: ' + ", ".join(f"{n} {t}" for t, n in counts.items() if n), now)
    return counts


def _serve_batches_of(conn: Connection, name: str) -> list[tuple[str, str, list[dict]]]:
    """The API batches of `lowtide serve` that list the job among theirs: (id, status, jobs)."""
    b = serve_batches.c
    rows = conn.execute(select(b.id, b.status, b.jobs).where(b.jobs.contains(f'"{name}"', autoescape=True))).all()
    found = []
    for batch_id, status, listed in rows:
        jobs_of = orjson.loads(listed)
        if any(j.get("name") == name for j in jobs_of):
            found.append((batch_id, status, jobs_of))
    return found


def _detach(conn: Connection, name: str, serving: list[tuple[str, str, list[dict]]]) -> dict[str, int]:
    """Take the job out of the rows that outlive it; rows changed per table (DETACHED_TABLES)."""
    for batch_id, _, jobs_of in serving:
        kept = [j for j in jobs_of if j.get("name") != name]
        conn.execute(update(serve_batches).where(serve_batches.c.id == batch_id).values(jobs=orjson.dumps(kept).decode()))
    flushes = conn.execute(update(gateway_flushes).where(gateway_flushes.c.job_name == name).values(job_name=None)).rowcount
    return {"serve_batches": len(serving), "gateway_flushes": flushes}


def _delete_finished_evals(conn: Connection, name: str) -> int:
    """Delete the record of an eval whose member (or judge) job `name` was its last job left."""
    deleted = 0
    for eval_id, eval_name, data in conn.execute(select(evals.c.id, evals.c.name, evals.c.spec)).all():
        if not _may_be_member(eval_name, name):
            continue
        try:
            with rebuilt_from_store():  # checked when stored: no SDK types read again
                ev = build_eval(orjson.loads(data), where=f"eval {eval_name!r} (stored)")
        except LowtideError:
            continue  # not readable as an eval any more: `lowtide compare` says so; nothing to tell here
        names = {m.spec.name for m in ev.members} | {ev.judge_name}
        if name not in names:
            continue
        left = conn.execute(select(func.count()).select_from(jobs).where(jobs.c.name.in_(names - {name}))).scalar_one()
        if not left:
            deleted += conn.execute(delete(evals).where(evals.c.id == eval_id)).rowcount
    return deleted


def _may_be_member(eval_name: str, job_name: str) -> bool:
    """Whether `job_name` can be a member job of the eval (EVAL.VARIANT, or its cut form)."""
    # A member name past 64 characters keeps its first 55 (core/evals.member_job_name).
    return job_name.startswith(f"{eval_name}."[:55])


def _delete_rows(conn: Connection, job_id: int) -> dict[str, int]:
    of_job = select(dispatches.c.id).where(dispatches.c.job_id == job_id)
    statements = {
        "dispatch_phases": delete(dispatch_phases).where(dispatch_phases.c.dispatch_id.in_(of_job)),
        "repair_sends": delete(repair_sends).where(repair_sends.c.job_id == job_id),
        "attempts": delete(attempts).where(attempts.c.job_id == job_id),
        "request_versions": delete(request_versions).where(request_versions.c.job_id == job_id),
        "requests": delete(requests).where(requests.c.job_id == job_id),
        "payload_heads": delete(payload_heads).where(payload_heads.c.job_id == job_id),
        "dispatches": delete(dispatches).where(dispatches.c.job_id == job_id),
        "events": delete(events).where(events.c.job_id == job_id),
        "notifications": delete(notifications).where(notifications.c.job_id == job_id),  # pending ones too: the job is gone
        "watermarks": delete(watermarks).where(watermarks.c.job_id == job_id),
        "jobs": delete(jobs).where(jobs.c.id == job_id),
    }
    assert tuple(statements) == JOB_TABLES
    return {table: conn.execute(stmt).rowcount for table, stmt in statements.items()}


# prune --------------------------------------------------------------------------------

# What a pruned payload becomes: `requests.payload` is NOT NULL, and a reader that meets it
# finds valid JSON that says what happened rather than a request to send.
PRUNED = '{"pruned": true}'

PRUNABLE_JOB_STATES = (JobState.FINISHED.value, JobState.CANCELLED.value)


@dataclass(slots=True)
class Pruned:
    jobs: list[str] = field(default_factory=list)
    requests: int = 0  # request rows whose bodies were dropped
    versions: int = 0  # earlier versions (request_versions rows) likewise
    bytes: int = 0  # bytes (UTF-8) of the bodies dropped
    kept: int = 0  # bytes of the answer columns kept in place of responses dropped (--keep-results: kept_answers.py)
    archives: dict[str, Path] = field(default_factory=dict)  # job → the Parquet file of what it dropped
    kept_results: list[str] = field(default_factory=list)  # jobs whose answers were kept (--keep-results, or `payloads:` due)
    skipped: list[str] = field(default_factory=list)  # jobs that changed (a retry) between planning and dropping


@dataclass(slots=True)
class Cut:
    """One job a prune drops bodies of: and whether it keeps the answers."""

    job_id: int
    name: str
    keep_results: bool
    stamp: float  # the job's updated_at when planned: a job changed since is left alone
    size: int = 0
    vectors: bool = False  # an embedding job: its answers are its responses (archive.py `request_bodies`)


def prunable_jobs(conn: Connection, cutoff: float) -> list[tuple[int, str]]:
    """Jobs finished or cancelled before `cutoff`, with no dispatch still live."""
    return [(job_id, name) for job_id, name, *_ in _ended_jobs(conn, cutoff)]


def _ended_jobs(conn: Connection, cutoff: float, job_id: int | None = None) -> list:
    """(id, name, ended at, updated_at, spec) of jobs finished or cancelled before `cutoff`,
    with no dispatch still live."""
    live = select(dispatches.c.id).where(dispatches.c.job_id == jobs.c.id, dispatches.c.state.in_(LIVE_DISPATCH_STATES)).exists()
    ended = func.coalesce(jobs.c.finished_at, jobs.c.updated_at)
    stmt = select(jobs.c.id, jobs.c.name, ended, jobs.c.updated_at, jobs.c.spec).where(
        jobs.c.state.in_(PRUNABLE_JOB_STATES), ended < cutoff, ~live
    )
    if job_id is not None:
        stmt = stmt.where(jobs.c.id == job_id)
    return conn.execute(stmt.order_by(jobs.c.id)).all()


def _retention(spec_json: str) -> RetentionSpec | None:
    """The job's own `retention:` as stored with it (None: it has none)."""
    data = orjson.loads(spec_json).get("retention")
    return None if data is None else RetentionSpec.model_validate(data)


def plan_prune(conn: Connection, now: float, older_than_s: float | None, keep_results: bool) -> list[Cut]:
    """The jobs a prune drops bodies of, with what each holds to drop (characters).

    With `older_than_s`: every job ended longer ago than that, alike. Without: each job by its
    own `retention:` (a job without one is left alone): past `results` its answers go too,
    past `payloads` only the payloads and raw responses. `keep_results` keeps answers always."""
    cuts = []
    for job_id, name, ended, updated_at, spec in _ended_jobs(conn, now if older_than_s is None else now - older_than_s):
        keep = keep_results
        if older_than_s is None:
            retention = _retention(spec)
            if retention is None:
                continue
            age = now - ended
            if retention.results_s is not None and age > retention.results_s:
                pass
            elif retention.payloads_s is not None and age > retention.payloads_s:
                keep = True
            else:
                continue
        # (an embedding job's spec read only where its answers are kept: a prune of many jobs reads few)
        cut = Cut(job_id, name, keep, updated_at, vectors=keep and stored_spec(spec).request_endpoint == EMBEDDINGS)
        cut.size = _size(conn, cut)
        if cut.size:
            cuts.append(cut)
    return cuts


def prune(
    store: Store,
    clock: Clock,
    older_than_s: float | None = None,
    *,
    keep_results: bool = False,
    dry_run: bool = False,
    archive: Path | None = None,
) -> Pruned:
    """Drop the request bodies of jobs finished (or cancelled) more than `older_than_s` ago,
    or (None) as each job's own `retention:` says: the payloads sent and the providers'
    whole responses, and unless `keep_results` the answers too (output, parsed, the
    plain-answer record). `keep_results` keeps every answer column the export reads from a
    response (tool calls, refusal, reasoning, logprobs, choices) in its place (kept_answers.py).
    States, token counts, errors, attempts (the ledger) and events are kept, so `lowtide
    report` adds up as before.

    Only succeeded requests lose their payload: a failed or cancelled one keeps it, so that
    `lowtide retry` can still send it; and a request stored before fingerprints (m008)
    keeps it, since a later load compares those by payload.

    With `archive`, what is dropped is first written to Parquet there (engine/archive.py),
    one file per job, fsynced before the transaction that drops; if that fails, nothing is
    dropped (InputError). A job that changed in between (a retry) is left alone."""
    now = clock.now()
    result = Pruned()
    with store.read() as conn:
        cuts = plan_prune(conn, now, older_than_s, keep_results)
        if dry_run or not cuts:
            result.jobs = [c.name for c in cuts]
            result.bytes = sum(c.size for c in cuts)
            result.kept_results = [c.name for c in cuts if c.keep_results]
            return result
        if archive is not None:
            result.archives = write_archives(conn, archive, cuts, now, PRUNED)
    with store.begin() as conn:
        for cut in cuts:
            lock_job(conn, cut.job_id)
            still = _ended_jobs(conn, now, cut.job_id)
            if not still or still[0].updated_at != cut.stamp:
                result.skipped.append(cut.name)
                continue
            kept = _drop(conn, cut, result)
            where = f"; archived to {result.archives[cut.name]}" if cut.name in result.archives else ""
            what = "payloads" if cut.keep_results and cut.vectors else "payloads and raw responses" if cut.keep_results else "payloads, responses and answers"
            size = f"{cut.size:,} characters" + (f"; {kept:,} characters of their answer columns kept in their place" if kept else "")
            add_event(conn, cut.job_id, "pruned", f"{what} of finished requests dropped ({size}){where}", now)
    return result


def _size(conn: Connection, cut: Cut) -> int:
    r, v = requests.c, request_versions.c
    size = _length_sum(conn, requests, list(request_bodies(cut.keep_results, cut.vectors)), r.job_id == cut.job_id)
    size += _length_sum(conn, requests, [r.payload], (r.job_id == cut.job_id) & payload_dropped(PRUNED))
    size += _length_sum(conn, request_versions, list(version_bodies(cut.keep_results, cut.vectors)), v.job_id == cut.job_id)
    size += _length_sum(conn, request_versions, [v.payload], (v.job_id == cut.job_id) & (v.payload != PRUNED))
    return size


def _drop(conn: Connection, cut: Cut, result: Pruned) -> int:
    """Drop the cut's bodies; the bytes of answer columns kept in place of its responses."""
    r = requests.c
    bodies = request_bodies(cut.keep_results, cut.vectors)
    result.jobs.append(cut.name)
    result.bytes += cut.size
    if cut.keep_results:
        result.kept_results.append(cut.name)
    # Each row rewritten once: PostgreSQL keeps the old version of every row it updates until
    # VACUUM, so a second pass over the job (bodies, then payloads) needed room for two more
    # copies of the job's rows (at 10,000,000 the disk filled). Under --keep-results the rows
    # whose answer columns only their response holds go first, each dropped by the UPDATE that
    # writes the record of them (kept_answers.py); then the job's other rows, by one UPDATE.
    gone = payload_dropped(PRUNED)  # (its head, the job's, stays: it is not the request's)
    dropped = {c.name: None for c in bodies} | {"payload": case((gone, PRUNED), else_=r.payload), "head_id": case((gone, None), else_=r.head_id)}
    kept = 0
    if cut.keep_results and not cut.vectors:  # (an embedding's response, its vector, is kept whole)
        rows, kept = keep_answers(conn, cut.job_id, PRUNED, dropped)
        result.requests += rows
        result.kept += kept
    result.requests += conn.execute(
        update(requests).where(dropped_requests(cut.job_id, cut.keep_results, PRUNED, cut.vectors)).values(**dropped)
    ).rowcount
    result.versions += conn.execute(
        update(request_versions)
        .where(dropped_versions(cut.job_id, cut.keep_results, PRUNED, cut.vectors))
        .values(payload=PRUNED, head_id=None, **{c.name: None for c in version_bodies(cut.keep_results, cut.vectors)})
    ).rowcount
    return kept


def _length_sum(conn: Connection, table, columns, where) -> int:
    if not columns:
        return 0
    total = sum((func.coalesce(stored_bytes(c), 0) for c in columns[1:]), func.coalesce(stored_bytes(columns[0]), 0))
    return int(conn.execute(select(func.coalesce(func.sum(total), 0)).select_from(table).where(where)).scalar_one())
