"""Chaos test: three workers on one job in PostgreSQL, SIGKILLed at random moments, while an
operator cancels and retries, appends rows, lets a budget bind part-way and changes the spec.

    .venv/bin/python bench/chaostest.py --trials 100 --rows 600 --chunk 50 --seed 1 --parallel 2
    .venv/bin/python bench/chaostest.py --trials 5 --db postgresql://postgres@127.0.0.1:5432/test

The kill test (bench/killtest.py) kills one process at a time; this one runs the whole
operator's day against one job. Each trial:

1. makes a fresh PostgreSQL schema (the client store) and a fresh `lowtide serve --backend
   echo` with its own SQLite store (the provider; never killed), and a CSV of `--rows` tickets;
2. `lowtide submit`s a job on `openai-batch` (model gpt-4o-mini, chunks of `--chunk`) whose
   `budget_usd` covers between 1.3 and 2.6 chunks' estimates, so it binds part-way;
3. starts three `lowtide worker` processes on the store and, at seeded random moments within
   the calibrated span, does each of:
   - SIGKILL a random worker (`--kills` times), restarting it at once;
   - `lowtide cancel` the job, and later `lowtide retry --cancelled`;
   - append `--append` rows to the CSV and `lowtide submit` it again;
   - submit the spec with another model under the same name (which must be refused, or
     change nothing already sent);
   - raise the budget (a spec change that must be applied) and `lowtide submit` it;
4. heals: stops the workers, submits the raised budget, retries what was cancelled, and runs
   three `lowtide worker --until-idle` unkilled to the end; then exports the results.

Checked from the stores afterwards (every figure must be 0):

- lost:            source rows (appended ones too) with no request, or requests not
                   succeeded after the heal (no fault is injected: everything must succeed)
- duplicated:      as the kill test: applied successes other than one, attempts after the
                   applied success, answers that are not echo's, output rows missing or twice
- double-submitted: provider batches beyond the first for one dispatch key, batches whose key
                   no dispatch holds, a provider id held by two dispatches
- double-billed:   requests the provider answered successfully more than once (paid twice),
                   and provider successes the client's ledger never booked (paid, not counted),
                   and attempts booked at a model other than the one sent
- not converged:   the final workers did not all exit 0 with the job finished and every
                   request terminal
- crashes:         launches that exited non-zero without being killed

Prints one line per trial and a summary table; exits 1 if any figure is not 0.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import killtest  # noqa: E402
from killtest import KEY_ENV, LOWTIDE, ClientStore, Server, write_source  # noqa: E402

JOB = "chaostest"
MODEL = "gpt-4o-mini"
OTHER_MODEL = "gpt-4o"
WORKERS = 3
WATCH = 0.01  # seconds between looks at the running workers


@dataclass
class Trial:
    trial: int
    kills: int = 0
    launches: int = 0
    cancels: int = 0
    appended: int = 0
    budget_bound: bool = False
    model_change_rc: int | None = None
    lost: int = 0
    duplicated: int = 0
    double_submitted: int = 0
    double_billed: int = 0
    not_converged: int = 0
    crashes: int = 0
    provider_batches: int = 0
    wall: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.duplicated or self.double_submitted or self.double_billed
            or self.not_converged or self.crashes or self.problems
        )  # fmt: skip


FIGURES = ("kills", "launches", "cancels", "appended", "lost", "duplicated", "double_submitted", "double_billed",
           "not_converged", "crashes", "provider_batches")  # fmt: skip


@dataclass
class Summary:
    args: dict[str, Any]
    trials: list[Trial] = field(default_factory=list)
    span: float = 0.0
    wall: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.trials)

    @property
    def ok(self) -> bool:
        return bool(self.trials) and all(t.ok for t in self.trials)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.args, "trials_run": len(self.trials), "span_s": round(self.span, 2), "wall_s": round(self.wall, 1),
            **{k: self.total(k) for k in FIGURES},
            "budget_bound": sum(t.budget_bound for t in self.trials),
            "model_change_refused": sum(t.model_change_rc == 2 for t in self.trials),
            "failed_trials": [asdict(t) for t in self.trials if not t.ok],
        }  # fmt: skip


# -- the job --------------------------------------------------------------------------------


def spec_dict(server: Server, chunk: int, budget: Decimal | None, model: str = MODEL) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": JOB,
        "source": {"path": "tickets.csv", "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"},
        "model": model,
        "route": "openai-batch",
        "route_options": server.options(chunk),
        "params": {"max_tokens": 256},  # a budget needs an output limit to estimate against
        "retry": {"max_attempts": 5, "backoff_seconds": 0},
        "output": {"path": "results.csv"},
    }
    if budget is not None:
        spec["budget_usd"] = str(budget)
    return spec


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def append_rows(path: Path, start: int, count: int, trial: int) -> dict[str, str]:
    """Append `count` new tickets (ids after the existing ones); returns id → expected answer."""
    extra = path.with_suffix(".extra.csv")
    expected = write_source(extra, start + count, trial)
    new = {k: v for k, v in expected.items() if int(k.rsplit("-", 1)[1]) >= start}
    with extra.open(encoding="utf-8", newline="") as src, path.open("a", encoding="utf-8", newline="") as dst:
        w = csv.writer(dst)
        for row in csv.DictReader(src):
            if row["ticket_id"] in new:
                w.writerow([row["ticket_id"], row["channel"], row["body"]])
    extra.unlink()
    return new


def estimate_usd(spec: Path, env: dict[str, str]) -> Decimal:
    """`lowtide estimate`'s cost of the whole job on its own route."""
    out = subprocess.run([LOWTIDE, "estimate", str(spec), "--json"], cwd=spec.parent, env=env, capture_output=True, text=True, check=True)
    routes = json.loads(out.stdout)["routes"]
    return Decimal(next(r["usd"] for r in routes if r["this_job"]))


# -- the workers ----------------------------------------------------------------------------


class Crew:
    """Three `lowtide worker` processes on one store; a killed one is restarted at once."""

    def __init__(self, store: ClientStore, folder: Path, env: dict[str, str], trial: Trial):
        self.store, self.folder, self.env, self.trial = store, folder, env, trial
        self.procs: list[subprocess.Popen | None] = [None] * WORKERS
        self.logs: list[Path | None] = [None] * WORKERS  # each launch's stderr, in a file of its own
        (folder / "workers").mkdir(exist_ok=True)

    def start(self, i: int, *extra: str) -> subprocess.Popen:
        self.logs[i] = self.folder / "workers" / f"{self.trial.launches:03d}-worker-{i}.log"
        with self.logs[i].open("wb") as log:
            proc = subprocess.Popen([LOWTIDE, "--db", self.store.url, "worker", *extra], cwd=self.folder, env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
        self.trial.launches += 1
        self.procs[i] = proc
        return proc

    def interrupted_at_start(self, i: int) -> bool:
        """Did worker `i`'s SIGINT land in the interpreter's own start (its `site` import)?
        Python ends that with a fatal error and exit 1, before any of lowtide runs: a worker
        restarted just before the stop, not a worker that failed to stop."""
        log = self.logs[i]
        return log is not None and b"init_import_site" in log.read_bytes()

    def start_all(self) -> None:
        for i in range(WORKERS):
            self.start(i)

    def watch(self) -> None:
        """A worker that exited on its own (it should not) is a crash; start another."""
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is not None:
                self.trial.crashes += 1
                self.trial.problems.append(f"worker {i} exited {proc.returncode} without being killed")
                self.start(i)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is None:
            return
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.trial.kills += 1
        self.start(i)

    def stop(self) -> None:
        """SIGINT (Ctrl-C): a worker stops and exits 130 (interrupted, resumable); -SIGINT when
        it lands before the CLI is up (Python re-raises an uncaught KeyboardInterrupt as the signal);
        1 when it lands in the interpreter's own start (`interrupted_at_start`)."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.trial.problems.append(f"worker {i} did not stop within 60 s of SIGINT")
            else:
                if proc.returncode not in (0, 130, -signal.SIGINT) and not (proc.returncode == 1 and self.interrupted_at_start(i)):
                    self.trial.crashes += 1
                    self.trial.problems.append(f"worker {i} exited {proc.returncode} on SIGINT")
        self.procs = [None] * WORKERS

    def run_to_end(self, timeout: float) -> bool:
        """Three unkilled `worker --until-idle`: all must exit 0."""
        procs = [self.start(i, "--until-idle") for i in range(WORKERS)]
        ok = True
        for i, proc in enumerate(procs):
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.trial.problems.append(f"final worker {i} did not finish within {timeout:g} s")
                ok = False
                continue
            if proc.returncode != 0:
                self.trial.problems.append(f"final worker {i} exited {proc.returncode}")
                ok = False
        self.procs = [None] * WORKERS
        return ok


# -- one trial ------------------------------------------------------------------------------


def cli(args: list[str], cwd: Path, env: dict[str, str], db: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([LOWTIDE, "--db", db, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def one_trial(n: int, args: argparse.Namespace, span: float | None, root: Path, batch_usd: Decimal) -> tuple[Trial, float | None]:
    """Trial `n`; with `span` None, the calibration run: no chaos, no budget, timed."""
    t0 = time.monotonic()
    trial = Trial(n)
    folder = root / f"trial-{n:04d}"
    folder.mkdir()
    rng = random.Random(f"{args.seed}-{n}")
    expected = write_source(folder / "tickets.csv", args.rows, n)
    server = Server(folder, ("--complete-after", str(args.complete_after)))
    store = ClientStore(folder, args.db)
    env = {**os.environ, KEY_ENV: "chaostest-key"}
    measured = None
    try:
        budget = None if span is None else (batch_usd * Decimal(str(round(rng.uniform(1.3, 2.6), 3))))
        job_yaml = write_yaml(folder / "job.yaml", spec_dict(server, args.chunk, budget))
        submitted = cli(["submit", str(job_yaml)], folder, env, store.url, args.timeout)
        if submitted.returncode != 0:
            raise RuntimeError(f"lowtide submit exited {submitted.returncode}: {submitted.stderr.strip()[-500:]}")
        crew = Crew(store, folder, env, trial)
        if span is None:
            started = time.monotonic()
            converged = crew.run_to_end(args.timeout)
            measured = time.monotonic() - started
        else:
            chaos(trial, args, rng, span, crew, folder, env, store, server, expected)
            crew.stop()
            heal = [
                ["submit", str(write_yaml(folder / "healed.yaml", spec_dict(server, args.chunk, Decimal(1000))))],
                ["retry", JOB, "--cancelled", "--failed"],
            ]
            for command in heal:
                done = cli(command, folder, env, store.url, args.timeout)
                if done.returncode != 0:
                    trial.problems.append(f"heal `lowtide {command[0]}` exited {done.returncode}: {done.stderr.strip()[-300:]}")
            converged = crew.run_to_end(args.timeout)
        if not converged:
            trial.not_converged = 1
        exported = cli(["results", JOB, "--out", str(folder / "results.csv")], folder, env, store.url, args.timeout)
        if exported.returncode not in (0, 1):
            trial.problems.append(f"lowtide results exited {exported.returncode}: {exported.stderr.strip()[-300:]}")
        check(trial, store, folder, expected, server)
    except Exception as err:  # a broken trial is a failed trial, not a crashed harness
        trial.problems.append(f"harness: {type(err).__name__}: {err}")
        trial.not_converged = 1
    finally:
        if span is not None and not trial.ok:
            diagnose(trial, store, folder, server)
        server.stop()
        store.drop()
    trial.wall = time.monotonic() - t0
    return trial, measured


def chaos(trial: Trial, args, rng: random.Random, span: float, crew: Crew, folder: Path, env, store: ClientStore,
          server: Server, expected: dict[str, str]) -> None:  # fmt: skip
    """Start the workers and play the operator's day: every event at its drawn moment."""
    cancel_at = rng.uniform(0.1, 0.6) * span
    events: list[tuple[float, str]] = [(rng.uniform(0, span), "kill") for _ in range(args.kills)]
    events += [(cancel_at, "cancel"), (cancel_at + rng.uniform(0.05, 0.3) * span, "retry")]
    events += [(rng.uniform(0, span), "append"), (rng.uniform(0, span), "model"), (rng.uniform(0.4, 1.0) * span, "raise")]
    events.sort()
    crew.start_all()
    started = time.monotonic()
    next_row = args.rows
    for at, what in events:
        while time.monotonic() - started < at:
            crew.watch()
            time.sleep(WATCH)
        if what == "kill":
            crew.kill(rng.randrange(WORKERS))
        elif what == "cancel":
            trial.cancels += 1
            _operator(trial, ["cancel", JOB], folder, env, store, args)
        elif what == "retry":
            _operator(trial, ["retry", JOB, "--cancelled"], folder, env, store, args)
        elif what == "append":
            new = append_rows(folder / "tickets.csv", next_row, args.append, trial.trial)
            expected.update(new)
            next_row += len(new)
            trial.appended += len(new)
            _operator(trial, ["submit", str(folder / "job.yaml")], folder, env, store, args)
        elif what == "model":  # the same job name, another model: refused, or nothing sent changes
            other = write_yaml(folder / "other-model.yaml", spec_dict(server, args.chunk, None, OTHER_MODEL))
            trial.model_change_rc = cli(["submit", str(other)], folder, env, store.url, args.timeout).returncode
        elif what == "raise":
            trial.budget_bound = _job_state(store) == "budget_exhausted" or _budget_event(store)
            raised = write_yaml(folder / "job.yaml", spec_dict(server, args.chunk, Decimal(1000)))
            _operator(trial, ["submit", str(raised)], folder, env, store, args)
        crew.watch()


def _operator(trial: Trial, command: list[str], folder: Path, env, store: ClientStore, args) -> None:
    done = cli(command, folder, env, store.url, args.timeout)
    if done.returncode not in (0, 1):
        trial.problems.append(f"`lowtide {' '.join(command[:2])}` exited {done.returncode}: {done.stderr.strip()[-300:]}")


def _job_state(store: ClientStore) -> str | None:
    engine = store.engine()
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT state FROM jobs WHERE name = :n"), {"n": JOB}).scalar()
    finally:
        engine.dispose()


def _budget_event(store: ClientStore) -> bool:
    engine = store.engine()
    try:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text("SELECT COUNT(*) FROM events WHERE kind LIKE 'budget%'")).scalar())
    finally:
        engine.dispose()


# -- checks ---------------------------------------------------------------------------------


def check(trial: Trial, store: ClientStore, folder: Path, expected: dict[str, str], server: Server) -> None:
    engine = store.engine()
    try:
        with engine.connect() as conn:
            job = conn.execute(sa.text("SELECT id, state FROM jobs WHERE name = :n"), {"n": JOB}).one()
            rows = conn.execute(
                sa.text("SELECT id, custom_id, source_key, state, output FROM requests WHERE job_id = :j"), {"j": job.id}
            ).all()
            applied = dict(conn.execute(sa.text(
                "SELECT request_id, COUNT(*) FROM attempts WHERE applied AND ok AND job_id = :j GROUP BY request_id"
            ), {"j": job.id}).all())  # fmt: skip
            after = conn.execute(sa.text(
                "SELECT COUNT(*) FROM attempts a JOIN attempts s ON s.request_id = a.request_id "
                "AND s.applied AND s.ok WHERE a.id > s.id AND a.job_id = :j"
            ), {"j": job.id}).scalar_one()  # fmt: skip
            booked = conn.execute(sa.text(
                "SELECT d.provider_id, r.custom_id, a.model FROM attempts a JOIN dispatches d ON d.id = a.dispatch_id "
                "JOIN requests r ON r.id = a.request_id WHERE a.job_id = :j"
            ), {"j": job.id}).all()  # fmt: skip
            keys = set(conn.execute(sa.text("SELECT key FROM dispatches WHERE job_id = :j AND kind = 'batch'"), {"j": job.id}).scalars())
            provider_ids = conn.execute(
                sa.text("SELECT provider_id FROM dispatches WHERE job_id = :j AND provider_id IS NOT NULL"), {"j": job.id}
            ).scalars().all()
    finally:
        engine.dispose()

    by_key = collections.Counter(r.source_key for r in rows)
    missing = set(expected) - set(by_key)
    unsucceeded = collections.Counter(r.state for r in rows if r.state != "succeeded")
    trial.lost = len(missing) + sum(unsucceeded.values())
    if missing:
        trial.problems.append(f"{len(missing)} source row(s) with no request, e.g. {sorted(missing)[:3]}")
    if unsucceeded:
        trial.problems.append(f"requests not succeeded after the heal: {dict(unsucceeded)}")
    if unsucceeded.keys() - {"failed", "cancelled"} or job.state != "finished":
        trial.not_converged = 1
        trial.problems.append(f"job state {job.state}; requests by state {dict(unsucceeded)} besides succeeded")

    dup = [r for r in rows if r.state == "succeeded" and applied.get(r.id, 0) != 1]
    dup_keys = [k for k, c in by_key.items() if c > 1]
    wrong = [r for r in rows if r.state == "succeeded" and r.output != expected.get(r.source_key)]
    out_problems = killtest._check_output(folder / "results.csv", expected) if job.state == "finished" else 0
    trial.duplicated = len(dup) + len(dup_keys) + after + len(wrong) + out_problems
    for n, what in ((len(dup), "succeeded request(s) without exactly one applied success"),
                    (len(dup_keys), "source row(s) with more than one request"),
                    (after, "attempt(s) made after the request's applied success"),
                    (len(wrong), "answer(s) other than echo's"),
                    (out_problems, "output row(s) missing or repeated in results.csv")):  # fmt: skip
        if n:
            trial.problems.append(f"{n} {what}")

    created = server.batches_by_key()
    trial.provider_batches = sum(created.values())
    extra = sum(c - 1 for c in created.values() if c > 1)
    orphans = sum(c for k, c in created.items() if k not in keys)
    twice = len(provider_ids) - len(set(provider_ids))
    trial.double_submitted = extra + orphans + twice
    for n, what in ((extra, "provider batch(es) beyond the first for one dispatch key"),
                    (orphans, "provider batch(es) whose key no dispatch holds"),
                    (twice, "provider id(s) held by two dispatches")):  # fmt: skip
        if n:
            trial.problems.append(f"{n} {what}")

    answered = server_successes(server)
    per_request = collections.Counter(custom_id for _, custom_id in answered)
    paid_twice = sum(c - 1 for c in per_request.values() if c > 1)
    booked_pairs = {(p, c) for p, c, _ in booked}
    not_booked = len(answered - booked_pairs)
    other_model = sum(1 for _, _, model in booked if model != MODEL)
    trial.double_billed = paid_twice + not_booked + other_model
    for n, what in ((paid_twice, "request(s) the provider answered more than once"),
                    (not_booked, "provider answer(s) the ledger never booked"),
                    (other_model, f"attempt(s) booked at a model other than {MODEL}")):  # fmt: skip
        if n:
            trial.problems.append(f"{n} {what}")


def diagnose(trial: Trial, store: ClientStore, folder: Path, server: Server) -> None:
    """A failed trial's store dies with its schema: write what the unfinished requests' dispatches,
    the job and its last events said (and the provider's view of those batches) to diagnosis.txt,
    and the dispatches' states into the trial's problems, so a CI log says where requests stuck."""
    lines: list[str] = []
    try:
        engine = store.engine()
        try:
            with engine.connect() as conn:
                job = conn.execute(sa.text("SELECT id, state, spec FROM jobs WHERE name = :n"), {"n": JOB}).one()
                lines.append(f"job {job.id} state {job.state} spec {job.spec}")
                stuck = conn.execute(sa.text(
                    "SELECT d.id, d.state, d.route, d.owner, d.lease_until, d.cancel_requested, d.provider_id, d.error, "
                    "d.next_poll_at, d.created_at, COUNT(r.id) AS n, MIN(r.state) AS rstate FROM requests r "
                    "LEFT JOIN dispatches d ON d.id = r.dispatch_id WHERE r.job_id = :j AND r.state <> 'succeeded' "
                    "GROUP BY d.id ORDER BY d.id"
                ), {"j": job.id}).all()  # fmt: skip
                for row in stuck:
                    lines.append("stuck: " + ", ".join(f"{k}={v}" for k, v in row._mapping.items()))
                trial.problems.append("unfinished requests by dispatch: " + "; ".join(
                    f"{r.n} {r.rstate} in dispatch {r.id} ({r.state}, owner {r.owner}, lease {r.lease_until}, "
                    f"cancel {r.cancel_requested}, provider {r.provider_id})" for r in stuck
                ))  # fmt: skip
                lines += [f"dispatch: {dict(r._mapping)}" for r in conn.execute(sa.text("SELECT * FROM dispatches ORDER BY id"))]
                events = conn.execute(sa.text("SELECT at, kind, message FROM events ORDER BY id DESC LIMIT 80")).all()
                lines += [f"event {e.at:.3f} {e.kind}: {e.message}" for e in reversed(events)]
        finally:
            engine.dispose()
        provider = sa.create_engine(f"sqlite:///{server.db}")
        try:
            with provider.connect() as conn:
                lines += [f"serve batch: {dict(r._mapping)}" for r in conn.execute(sa.text(
                    "SELECT id, status, metadata, created_at FROM serve_batches WHERE api = 'openai'"
                ))]  # fmt: skip
        finally:
            provider.dispose()
    except Exception as err:  # the diagnosis must not hide the failure it describes
        lines.append(f"diagnosis failed: {type(err).__name__}: {err}")
    (folder / "diagnosis.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def server_successes(server: Server) -> set[tuple[str, str]]:
    """(provider batch id, custom_id) of every request the provider answered successfully:
    the server runs each API batch as lowtide jobs in its own store."""
    engine = sa.create_engine(f"sqlite:///{server.db}")
    try:
        with engine.connect() as conn:
            job_batch = {}
            for batch_id, jobs in conn.execute(sa.text("SELECT id, jobs FROM serve_batches WHERE api = 'openai'")).all():
                for job in json.loads(jobs or "[]"):
                    job_batch[job["name"]] = batch_id
            rows = conn.execute(sa.text(
                "SELECT j.name, r.source_key FROM requests r JOIN jobs j ON j.id = r.job_id WHERE r.state = 'succeeded'"
            )).all()  # fmt: skip
    finally:
        engine.dispose()
    return {(job_batch[name], key) for name, key in rows if name in job_batch}


# -- all trials -----------------------------------------------------------------------------


def run_trials(args: argparse.Namespace, echo=print) -> Summary:
    _sigint_for_workers()
    summary = Summary({k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="lowtide-chaostest-"))
    lock = threading.Lock()
    try:
        calibration, span = one_trial(-1, args, None, root, Decimal(0))
        if not calibration.ok or span is None:
            summary.trials.append(calibration)
            echo(f"calibration run failed: {calibration.problems}")
            return summary
        summary.span = span
        folder = root / "trial--001"
        env = {**os.environ, KEY_ENV: "chaostest-key"}
        batch_usd = estimate_usd(folder / "job.yaml", env) * args.chunk / args.rows
        echo(f"calibration: {args.rows} rows, three workers, {span:.2f} s; a chunk's estimate ${batch_usd:.8f}")

        def one(n: int) -> Trial:
            trial, _ = one_trial(n, args, span, root, batch_usd)
            with lock:
                summary.trials.append(trial)
                mark = "ok" if trial.ok else "FAIL " + "; ".join(trial.problems)
                echo(f"trial {n + 1:4d}/{args.trials}: {trial.kills} kill(s), {trial.cancels} cancel(s), "
                     f"{trial.appended} appended, budget {'bound' if trial.budget_bound else 'not bound'}, "
                     f"model change rc {trial.model_change_rc}, {trial.wall:5.1f} s  {mark}")  # fmt: skip
                if trial.ok and not args.keep:
                    shutil.rmtree(root / f"trial-{n:04d}", ignore_errors=True)
                if args.json:
                    summary.wall = time.monotonic() - t0
                    args.json.write_text(json.dumps(summary.to_json(), indent=2), encoding="utf-8")
            return trial

        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(one, range(args.trials)))
        summary.trials.sort(key=lambda t: t.trial)
    finally:
        summary.wall = time.monotonic() - t0
        if args.keep or not summary.ok:
            echo(f"trial folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return summary


def table(summary: Summary) -> str:
    head = ["trials", "kills", "cancels", "appended", "lost", "duplicated", "double-submitted", "double-billed",
            "not converged", "crashes", "wall time"]  # fmt: skip
    row = [str(len(summary.trials)), *(str(summary.total(k)) for k in ("kills", "cancels", "appended", "lost", "duplicated",
           "double_submitted", "double_billed", "not_converged", "crashes")), f"{summary.wall / 60:.1f} min"]  # fmt: skip
    return killtest.markdown_table(head, row)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--rows", type=int, default=600, help="source rows per trial (default 600)")
    p.add_argument("--append", type=int, default=60, help="rows appended mid-run (default 60)")
    p.add_argument("--chunk", type=int, default=50, help="requests per provider batch (default 50)")
    p.add_argument("--kills", type=int, default=4, help="SIGKILLs per trial (default 4)")
    p.add_argument("--complete-after", type=float, default=1800.0,
                   help="the provider's scaled seconds before a batch may finish (default 1800: 0.5 s)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--parallel", type=int, default=1, help="trials run at once (each has its own server and schema)")
    p.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/test",
                   help="the PostgreSQL database in which each trial gets a fresh schema")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one process may run (a safety net, not a limit)")
    p.add_argument("--json", type=Path, help="also write the figures here as JSON")
    p.add_argument("--keep", action="store_true", help="keep every trial's folder")
    return p


def _sigint_for_workers() -> None:
    """A harness started in the background of a script (`python bench/chaostest.py &`) ignores
    SIGINT, and its workers inherit that: `Crew.stop`'s Ctrl-C would never land, and every
    trial would fail "did not stop within 60 s of SIGINT". A handled signal is the default
    again in a child, so handling it here gives the workers theirs."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    summary = run_trials(args)
    print()
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary.to_json(), indent=2), encoding="utf-8")
    if not summary.ok:
        print("\nFAILED: some figure is not 0", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
