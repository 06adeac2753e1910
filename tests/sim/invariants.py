"""What must hold after every step of the simulation (DESIGN.md's invariants), read from
the client's store and from each provider's own store and bill. Each check returns the
violations it found, as sentences; an empty list is a pass.

Not checked here, and why: a chunk created twice on anthropic-batch and openrouter-batch
(Message Batches and OpenRouter's batches keep no metadata, so adoption after a lost create
matches by size and time: docs/guarantees.md names that window); the bill of echo-batch (it
is not a provider, nothing is charged).

serve keeps each API's batches in one table: a Mistral job is one of its OpenAI batches (its
metadata holds the job's own, `lowtide_key` included: mistral_api.py), Azure's and an
OpenAI-compatible server's are OpenAI's, OpenRouter's are `api = "openrouter"`, a Vertex job
is one of its Gemini batches (displayName: the dispatch key), a Bedrock job is `api = "bedrock"`
(its clientRequestToken: the dispatch key), a DigitalOcean batch one of its OpenAI batches (its
request_id, the dispatch key, under digitalocean_api.MARK in the metadata).
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from lowtide.core import fastjson
from lowtide.core.spec import JobSpec
from lowtide.core.states import JobState, RequestState
from lowtide.core.types import Request
from lowtide.engine.export import PRUNED_STATE
from lowtide.engine.job_figures import JobFigures, read_figures
from lowtide.engine.retention import PRUNED
from lowtide.routes.vertex import lines as vertex_lines
from lowtide.server import billing
from lowtide.server import kept as keeping
from lowtide.server.bedrock_api import MARK as BEDROCK_MARK
from lowtide.server.digitalocean_api import MARK as DIGITALOCEAN_MARK
from lowtide.store.payloads import payload_text
from lowtide.store.queries import LIVE_DISPATCH_STATES
from lowtide.store.schema import (
    attempts,
    dispatches,
    events,
    jobs,
    metadata,
    notifications,
    requests,
    serve_batches,
)
from tests.sim.world import SECRETS, SERVED

TERMINAL = {RequestState.SUCCEEDED.value, RequestState.FAILED.value, RequestState.CANCELLED.value}
LIVE_SERVE = ("validating", "in_progress", "finalizing", "cancelling")


def request_states(world) -> list[str]:
    """Each request in one state, with columns that agree: dispatched ⇒ its dispatch is
    live; pending or terminal ⇒ no live dispatch holds it, but the one whose outcome it
    took (an applied attempt of it): a dispatch's outcomes are committed as they arrive, and
    a worker that stops (or dies) between two commits leaves its dispatch live, holding the
    requests answered so far, until its lease runs out."""
    out = []
    with world.store.read() as conn:
        live = dict(conn.execute(sa.select(dispatches.c.id, dispatches.c.state).where(dispatches.c.state.in_(LIVE_DISPATCH_STATES))).all())
        rows = conn.execute(sa.select(requests.c.custom_id, requests.c.state, requests.c.dispatch_id, requests.c.id)).all()
        answered = {(rid, did) for rid, did in conn.execute(
            sa.select(attempts.c.request_id, attempts.c.dispatch_id).where(attempts.c.applied, attempts.c.dispatch_id.in_(list(live)))
        )}  # fmt: skip
    for cid, state, dispatch_id, rid in rows:
        if state not in TERMINAL | {"pending", "dispatched"}:
            out.append(f"request {cid}: unknown state {state!r}")
        elif state == "dispatched" and dispatch_id not in live:
            out.append(f"request {cid}: dispatched, but its dispatch {dispatch_id} is not live")
        elif state != "dispatched" and dispatch_id in live and (rid, dispatch_id) not in answered:
            out.append(f"request {cid}: {state}, but held by live dispatch {dispatch_id} ({live[dispatch_id]})")
    return out


def applied_once(world) -> list[str]:
    """No result applied twice: one applied attempt per request and dispatch, and no more
    applied successes than the request has had versions."""
    out = []
    with world.store.read() as conn:
        per_dispatch = conn.execute(
            sa.select(attempts.c.request_id, attempts.c.dispatch_id, sa.func.count())
            .where(attempts.c.applied.is_(True)).group_by(attempts.c.request_id, attempts.c.dispatch_id)
            .having(sa.func.count() > 1)
        ).all()  # fmt: skip
        successes = conn.execute(
            sa.select(requests.c.custom_id, requests.c.version, sa.func.count())
            .join(attempts, attempts.c.request_id == requests.c.id)
            .where(attempts.c.applied.is_(True), attempts.c.ok.is_(True))
            .group_by(requests.c.id, requests.c.custom_id, requests.c.version)
        ).all()  # fmt: skip
    out += [f"request id {r}: {n} applied attempts from dispatch {d}" for r, d, n in per_dispatch]
    out += [f"request {cid}: {n} applied successes for {v} version(s)" for cid, v, n in successes if n > v]
    return out


def _serve_batches(world) -> list[tuple[str, Any]]:
    found = []
    for name, provider in world.providers.items():
        with provider.store.read() as conn:
            found += [(name, r) for r in conn.execute(sa.select(serve_batches)).all()]
    return found


def _key_of(batch) -> str | None:
    """The lowtide dispatch key a provider batch carries: OpenAI's metadata (Azure's, an
    OpenAI-compatible server's and a Mistral job's too), Gemini's displayName."""
    meta = json.loads(batch.metadata) if batch.metadata else {}
    if batch.api == "openai" and DIGITALOCEAN_MARK in (meta or {}):  # DigitalOcean's request_id (digitalocean_api.py)
        return json.loads(meta[DIGITALOCEAN_MARK]).get("request_id")
    if batch.api == "openai":
        return (meta or {}).get("lowtide_key")
    if batch.api == "gemini":  # gemini-batch's and vertex-batch's
        return (meta or {}).get("displayName")
    if batch.api == "bedrock":  # the clientRequestToken (server/bedrock_api.py keeps it)
        return json.loads(meta[BEDROCK_MARK]).get("clientRequestToken") if BEDROCK_MARK in (meta or {}) else None
    return None  # anthropic, openrouter: no handle (exempt, see the module doc)


def created_once(world) -> list[str]:
    """No chunk created twice where the provider keeps a handle: per dispatch key, at most
    one provider batch that was taken (one refused at validation ran nothing)."""
    keys = Counter()
    for name, b in _serve_batches(world):
        key = _key_of(b)
        if key is not None and b.status != "failed":
            keys[(name, key)] += 1
    return [f"dispatch key {k} has {n} batches at provider {p}" for (p, k), n in keys.items() if n > 1]


def _client_bill(world) -> dict[tuple[str, str], list[tuple[int, int]]]:
    with world.store.read() as conn:
        rows = conn.execute(
            sa.select(dispatches.c.provider_id, requests.c.custom_id, attempts.c.input_tokens, attempts.c.output_tokens)
            .join(dispatches, dispatches.c.id == attempts.c.dispatch_id)
            .join(requests, requests.c.id == attempts.c.request_id)
            .where(attempts.c.billed.is_(True), attempts.c.route.in_(SERVED))
        ).all()  # fmt: skip
    booked: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for provider_id, cid, tin, tout in rows:
        # serve's own id: Gemini's batches/ID, Vertex's projects/…/batchPredictionJobs/ID, Bedrock's ARN …/ID
        booked[(str(provider_id).rsplit("/", 1)[-1], cid)].append((tin, tout))
    return booked


def _serve_custom_id(said: str) -> str:
    """The custom_id a bill line is for. serve keeps a Vertex line as `[index, labels]` (its
    request has no custom_id of its own: vertex_api.py), the route's id riding in the labels."""
    if said.startswith("["):
        try:
            index, labels = json.loads(said)
        except ValueError:
            return said
        return vertex_lines.custom_id_of(labels) or said
    return said


def _provider_bill(world) -> dict[tuple[str, str], billing.Line]:
    return {(line.batch_id, _serve_custom_id(line.custom_id)): line for p in world.providers.values() for line in billing.lines(p.store)}


def bill_matches(world, drained: bool = False, held: frozenset[str] = frozenset()) -> list[str]:
    """Every billed line booked once, with the provider's token counts; drained: every line
    the provider billed whole is booked by then, but for a batch whose dispatch (by key, in
    `held`, or by its own id) is held and said so (`held_dispatches`): it is adopted once the
    key works; or was given up and said so (`given_up`)."""
    out = []
    booked, billed = _client_bill(world), _provider_bill(world)
    waiting = {b.id for _, b in _serve_batches(world) if _key_of(b) in held or b.id in held}
    for key, got in booked.items():
        line = billed.get(key)
        if len(got) > 1:
            out.append(f"{key}: booked {len(got)} times")
        if line is None:
            out.append(f"{key}: booked by the client, not billed by the provider")
        elif got[0] != (line.input_tokens, line.output_tokens):
            out.append(f"{key}: booked {got[0]} tokens, billed {(line.input_tokens, line.output_tokens)}")
    if drained:
        keys = {b.id: _key_of(b) for _, b in _serve_batches(world)}  # the dispatch each batch was made for
        out += [f"{key}: billed by the provider in the batch of dispatch key {keys.get(key[0])}, never booked"
                for key, line in billed.items() if line.whole and key not in booked and key[0] not in waiting]  # fmt: skip
    return out


def _asked(payload: str) -> str:
    """What echo answers a text request: its last user message's text."""
    body = Request.from_payload("x", fastjson.loads(payload)).body
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content or ""
    return ""


def answers_match(world) -> list[str]:
    """No input paired with another input's answer: echo's answer is its own request's text
    (but for a request whose payload `lowtide prune` dropped: nothing is left to compare)."""
    with world.store.read() as conn:
        rows = conn.execute(
            sa.select(requests.c.custom_id, payload_text().label("payload"), requests.c.output)
            .where(requests.c.state == RequestState.SUCCEEDED.value, requests.c.payload != PRUNED)
        ).all()  # fmt: skip
    return [f"request {cid}: answered {out!r}, asked {_asked(p)!r}" for cid, p, out in rows if out != _asked(p)]


def _deadlines(world) -> tuple[dict[str, float], dict[str, float]]:
    """Each job's deadline (as its spec says now), by dispatch key and by provider id."""
    by_key, by_id = {}, {}
    with world.store.read() as conn:
        rows = conn.execute(sa.select(dispatches.c.key, dispatches.c.provider_id, jobs.c.spec).join(jobs, jobs.c.id == dispatches.c.job_id)).all()
    for key, provider_id, spec_json in rows:
        deadline: datetime | None = JobSpec.model_validate_json(spec_json).deadline
        if deadline is not None:
            by_key[key] = deadline.timestamp()
            if provider_id:
                by_id[str(provider_id).rsplit("/", 1)[-1]] = deadline.timestamp()
    return by_key, by_id


def nothing_after_deadline(world) -> list[str]:
    """No provider batch created at or after the deadline of the job it belongs to."""
    by_key, by_id = _deadlines(world)
    out = []
    for name, b in _serve_batches(world):
        deadline = by_key.get(_key_of(b) or "", by_id.get(b.id))
        if deadline is not None and b.created_at >= deadline:
            out.append(f"batch {b.id} at {name} created {b.created_at - deadline:+.0f} s after its job's deadline")
    return out


def notified_once(world) -> list[str]:
    """Each time a job ended or ran out of budget, its notification was enqueued once per
    receiver, in the same transaction (engine/notify.py): the outbox matches the job's own
    `finished` and `budget_exhausted` events, kill or no kill; delivery ids are unique; and
    none is given up, since the world's receiver answers every POST with 204 (a 2xx that
    came after a clock jump past its attempt's claim was once counted failed, and given up
    after a few)."""
    out = []
    with world.store.read() as conn:
        happened = Counter(
            {(job, kind): n for job, kind, n in conn.execute(
                sa.select(events.c.job_id, events.c.kind, sa.func.count())
                .where(events.c.kind.in_(["finished", "budget_exhausted"])).group_by(events.c.job_id, events.c.kind)
            )}
        )  # fmt: skip
        rows = conn.execute(sa.select(notifications.c.id, notifications.c.job_id, notifications.c.event, notifications.c.url)).all()
        names = dict(conn.execute(sa.select(jobs.c.id, jobs.c.name)).all())
        # Jobs with no `notify` (a gateway flush's, tests/sim/gateway.py) enqueue nothing.
        silent = {job for job, spec in conn.execute(sa.select(jobs.c.id, jobs.c.spec)) if JobSpec.model_validate_json(spec).notify is None}
        dead = conn.execute(sa.select(notifications.c.id, notifications.c.last_error).where(notifications.c.state == "dead")).all()
    enqueued = Counter((job, "finished" if event in ("finished", "failed") else event) for _, job, event, _ in rows)
    happened = Counter({key: n for key, n in happened.items() if key[0] not in silent})
    for key in happened.keys() | {k for k in enqueued if k[1] != "deadline_cutover"}:
        if happened[key] != enqueued[key]:
            out.append(f"job {names.get(key[0], key[0])}: {happened[key]} {key[1]} event(s), {enqueued[key]} notification(s) enqueued")
    if len({r.id for r in rows}) != len(rows) or len({r.url for r in rows}) > 1:
        out.append("notification delivery ids repeat, or a notification went to a URL no spec names")
    out += [f"notification {d} given up though the receiver answers every POST: {error}" for d, error in dead]
    return out


def figures_current(world) -> list[str]:
    """What the dashboard and /metrics keep of the jobs (engine/job_figures.py: a settled
    job's figures, attempts over time, requests by route and state, failed polls, read once) equals what a fresh read of the store says: a
    retry, new rows, a cancel, a late bill or a delete since is seen. Read after some steps
    only, as a page refreshes now and then: a job may finish, be retried and finish again in
    between."""
    world.figure_steps += 1
    if random.Random(world.figure_steps).random() >= 0.3:
        return []
    kept = world.kept
    seen = {"figures": kept.figures.read(world.store), "spans": kept.spans.read(world.store),
            "hours": kept.series(3600).read(world.store), "routes": kept.routes_states.read(world.store),
            "poll errors": kept.poll_errors.read(world.store)}  # fmt: skip
    with world.store.read() as conn:
        fresh = {"figures": read_figures(conn, None), "spans": keeping.spans(conn, None),
                 "hours": keeping.slots(conn, 3600, None), "routes": keeping.routes_states(conn, None),
                 "poll errors": keeping.poll_errors(conn, None)}  # fmt: skip
        names = dict(conn.execute(sa.select(jobs.c.id, jobs.c.name)).all())

    def told(what: str, value: Any) -> Any:
        if what != "figures":
            return sorted(value) if isinstance(value, list) and value else value if value not in (None, [], (None, None), 0) else None
        f = value or JobFigures({}, (), {})
        return f.counts, sorted(map(tuple, f.ledger), key=repr), f.reasons

    return [
        f"job {names.get(j, j)}: the dashboard keeps {what} {told(what, seen[what].get(j))}, the store says {told(what, fresh[what].get(j))}"
        for what in seen
        for j in seen[what].keys() | fresh[what].keys()
        if told(what, seen[what].get(j)) != told(what, fresh[what].get(j))
    ]


STEP_CHECKS = (
    request_states, applied_once, created_once, bill_matches, answers_match, nothing_after_deadline, notified_once,
    figures_current,
)  # fmt: skip


def check_step(world) -> list[str]:
    return [f"{check.__name__}: {v}" for check in STEP_CHECKS for v in check(world)]


def held_dispatches(world) -> dict[int, tuple[int, str]]:
    """Dispatches held and said so (engine/held.py: the provider refused the key
    while lowtide looked for a batch it may have created, `submitting`, or polled one it
    sent, `submitted`): their error beginning "held: ", and a `held` event in their job. A
    hold is a state the operator is told of, so the drain accepts it; a silent one would
    still be a violation. id -> (job, key)."""
    with world.store.read() as conn:
        rows = conn.execute(
            sa.select(dispatches.c.id, dispatches.c.job_id, dispatches.c.key).where(
                dispatches.c.state.in_(["submitting", "submitted"]), dispatches.c.error.like("held: %")
            )
        ).all()
        told = set(conn.scalars(sa.select(events.c.job_id).where(events.c.kind == "held")))
    return {d: (job, key) for d, job, key in rows if job in told}


def check_drained(world) -> list[str]:
    """After the drain: every request terminal, every job finished or cancelled, no live
    dispatch, every notification delivered (the world's receiver takes each), and every
    whole billed line booked; but for what a reported hold keeps
    (`held_dispatches`): its dispatch, its requests, its job and its batch's bill, and the
    bill of a batch a hold gave up, said (`given_up`)."""
    out = []
    held = held_dispatches(world)
    held_ids, held_jobs = list(held), {job for job, _ in held.values()}
    with world.store.read() as conn:
        open_requests = conn.execute(
            sa.select(jobs.c.name, jobs.c.state, requests.c.state, sa.func.count())
            .join(jobs, jobs.c.id == requests.c.job_id)
            .where(requests.c.state.not_in(TERMINAL), sa.or_(requests.c.dispatch_id.is_(None), requests.c.dispatch_id.not_in(held_ids)))
            .group_by(jobs.c.name, jobs.c.state, requests.c.state)
        ).all()  # fmt: skip
        open_jobs = conn.execute(
            sa.select(jobs.c.name, jobs.c.state).where(
                jobs.c.state.not_in([JobState.FINISHED.value, JobState.CANCELLED.value]), jobs.c.id.not_in(held_jobs)
            )
        ).all()
        live = conn.execute(
            sa.select(dispatches.c.id, dispatches.c.state, dispatches.c.provider_id, dispatches.c.error)
            .where(dispatches.c.state.in_(LIVE_DISPATCH_STATES), dispatches.c.id.not_in(held_ids))
        ).all()  # fmt: skip
    out += [f"drain: {n} request(s) {state} in job {name} ({job_state})" for name, job_state, state, n in open_requests]
    out += [f"drain: job {name} still {state}" for name, state in open_jobs]
    out += [f"drain: dispatch {d} still {s} (provider batch {p}; last error: {(e or '')[:200]})" for d, s, p, e in live]
    kept = frozenset(key for _, key in held.values()) | given_up(world) | world.deleted
    out += [f"drain: {v}" for v in bill_matches(world, drained=True, held=kept)]
    with world.store.read() as conn:
        unsent = conn.execute(
            sa.select(notifications.c.id, notifications.c.event, notifications.c.attempts, notifications.c.last_error)
            .where(notifications.c.state == "pending")
        ).all()  # fmt: skip
    out += [f"drain: notification {d} ({event}) still pending after {n} attempt(s) (last error: {e})" for d, event, n, e in unsent]
    out += [f"drain: {v}" for v in no_secrets(world)]
    return out


def given_up(world) -> frozenset[str]:
    """The keys of dispatches a hold gave up (the job cancelled, a deadline, the results window
    passed while the key was refused), of batches given up as lost whose watch ran out unread
    (engine/batches.py `_watch`), and of batches whose results the provider deleted before
    they were read (`results_expired`, a window docs/guarantees.md names): their batches may
    be billed and never booked, and an error and an event say so (engine/held.py;
    `lost_batch_unread`; `results_expired`). And of creates `lowtide cancel --force`
    abandoned (`cancel_forced`)."""
    with world.store.read() as conn:
        held = set(conn.scalars(
            sa.select(dispatches.c.key).where(dispatches.c.state == "failed", dispatches.c.error.like("%refused the key%"))
        ))  # fmt: skip
        unread = " ".join(conn.scalars(sa.select(events.c.message).where(events.c.kind == "lost_batch_unread")))
        lost = conn.execute(
            sa.select(dispatches.c.key, dispatches.c.provider_id).where(dispatches.c.state == "failed", dispatches.c.error.like("%given up as lost%"))
        ).all()  # fmt: skip
        # Results the provider deleted before a worker came to read them (docs/guarantees.md):
        # the requests fail `results_expired` and run again; the event names the batch.
        expired = conn.execute(
            sa.select(dispatches.c.key, dispatches.c.provider_id).where(dispatches.c.state == "failed", dispatches.c.error.like("%not read in time%"))
        ).all()  # fmt: skip
        # Creates `lowtide cancel --force` abandoned (the `cancel_forced` event says a batch
        # that did reach the provider runs, is paid for, and is not brought in).
        abandoned = set(conn.scalars(
            sa.select(dispatches.c.key).where(dispatches.c.state == "cancelled", dispatches.c.error.like("abandoned by `lowtide cancel --force`%"))
        ))  # fmt: skip
    said = [(k, p) for k, p in lost if f" {p}, " in unread] + list(expired)
    # An abandoned create's batch without a key (Anthropic's, OpenRouter's): made between the
    # dispatch's creation and the cancel, holding only the custom_ids the dispatch sent.
    lines: dict[str, set[str]] = defaultdict(set)
    for line in (line for p in world.providers.values() for line in billing.lines(p.store)):
        lines[line.batch_id].add(_serve_custom_id(line.custom_id))
    abandoned |= {b.id for _, b in _serve_batches(world) if _key_of(b) is None and lines.get(b.id) and any(
        made <= b.created_at <= cancelled and lines[b.id] <= ids for made, cancelled, ids in world.abandoned)}  # fmt: skip
    # A batch's own id as well as its dispatch's key: serve's Anthropic batches carry no key.
    return frozenset(held | abandoned | {str(p).rsplit("/", 1)[-1] for _, p in said} | {k for k, _ in said})


def check_increment(world, name: str, job: dict[str, Any]) -> list[str]:
    """After a load of a `since` job: every source row has exactly one request though each
    load read only the rows past the watermark, and the watermark is the highest `updated`
    of the rows (never more: a row would be skipped; never less: rows would be read again)."""
    from lowtide.core.sources import Watermark
    from lowtide.store.schema import watermarks

    wanted = {f"{name}-{i}" for i in range(job["rows"])}
    with world.store.read() as conn:
        job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == name)).scalar_one()
        stored = Counter(conn.execute(sa.select(requests.c.source_key).where(requests.c.job_id == job_id)).scalars())
        mark = conn.execute(sa.select(watermarks.c.column, watermarks.c.value).where(watermarks.c.job_id == job_id)).first()
    out = [f"job {name}: row {k} has {stored[k]} request(s)" for k in sorted(wanted | set(stored)) if stored[k] != (k in wanted)]
    highest = max((job["stamps"].get(i, 0) for i in range(job["rows"])), default=None)
    value = Watermark.from_json(mark.column, mark.value).value if mark else None
    if highest is not None and (value is None or int(value) != highest):
        out.append(f"job {name}: watermark {value!r}, the rows' highest `updated` is {highest}")
    return out


def export_truthful(world, name: str, path) -> list[str]:
    """What `lowtide export` wrote for job `name` (JSONL at `path`) agrees with the store:
    each source row at most once; each row's state and answer its request's (`pruned` and no
    answer for a succeeded request whose answer a prune dropped, text, response and the record
    `--keep-results` keeps of its answer columns: never `succeeded` without one); and a row
    said unchanged (`source_changed` false) was asked from the row's text as it is now, so the
    answer beside it is that text's (echo answers a request's own last user message)."""
    r = requests.c
    with world.store.read() as conn:
        job_id = conn.execute(sa.select(jobs.c.id).where(jobs.c.name == name)).scalar_one()
        stored = {row.custom_id: row for row in conn.execute(
            sa.select(r.custom_id, r.state, r.output, payload_text().label("payload"), (r.response.is_(None) & r.parsed.is_(None) & r.plain_answer.is_(None)).label("no_body"))
            .where(r.job_id == job_id)
        )}  # fmt: skip
    out, seen = [], set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        row = json.loads(line)
        where = f"export of {name}, line {number} ({row.get('ticket_id')})"
        if row["ticket_id"] in seen:
            out.append(f"{where}: the source row twice")
        seen.add(row["ticket_id"])
        req = stored.get(row.get("custom_id"))
        if req is None:
            if row.get("state") != "not_loaded":  # a source row the store has no request for
                out.append(f"{where}: state {row['state']} for no request of the job")
            continue
        dropped = req.state == RequestState.SUCCEEDED.value and req.output is None and req.no_body
        if (row["state"], row["output"]) != ((PRUNED_STATE, None) if dropped else (req.state, req.output)):
            out.append(f"{where}: exported {(row['state'], row['output'])!r}, stored {(req.state, req.output)!r}")
        elif (req.state == RequestState.SUCCEEDED.value and not row["source_changed"] and req.payload != PRUNED
              and _asked(req.payload) != f"Ticket: {row['body']}"):  # fmt: skip
            out.append(f"{where}: said unchanged, but asked {_asked(req.payload)!r} of the row's text {row['body']!r}")
    return out


def stored(world) -> list[tuple]:
    """Every row of the tables a load may write (jobs, requests and their versions, dispatches,
    attempts, watermarks, events), in id order: what a refused load must leave as it was."""
    from lowtide.store.schema import request_versions, watermarks

    with world.store.read() as conn:
        return [tuple(row) for table in (jobs, requests, request_versions, dispatches, attempts, watermarks, events)
                for row in conn.execute(sa.select(table).order_by(*table.primary_key.columns))]  # fmt: skip


def no_secrets(world, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """No key or signing secret the world gave in the environment (or `secrets`: the
    gateway's tenants' keys) is written anywhere: not in a file under the world's folder (the
    client's SQLite store and its WAL, serve's stores and batch files), not in a PostgreSQL
    store's rows, not in a log line. A provider's key is sent in a header and nowhere else;
    the notify secret only signs."""
    out = []
    wanted = [s.encode() for s in secrets]
    for path in sorted(p for p in world.root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        out += [f"{path.relative_to(world.root)} holds the secret {s[:6].decode()}…" for s in wanted if s in data]
    if not world.store.is_sqlite:
        with world.store.read() as conn:
            for table in metadata.sorted_tables:
                text = [c for c in table.c if isinstance(c.type, sa.String)]
                for row in conn.execute(sa.select(*text)) if text else ():
                    for column, value in zip(text, row, strict=True):
                        if value is not None and any(s in value for s in secrets):
                            out.append(f"{table.name}.{column.name} holds a secret")
    for line in (line for line in world.logs.lines if any(s in line for s in secrets)):
        for s in secrets:
            line = line.replace(s, "<secret>")
        out.append(f"a log line holds a secret: {line[:300]}")
    return out


def batches_created(world) -> int:
    return len(_serve_batches(world))


class Violation(AssertionError):
    """An invariant broken; each kind is its own subclass (`violation`), so that Hypothesis
    shrinks and reports each kind of failure on its own."""


_KINDS: dict[str, type[Violation]] = {}
# The kind a list of violations is reported as: the first of these found in it.
_DRAIN_KINDS = (("a loop", "drain_loop"), ("pending in job", "drain_pending"), ("dispatched in job", "drain_dispatched"),
                ("still submitt", "drain_dispatch_live"), ("still planned", "drain_dispatch_live"), ("never booked", "drain_unbooked"),
                ("drain: notification", "drain_notification"), ("secret", "drain_secret"))  # fmt: skip


def violation(found: list[str], what: str) -> Violation:
    """One exception for `found`, of a class named by its kind (the first step check that
    failed, else what the drain left)."""
    kind = next((v.split(":", 1)[0] for v in found if not v.startswith("drain:")), None)
    kind = kind or next((k for key, k in _DRAIN_KINDS if any(key in v for v in found)), "drain")
    cls = _KINDS.setdefault(kind, type(f"Violation_{kind}", (Violation,), {}))
    return cls(f"{what} ({kind}):\n  " + "\n  ".join(found[:20]))
