"""The seeded, stateful simulation: Hypothesis draws a sequence of operator actions,
provider faults and clock steps; after each one the invariants (invariants.py) are checked,
and at the end of the sequence a drain must bring every request to a terminal state.

    from tests.sim.machine import run
    run("openai-batch", "sqlite", seed=1, examples=5, steps=30)

A new route plugs in through `world.ROUTE_MODELS`, `world.SERVED`, `World.route_options` and
`CALLS` (and `NOT_ON`, for faults its API cannot meet); a new provider fault through
`fault_plan`; a new operator action is one more `@rule`.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.strategies as st
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from lowtide.core.errors import LowtideError
from lowtide.core.spec import build_spec
from lowtide.engine.control import cancel_job, retry_job
from lowtide.engine.export import export_results
from lowtide.engine.loader import load_job
from lowtide.engine.retention import InFlightError, delete_job, prune
from lowtide.server.faults import FaultPlan
from lowtide.store.queries import LIVE_DISPATCH_STATES, watched
from lowtide.store.schema import dispatches, jobs, notifications, requests
from tests.conftest import write_csv
from tests.sim import invariants
from tests.sim.world import (
    AUTO_WITH,
    KEY_ENV,
    NOTIFY_ENV,
    REALTIME_CALLS,
    ROUTE_MODELS,
    SERVED,
    WRONG_KEY_ENV,
    KillPoint,
    World,
)

JOBS = ("a", "b", "c")
AUTO_JOBS = ("c",)  # `route: auto` where the route has a real-time candidate at serve (world.AUTO_WITH), else as `a`
SINCE_JOBS = ("b",)  # loaded with `source.since` (docs/data.md): each load reads past a watermark
MAX_ROWS = 30
DRAIN_ROUNDS = 40  # and two per open request: a standing queue limit a request wide sends one at a time
STUCK = 8  # drain rounds in a row that changed nothing: what is left will stay so
# Each API's calls, for HTTP faults: create, poll; as serve's fault plan sees the path, after
# its middlewares moved Azure's /openai/v1/… to /v1/… (azure_paths.py) and Mistral's
# /mistral/v1/batch/jobs to /v1/mistral/batch/jobs (mistral_api.py), Vertex's /v1/… to /v1beta/…
# (vertex_api.py). Bedrock's poll has two segments: botocore encodes the job ARN's slash, uvicorn
# decodes it.
CALLS = {
    "openai-batch": ("POST /v1/batches", "GET /v1/batches/*"),
    "anthropic-batch": ("POST /v1/messages/batches", "GET /v1/messages/batches/*"),
    "gemini-batch": ("POST /v1beta/models/*", "GET /v1beta/batches/*"),
    "openai-compatible-batch": ("POST /v1/batches", "GET /v1/batches/*"),
    "azure-batch": ("POST /v1/batches", "GET /v1/batches/*"),
    "mistral-batch": ("POST /v1/mistral/batch/jobs", "GET /v1/mistral/batch/jobs/*"),
    "openrouter-batch": ("POST /api/v1/batches", "GET /api/v1/batches/*"),
    "vertex-batch": ("POST /v1beta/projects/*/locations/*/batchPredictionJobs",
                     "GET /v1beta/projects/*/locations/*/batchPredictionJobs/*"),
    "bedrock-batch": ("POST /model-invocation-job", "GET /model-invocation-job/*/*"),
    "digitalocean-batch": ("POST /digitalocean/v1/batches", "GET /digitalocean/v1/batches/*"),
}
FAULTS = ("none", "queue_full", "queue_tight", "queue_room", "fail_validation", "expire", "drop_lines",
          "duplicate_lines", "corrupt_lines", "create_429", "poll_500", "lost_create", "realtime_500")  # fmt: skip
QUEUE = ("queue_full", "queue_tight", "queue_room")
# Faults a route's API cannot meet, left out of its draws, and why.
NOT_ON = {
    # serve's queue limit is OpenAI's (a batch failing validation with token_limit_exceeded);
    # Mistral publishes no enqueued-token limit, so a job failed by it would be OpenAI's answer
    # in Mistral's clothes, not a case the route must meet.
    "mistral-batch": QUEUE,
    # OpenRouter: no queue limit (serve checks one on OpenAI batches only); no validation step
    # (the create checks the body and answers 400 at once, so serve's OpenRouter batches have
    # nothing fail_validation could fail). corrupt_lines stays: a cut result is a JSON string
    # inside GET /batches/{id}'s answer (openrouter_api.py), which the route cannot read.
    "openrouter-batch": (*QUEUE, "fail_validation"),
    # Vertex and Bedrock: no queue limit either (serve checks one on OpenAI batches only; a
    # Vertex job is one of serve's Gemini batches, a Bedrock job one of its Anthropic ones,
    # whose batch faults they meet as those routes do).
    "vertex-batch": QUEUE,
    "bedrock-batch": QUEUE,
    # DigitalOcean publishes no enqueued-token limit (its batch is one of serve's OpenAI batches,
    # whose batch faults it meets as openai-batch does).
    "digitalocean-batch": QUEUE,
}
# Bedrock runs a job of 100 records at least (the card's limits.min_requests; a smaller chunk is
# refused before anything is sent, and those requests fail naming the minimum): its examples'
# chunks are 100 to 200 requests and its rows ten times as many, so most chunks are sent and a
# tail under the minimum is refused, as a user's would be.
SCALE = {"bedrock-batch": 10}


def faults_on(route: str) -> tuple[str, ...]:
    return tuple(k for k in FAULTS if k not in NOT_ON.get(route, ()))


def fault_plan(kind: str, route: str, standing: dict[str, int]) -> FaultPlan:
    """The provider's plan for `kind`. `standing` is its enqueued-token limit (an account's
    property, not a passing fault: it stays through the drain)."""
    create, poll = CALLS.get(route, ("POST /none", "GET /none"))
    plan: dict[str, Any] = {"enqueued_tokens": standing}
    if kind == "fail_validation":
        plan["batches"] = [{"first": 1, "fail_validation": True}]
    elif kind == "expire":
        plan["batches"] = [{"first": 1, "expire_after": 1}]
    elif kind in ("drop_lines", "duplicate_lines", "corrupt_lines"):
        plan["batches"] = [{"every": 2, kind: 1}]
    elif kind == "create_429":
        plan["http"] = [{"match": create, "first": 2, "status": 429, "retry_after": 0}]
    elif kind == "poll_500":
        plan["http"] = [{"match": poll, "first": 3, "status": 500, "retry_after": 0}]
    elif kind == "poll_404":  # every poll: the provider does not know its batches (`forgets_batches`)
        plan["http"] = [{"match": poll, "status": 404}]
    elif kind == "realtime_500":  # a real-time fallback's calls: four in a row, more than a request's retries
        plan["http"] = [{"match": call, "first": 4, "status": 500, "retry_after": 0} for call in REALTIME_CALLS]
    elif kind == "lost_create":
        plan["http"] = [{"match": create, "first": 1, "status": 500, "after": True}]
    return FaultPlan.model_validate(plan)


def _faults_rule(kinds: tuple[str, ...]):
    """The rule that changes the main provider's fault plan, drawing from `kinds`."""

    @precondition(lambda self: self.route in SERVED)
    @rule(kind=st.sampled_from(kinds))
    def faults(self, kind: str) -> None:
        self.set_faults(kind)

    return faults


class Example(RuleBasedStateMachine):
    """What each example of a simulation machine starts from: a folder of its own and a
    client store (a SQLite file in it, or a fresh PostgreSQL schema), both gone after the
    example; at its end the machine's `drain`, whose findings fail it."""

    store_kind = "sqlite"
    name = "sim"  # the folder's prefix and the schema's

    def __init__(self):
        super().__init__()
        self._exit = contextlib.ExitStack()
        self.root = Path(tempfile.mkdtemp(prefix=f"lowtide-{self.name}-"))
        self._exit.callback(shutil.rmtree, self.root, True)
        if self.store_kind == "postgres":
            from tests.conftest import fresh_pg_schema

            self.store_url = self._exit.enter_context(fresh_pg_schema(f"lowtide_{self.name}"))
        else:
            self.store_url = str(self.root / "client.db")

    def drain(self) -> list[str]:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            found = self.drain()
            if found:
                raise invariants.violation(found, "after the drain")
        finally:
            self._exit.close()


class SimMachine(Example):
    """One example: a fresh world (client store, two providers), then drawn steps."""

    loaded = Bundle("loaded")  # names of jobs the store has: the operator's actions act on these

    route = "openai-batch"
    steps_run = 0  # over every example of this process (bench/simulate.py prints it)

    def __init__(self):
        super().__init__()
        self.world = World(self.root, self.store_url, self.route)
        self._exit.callback(self.world.close)
        self.scale = SCALE.get(self.route, 1)
        self.chunk = 4
        self.standing: dict[str, int] = {}  # the main provider's enqueued-token limit
        self.jobs: dict[str, dict[str, Any]] = {}  # what the operator last loaded, per job
        self.night = 0  # each load is a night: rows added or edited then carry it in `updated`

    # The job's source and spec ------------------------------------------------------------
    def _spec(self, name: str, job: dict[str, Any]):
        rows = [{"ticket_id": f"{name}-{i}", "body": f"ticket {i} of {name} rev {job['revs'].get(i, 0)}", "updated": job["stamps"].get(i, 0)}
                for i in range(job["rows"])]  # fmt: skip
        path = write_csv(self.root / f"{name}.csv", rows)
        data: dict[str, Any] = {
            "name": name,
            # Job b is a nightly increment: each load reads only rows past the last one's `updated`.
            "source": {"path": str(path), "id_column": "ticket_id"} | ({"since": {"column": "updated"}} if name in SINCE_JOBS else {}),
            "template": {"user": "Ticket: {{ body }}"},
            "model": ROUTE_MODELS[self.route],
            "route": self.route,
            "route_options": self.world.route_options(self.route, self.chunk, job["provider"], job["key_env"]) | job["options"],
            "params": {"max_tokens": 64},
            "retry": {"max_attempts": 3, "backoff_seconds": 30},
            "notify": {"urls": [self.world.receiver.url], "secret_env": NOTIFY_ENV, "allow_loopback": True},
        }
        if job["deadline"] is not None:
            data["deadline"] = datetime.fromtimestamp(job["deadline"], UTC).isoformat()
        if job["budget"] is not None:
            data["budget_usd"] = str(job["budget"])
        if job["fallback"] is not None:
            data["fallback"] = self.world.fallback(*job["fallback"], self.route)
        if name in AUTO_JOBS and self.route in AUTO_WITH:
            # The cheapest candidate whose p95 fits max_wait is taken; the batch route then hands
            # its work up to real time as the end of max_wait nears (docs/routing.md).
            batch = {"route": self.route, "route_options": data.pop("route_options")}
            data |= {"route": "auto", "auto": {"max_wait": job["max_wait"], "candidates": [batch, self.world.realtime(self.route)]}}
        return build_spec(data)

    def _load(self, name: str, job: dict[str, Any], requeue: bool = False) -> bool:
        """Load `job`; False if lowtide refused it (naming why: nothing stored changed)."""
        try:
            load_job(self.world.store, self._spec(name, job), self.world.clock, requeue_changed=requeue)
        except LowtideError as err:
            hypothesis.note(f"load {name} refused: {str(err)[:300]}")
            return False
        self.jobs[name] = job
        if name in SINCE_JOBS:
            found = invariants.check_increment(self.world, name, job)
            if found:
                raise invariants.violation(found, f"after loading {name} past its watermark")
        return True

    def _job(self, name: str) -> dict[str, Any]:
        known = self.jobs.get(name)
        return dict(known, revs=dict(known["revs"]), stamps=dict(known["stamps"]), options=dict(known["options"])) if known else {
            "rows": 0, "revs": {}, "stamps": {}, "provider": "main", "key_env": KEY_ENV, "deadline": None, "budget": None, "options": {},
            "fallback": None, "max_wait": "2d"}  # fmt: skip

    # Rules ----------------------------------------------------------------------------------
    @initialize(target=loaded, chunk=st.integers(2, 6), rows=st.integers(3, 20))
    def setup(self, chunk: int, rows: int):
        """Every example starts with job `a` loaded: its steps then have something to move."""
        self.chunk = chunk if self.scale == 1 else 100 + 25 * (chunk - 2)
        return self.load("a", rows)

    @rule(target=loaded, name=st.sampled_from(JOBS), more=st.integers(1, 12))
    def load(self, name: str, more: int):
        """Load a job, or load it again with more rows."""
        job = self._job(name)
        self.night += 1
        top, more = MAX_ROWS * self.scale, more * self.scale
        for i in range(job["rows"], min(top, job["rows"] + more)):
            job["stamps"][i] = self.night
        job["rows"] = min(top, job["rows"] + more)
        return name if self._load(name, job) else multiple()

    @rule(name=loaded, count=st.integers(1, 3), requeue=st.booleans())
    def change_rows(self, name: str, count: int, requeue: bool) -> None:
        """Edit some source rows and load again (with or without --requeue-changed)."""
        job = self._job(name)
        self.night += 1
        for i in range(min(count, job["rows"])):
            job["revs"][i] = job["revs"].get(i, 0) + 1
            job["stamps"][i] = self.night  # an edited row comes back past the watermark
        self._load(name, job, requeue)

    @precondition(lambda self: self.route in SERVED)
    @rule(name=loaded, change=st.sampled_from(["other_provider", "main_provider", "wrong_key", "right_key", "poll"]),
          requeue=st.booleans())  # fmt: skip
    def change_spec(self, name: str, change: str, requeue: bool) -> None:
        """Load the same job with changed connection options."""
        job = self._job(name)
        if change.endswith("provider"):
            job["provider"] = change.removesuffix("_provider")
        elif change.endswith("key"):
            job["key_env"] = WRONG_KEY_ENV if change == "wrong_key" else KEY_ENV
        else:
            job["options"]["poll_interval"] = [30.0, 300.0]
        self._load(name, job, requeue)

    @rule(name=loaded, usd=st.sampled_from(["0.000002", "0.00002", "0.0002"]))
    def budget(self, name: str, usd: str) -> None:
        job = self._job(name)
        job["budget"] = Decimal(usd)
        self._load(name, job)

    @rule(name=loaded, seconds=st.sampled_from([60, 600, 3600, 7200]))
    def deadline(self, name: str, seconds: int) -> None:
        """A deadline soon, on the engine's clock."""
        job = self._job(name)
        job["deadline"] = self.world.clock.now() + seconds
        self._load(name, job)

    @rule(name=loaded, to=st.sampled_from(["none", "echo", "realtime"]), margin=st.sampled_from([60, 900, 3600]),
          requeue=st.booleans())  # fmt: skip
    def change_fallback(self, name: str, to: str, margin: int, requeue: bool) -> None:
        """Give the job a fallback route (echo, or the provider's real time) with a safety
        margin before its deadline, or take it away (docs/fallback.md)."""
        job = self._job(name)
        job["fallback"] = None if to == "none" else (to, margin)
        self._load(name, job, requeue)

    @precondition(lambda self: self.route in AUTO_WITH and "c" in self.jobs)
    @rule(wait=st.sampled_from(["30m", "2h", "2d"]), requeue=st.booleans())
    def change_wait(self, wait: str, requeue: bool) -> None:
        """The auto job's `max_wait` changes: lowtide decides again (refused with work in
        flight, unless --requeue-changed). Short waits take the batch route only once this
        store has measured its batches that fast; its chain then hands over within hours."""
        job = self._job("c")
        job["max_wait"] = wait
        self._load("c", job, requeue)

    @rule()
    def tick(self) -> None:
        self.world.tick()

    @rule(call=st.integers(1, 8), after=st.booleans())
    def kill(self, call: int, after: bool) -> None:
        """The engine dies at its call-th route call of a tick; a new one takes over."""
        died = self.world.tick_killed(KillPoint(call, after))
        hypothesis.note(f"kill at call {call} ({'after' if after else 'before'}): {'died' if died else 'tick ended first'}")

    @rule(rounds=st.integers(1, 5), seconds=st.sampled_from([60, 300, 900]))
    def run_a_while(self, rounds: int, seconds: int) -> None:
        """Rounds of tick, provider step and clock step: time passing with a worker running."""
        for _ in range(rounds):
            self.world.tick()
            self.world.serve_step()
            self.world.clock.advance(seconds)

    @precondition(lambda self: self.route in SERVED)
    @rule()
    def forgets_batches(self) -> None:
        """For two hours of a worker running, the provider answers every poll that it does
        not know the batch: each batch in flight is given up as lost and its requests sent
        again; then it knows them again (a batch it ran meanwhile is billed). Half-hour
        rounds: three polls an hour apart give a batch up, and each round costs a tick."""
        self.world.set_faults(fault_plan("poll_404", self.route, self.standing))
        self.run_a_while(rounds=4, seconds=1800)
        self.world.set_faults(fault_plan("none", self.route, self.standing))

    @rule()
    def serve_step(self) -> None:
        self.world.serve_step()

    @rule(seconds=st.sampled_from([1, 60, 600, 3600, 6 * 3600, 25 * 3600]))
    def advance(self, seconds: int) -> None:
        self.world.clock.advance(seconds)

    @rule(name=loaded, force=st.booleans())
    def cancel(self, name: str, force: bool) -> None:
        """`lowtide cancel` (`--force`: a batch whose create may have reached the provider is
        abandoned rather than looked for; its bill, if it was created, goes unbooked, said)."""
        if force:  # what it may abandon, for a batch that carries no key (invariants.given_up)
            with self.world.store.read() as conn:
                creating = conn.execute(
                    sa.select(dispatches.c.id, dispatches.c.created_at)
                    .join(jobs, jobs.c.id == dispatches.c.job_id).where(jobs.c.name == name, dispatches.c.state == "submitting")
                ).all()  # fmt: skip
                for dispatch_id, created_at in creating:
                    ids = conn.scalars(sa.select(requests.c.custom_id).where(requests.c.dispatch_id == dispatch_id)).all()
                    self.world.abandoned.append((created_at, self.world.clock.now(), frozenset(ids)))
        cancel_job(self.world.store, name, self.world.clock, force=force)

    @rule(name=loaded, failed=st.booleans(), cancelled=st.booleans())
    def retry(self, name: str, failed: bool, cancelled: bool) -> None:
        retry_job(self.world.store, name, self.world.clock, failed=failed, cancelled=cancelled)

    @rule(older_than=st.sampled_from([0, 3600, 86400]), keep_results=st.booleans(), archive=st.booleans(),
          after_the_night=st.booleans())  # fmt: skip
    def prune(self, older_than: int, keep_results: bool, archive: bool, after_the_night: bool) -> None:
        """`lowtide prune --older-than`: drop the bodies of jobs ended that long ago (each may
        be loaded again, retried, or still watch a lost batch for its bill). `after_the_night`:
        as from cron once the night's work is done: a worker runs until no job is active
        (a few hours at most), then the prune."""
        for _ in range(12 if after_the_night else 0):
            with self.world.store.read() as conn:
                if conn.execute(sa.select(jobs.c.id).where(jobs.c.state == "active").limit(1)).first() is None:
                    break
            self.run_a_while(rounds=1, seconds=900)
        folder = self.root / "archive" if archive else None
        pruned = prune(self.world.store, self.world.clock, older_than, keep_results=keep_results, archive=folder)
        hypothesis.note(f"pruned {pruned.jobs} (skipped {pruned.skipped})")

    @rule(name=loaded, cancel=st.booleans(), again=st.booleans())
    def delete(self, name: str, cancel: bool, again: bool) -> None:
        """`lowtide delete JOB --yes [--cancel]`: refused while a batch of the job is in flight
        (naming each), else every row of the job goes in one transaction; then the job is
        loaded again from its source, as new (its rows as they are now, or one row more).
        Its batches' bills leave the ledger with it (docs/cli.md), so the drain does not look
        for them (`world.deleted`)."""
        if cancel:
            cancel_job(self.world.store, name, self.world.clock)
        with self.world.store.read() as conn:
            made = conn.execute(
                sa.select(dispatches.c.key, dispatches.c.provider_id).join(jobs, jobs.c.id == dispatches.c.job_id).where(jobs.c.name == name)
            ).all()  # fmt: skip
        try:
            delete_job(self.world.store, name, self.world.clock)
        except InFlightError as err:
            hypothesis.note(f"delete {name} refused: {str(err)[:300]}")
            if not err.batches or "nothing deleted" not in str(err):
                raise invariants.violation([f"delete_refusal: it names no batch, or not what was kept: {err}"], f"deleting {name}") from None
            return
        self.world.deleted |= {k for k, _ in made} | {str(p).rsplit("/", 1)[-1] for _, p in made if p}
        job = self._job(name)
        self.jobs.pop(name)
        fresh = self._job(name)
        fresh["rows"] = min(MAX_ROWS * self.scale, job["rows"] + (1 if again else 0))
        fresh["stamps"] = {i: job["stamps"].get(i, self.night) for i in range(fresh["rows"])}
        fresh["revs"] = job["revs"]
        if not self._load(name, fresh):  # the source as it is: loadable, as it was before
            raise invariants.violation([f"reload: job {name} deleted, then its source was refused"], f"loading {name} again")

    @rule(name=loaded, bad=st.sampled_from(["empty_cell", "duplicate_id", "empty_id"]))
    def bad_load(self, name: str, bad: str) -> None:
        """Load the job again from a source with one bad row in it: refused whole, naming the
        file, the row and the fix, and nothing stored changes (docs/guarantees.md, 7)."""
        job = self._job(name)
        # A `since` job reads the rows past its watermark: a row again with a newer `updated` is
        # that row edited (an append-only source), not a duplicate.
        if not job["rows"] or (bad == "duplicate_id" and name in SINCE_JOBS):
            return
        spec = self._spec(name, job)  # writes the good source
        path = self.root / f"{name}.csv"
        row = {"empty_cell": f"{name}-{job['rows']},,{self.night + 1}", "duplicate_id": f"{name}-0,again,{self.night + 1}",
               "empty_id": f",no id,{self.night + 1}"}[bad]  # fmt: skip
        with path.open("a") as f:
            f.write(row + "\r\n")  # as csv.DictWriter ends its rows
        before = invariants.stored(self.world)
        try:
            load_job(self.world.store, spec, self.world.clock)
        except LowtideError as err:
            said = str(err)
        else:
            raise invariants.violation([f"bad_input: a source with a bad row ({bad}) was loaded"], f"loading {name}")
        found = [] if "nothing was stored" in said and f"{name}.csv row" in said else [f"bad_input: the refusal does not name the file and row, or what was kept: {said[:300]}"]
        if invariants.stored(self.world) != before:
            found.append(f"bad_input: a refused load ({bad}) changed what was stored")
        self._spec(name, job)  # the operator fixes the source
        if found:
            raise invariants.violation(found, f"loading {name} with a bad row")

    @rule(name=loaded)
    def export(self, name: str) -> None:
        """`lowtide export`, mid-night or after: the file must agree with the store."""
        path = self.root / f"export-{name}.jsonl"
        export_results(self.world.store, name, path)
        found = invariants.export_truthful(self.world, name, path)
        if found:
            raise invariants.violation([f"export_truthful: {v}" for v in found], f"exporting {name}")

    def set_faults(self, kind: str) -> None:
        """The main provider's fault plan changes (queue_*: its enqueued-token limit)."""
        if kind.startswith("queue_"):
            self.standing = {"full": {"*": 1}, "tight": {"*": 60}, "room": {}}[kind.removeprefix("queue_")]
        self.world.set_faults(fault_plan(kind, self.route, self.standing))

    faults = _faults_rule(FAULTS)  # each route's machine draws from its own (machine_for)

    # Checks -----------------------------------------------------------------------------------
    @invariant()
    def holds(self) -> None:
        SimMachine.steps_run += 1
        found = invariants.check_step(self.world)
        if found:
            raise invariants.violation(found, "invariants broken")

    def _counts(self) -> tuple[int, int]:
        with self.world.store.read() as conn:
            open_requests = conn.execute(
                sa.select(sa.func.count()).select_from(requests).where(requests.c.state.in_(["pending", "dispatched"]))
            ).scalar_one()
            made = conn.execute(sa.select(sa.func.count()).select_from(dispatches)).scalar_one()
        return open_requests, made + invariants.batches_created(self.world)

    def _settled(self) -> bool:
        with self.world.store.read() as conn:
            # A batch given up as lost is still polled for its bill: the drain waits for it too.
            waited = sa.or_(dispatches.c.state.in_(LIVE_DISPATCH_STATES), watched())
            live = conn.execute(sa.select(dispatches.c.id).where(waited).limit(1)).first()
            busy = conn.execute(sa.select(jobs.c.id).where(jobs.c.state.not_in(["finished", "cancelled"])).limit(1)).first()
            unsent = conn.execute(sa.select(notifications.c.id).where(notifications.c.state == "pending").limit(1)).first()
        return live is None and busy is None and unsent is None and self._counts()[0] == 0

    def _shape(self) -> tuple:
        """What a drain round could change: states, dispatches, attempts, provider batches."""
        with self.world.store.read() as conn:
            shape = tuple(conn.execute(sa.select(requests.c.state, sa.func.count()).group_by(requests.c.state).order_by(requests.c.state)).all())
            shape += tuple(conn.execute(sa.select(dispatches.c.state, sa.func.count()).group_by(dispatches.c.state).order_by(dispatches.c.state)).all())
        return shape + self._counts()

    def drain(self) -> list[str]:
        """Clear the passing faults (an account's queue limit stays), raise any budget (the
        operator's answer to budget_exhausted), then tick (and let its notification attempts
        end), step the providers and move the
        clock on for a bounded number of rounds (more where more is open); stop early once settled, or once nothing
        has changed for STUCK rounds (the last ones hours apart), or once more batches were made than
        the bound allows (a loop)."""
        if self.route in SERVED:
            self.world.set_faults(fault_plan("none", self.route, self.standing))
            self.world.set_faults(FaultPlan(), "other")
        for name, job in list(self.jobs.items()):
            if job["budget"] is not None:
                self._load(name, dict(job, budget=None))
        open_at_start, made_at_start = self._counts()
        # Each open request sent twice at most, each sending counted twice (the dispatch and the
        # provider's batch): a queue limit that takes one request a batch (queue_tight) sends
        # every request alone, after the chunks it refused. More is a loop.
        bound = 4 * open_at_start + 8
        found: list[str] = []
        same, last = 0, None
        for round_ in range(DRAIN_ROUNDS + 2 * open_at_start):
            self.world.tick()
            self.world.run(self.world.engine.notifier.settle())  # the tick's notification attempts end this round
            self.world.serve_step()
            if self._settled():
                break
            made = self._counts()[1] - made_at_start
            if made > bound:
                found.append(f"drain: {made} batches and dispatches created in {round_ + 1} rounds while draining "
                             f"{open_at_start} open request(s) (bound {bound}): a loop")  # fmt: skip
                break
            shape = self._shape()
            same, last = (same + 1 if shape == last else 0), shape
            if same >= STUCK:
                break
            self.world.clock.advance(600 if same < 3 else 6 * 3600)  # unchanged a while: jump hours ahead
        return invariants.check_step(self.world) + invariants.check_drained(self.world) + found


def machine_for(route: str, store_kind: str) -> type[SimMachine]:
    attrs: dict[str, Any] = {"route": route, "store_kind": store_kind}
    if route in NOT_ON:
        attrs["faults"] = _faults_rule(faults_on(route))
    return type(f"Sim_{route.replace('-', '_')}_{store_kind}", (SimMachine,), attrs)


def sim_settings(examples: int, steps: int, shrink: bool = True) -> settings:
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        suppress_health_check=list(HealthCheck), print_blob=False, phases=phases,
    )  # fmt: skip


def replay_command(route: str, store_kind: str, seed: int, examples: int, steps: int) -> str:
    return (f".venv/bin/python bench/simulate.py --route {route} --store {store_kind} --seed {seed} "
            f"--seeds 1 --examples {examples} --steps {steps}")  # fmt: skip


def run(route: str, store_kind: str, *, seed: int, examples: int, steps: int, shrink: bool = True) -> None:
    """Run the simulation's examples drawn from `seed` (the same examples every run). A
    failure raises with the shrunk sequence of steps and the command that replays it."""
    run_machine(machine_for(route, store_kind), seed=seed, examples=examples, steps=steps, shrink=shrink,
                replay=replay_command(route, store_kind, seed, examples, steps))  # fmt: skip


def run_machine(machine: type[RuleBasedStateMachine], *, seed: int, examples: int, steps: int, shrink: bool, replay: str) -> None:
    """Run `machine`'s examples drawn from `seed`; a failure raises with `replay` noted."""
    from hypothesis.stateful import get_state_machine_test

    test = hypothesis.seed(seed)(get_state_machine_test(machine, settings=sim_settings(examples, steps, shrink)))
    try:
        test()
    except BaseException as err:
        if isinstance(err, Exception):
            err.add_note(f"replay: {replay}")
        raise
