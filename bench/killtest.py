"""Kill test: run a job, SIGKILL its process at random moments, restart it, and check the
store afterwards for lost requests, duplicated results and chunks submitted twice.

    .venv/bin/python bench/killtest.py --route echo --trials 200 --rows 10000 --seed 1
    .venv/bin/python bench/killtest.py --route openai-batch --trials 200 --rows 2000 --chunk 200
    .venv/bin/python bench/killtest.py --route echo --trials 20 --db postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/killtest.py --route echo --command worker --trials 20

Each trial gets a fresh store (a SQLite file in a temporary folder, or a fresh schema of the
PostgreSQL database given with --db) and a freshly generated CSV. It starts `lowtide run SPEC`
(or `lowtide submit SPEC`, then `lowtide worker --until-idle`) as a real subprocess and
SIGKILLs it `--kills` times at seeded random moments, restarting it after each kill; then it
lets the last process finish. On `openai-batch` the provider is `lowtide serve --backend echo
--time-scale 3600`, one fresh server (and server store) per trial; it is never killed.

Where the kills land: a calibration run (unkilled, before the first trial) measures how long
the process takes from opening the store to exiting; a trial whose first launch ran the whole
job before its kill moment adds a sample, and the median of the samples is the span. Each kill then comes a uniformly drawn
time after the restarted process has opened the store (SQLite: the file appears among its
open file descriptors; PostgreSQL: from the start of the process), within the calibrated span
scaled by the share of requests not yet terminal. Kills during interpreter start-up would test
nothing. The schedule is drawn from `--seed` and the trial number; the moment a process is at
when the signal lands still depends on the machine's timing, so a failure is reproduced by
rerunning, not replayed.

Checked from the stores after each trial (every figure must be 0):

- lost:           source rows with no request, or requests that ended failed or cancelled
- duplicated:     requests with more than one applied successful attempt (or none, while
                  succeeded), any attempt made after the applied success, an output file row
                  missing or written twice (finished jobs), or an answer that is not echo's
- double-submitted (openai-batch): provider batches beyond the first for one dispatch key,
                  read from the server's own `serve_batches` table (`metadata.lowtide_key`), and
                  provider batches whose key no dispatch of the client holds
- not converged:  the last, unkilled process did not exit 0 with every request terminal and
                  the job finished (within --timeout seconds, a safety net)
- crashes:        launches that exited non-zero without being killed (even if a later one
                  finished the job)

Prints one line per trial and a summary table; exits 1 if any figure is not 0.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # beside it, however killtest is loaded (tests load it by path)
from client_store import ClientStore  # noqa: E402

LOWTIDE = str(Path(sys.executable).with_name("lowtide"))
JOB = "killtest"
KEY_ENV = "LOWTIDE_KILLTEST_KEY"
WATCH = 0.002  # seconds between looks at a running process (the watcher's own pace)
WORDS = ["invoice", "refund", "login", "café", "délivery", "parcel", "crash, error", '"quoted"', "plan", "seat", "日本"]


@dataclass
class Trial:
    trial: int
    kills: int = 0
    launches: int = 0
    lost: int = 0
    duplicated: int = 0
    double_submitted: int = 0
    not_converged: int = 0
    crashes: int = 0  # launches that exited non-zero without being killed
    orphan_uploads: int = 0  # informational: files uploaded for a create that never happened
    provider_batches: int = 0
    wall: float = 0.0
    problems: list[str] = field(default_factory=list)
    kill_phases: dict[str, int] = field(default_factory=dict)  # where the kills landed

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.double_submitted or self.not_converged or self.crashes or self.problems)


@dataclass
class Summary:
    route: str
    command: str
    rows: int
    seed: int
    trials: list[Trial] = field(default_factory=list)
    span: float = 0.0
    wall: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.trials)

    def kill_phases(self) -> dict[str, int]:
        phases: collections.Counter[str] = collections.Counter()
        for t in self.trials:
            phases.update(t.kill_phases)
        return dict(phases.most_common())

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.trials)

    def to_json(self) -> dict[str, Any]:
        figures = {k: self.total(k) for k in ("kills", "launches", "lost", "duplicated", "double_submitted", "not_converged", "crashes", "orphan_uploads", "provider_batches")}
        return {"route": self.route, "command": self.command, "rows": self.rows, "seed": self.seed, "trials": len(self.trials),
                "span_s": round(self.span, 3), "wall_s": round(self.wall, 1), **figures, "kill_phases": self.kill_phases(),
                "failed_trials": [asdict(t) for t in self.trials if not t.ok]}  # fmt: skip


# -- the job -------------------------------------------------------------------------------


def expected_answer(body: str) -> str:
    """What echo answers for the template below (the last user message, cut to 4 × max_tokens)."""
    return f"Ticket: {body}"[: 256 * 4]


def write_source(path: Path, rows: int, trial: int) -> dict[str, str]:
    """A CSV of `rows` tickets; returns id → expected answer."""
    rng = random.Random(trial)
    expected = {}
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["ticket_id", "channel", "body"])
        for i in range(rows):
            body = f"#{i} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
            key = f"T{trial}-{i:05d}"
            w.writerow([key, ("email", "chat", "web")[i % 3], body])
            expected[key] = expected_answer(body)
    return expected


def write_spec(folder: Path, route: str, options: dict[str, Any]) -> Path:
    spec = {
        "name": JOB,
        "source": {"path": "tickets.csv", "id_column": "ticket_id"},
        "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"},
        "model": "test-model",
        "route": route,
        "route_options": options,
        "retry": {"max_attempts": 5, "backoff_seconds": 0},
        "output": {"path": "results.csv"},
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")
    return path


# -- stores ---------------------------------------------------------------------------------


def phase_of(store: ClientStore, rows: int, route: str) -> str:
    """Where a killed process was, read from the store it left behind."""
    engine = store.engine()
    try:
        with engine.connect() as conn:
            states = dict(conn.execute(sa.text("SELECT state, COUNT(*) FROM requests GROUP BY state")).all())
            batches = dict(conn.execute(sa.text("SELECT state, COUNT(*) FROM dispatches WHERE kind = 'batch' GROUP BY state")).all())
    except sa.exc.DBAPIError:  # no tables yet
        return "before the store was set up"
    finally:
        engine.dispose()
    if not states:
        return "loading (no request committed yet)"
    if sum(states.get(s, 0) for s in ("succeeded", "failed", "cancelled")) == rows:
        return "finishing (all terminal)"
    if batches.get("submitting"):
        return "submitting a batch"
    if batches.get("planned"):
        return "planned, not yet sent"
    if batches.get("submitted"):
        return "polling / ingesting"
    if batches:
        return "between batches"
    return "executing" if route == "echo" else "loaded, no batch planned yet"


def terminal_share(store: ClientStore, rows: int) -> float:
    """The share of the job's requests already terminal (0 before any are stored)."""
    engine = store.engine()
    try:
        with engine.connect() as conn:
            n = conn.execute(sa.text("SELECT COUNT(*) FROM requests WHERE state IN ('succeeded', 'failed', 'cancelled')")).scalar_one()
    except sa.exc.DBAPIError:  # no tables yet
        return 0.0
    finally:
        engine.dispose()
    return n / rows if rows else 1.0


# -- the provider (openai-batch) ------------------------------------------------------------


class Server:
    """`lowtide serve --backend echo`, fast clock, its own store; never killed."""

    def __init__(self, folder: Path, extra: tuple[str, ...] = ()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.db = folder / "server.db"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (folder / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [LOWTIDE, "serve", "--backend", "echo", "--port", str(self.port), "--time-scale", "3600",
             "--db", str(self.db), "--data-dir", str(folder / "server-data"), *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60  # a safety net for a server that never comes up
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lowtide serve exited with {self.proc.returncode}; see {folder / 'server.log'}")
            try:
                httpx.get(f"{self.url}/v1/batches", headers={"Authorization": "Bearer x"}, timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("lowtide serve did not start within 60 s") from None
                time.sleep(0.05)

    def options(self, chunk: int) -> dict[str, Any]:
        return {"base_url": f"{self.url}/v1", "api_key_env": KEY_ENV, "max_requests": chunk, "poll_interval": [0.05, 0.2]}

    def batches_by_key(self) -> collections.Counter[str]:
        """Batches the server created, by the dispatch key lowtide attached."""
        engine = sa.create_engine(f"sqlite:///{self.db}")
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT metadata FROM serve_batches WHERE api = 'openai'")).scalars().all()
        finally:
            engine.dispose()
        return collections.Counter((json.loads(m) if m else {}).get("lowtide_key", "") for m in rows)

    def uploads(self) -> int:
        engine = sa.create_engine(f"sqlite:///{self.db}")
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT COUNT(*) FROM serve_files WHERE purpose = 'batch'")).scalar_one()
        finally:
            engine.dispose()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# -- one trial ------------------------------------------------------------------------------


class Launcher:
    """Starts the next `lowtide` process of a trial: `run SPEC`, or `submit SPEC` until it has
    succeeded once and then `worker --until-idle`."""

    def __init__(self, store: ClientStore, spec: Path, command: str, env: dict[str, str], log: Path):
        self.store, self.spec, self.command, self.env = store, spec, command, env
        self.submitted = False
        self.log = log

    def argv(self) -> list[str]:
        base = [LOWTIDE, "--db", self.store.url]
        if self.command == "run":
            return [*base, "run", str(self.spec)]
        if not self.submitted:
            return [*base, "submit", str(self.spec)]
        return [*base, "worker", "--until-idle"]

    def start(self) -> subprocess.Popen:
        with self.log.open("ab") as log:
            return subprocess.Popen(self.argv(), cwd=self.spec.parent, env=self.env, stdout=subprocess.DEVNULL, stderr=log)

    def finished(self, proc: subprocess.Popen) -> bool:
        """After a process exited on its own: is the job's last step done?"""
        if self.command == "worker" and not self.submitted:
            self.submitted = proc.returncode == 0
            return False
        return True


def run_until(proc: subprocess.Popen, store: ClientStore, delay: float, timeout: float) -> tuple[bool, float | None]:
    """Let `proc` run; SIGKILL it `delay` seconds after it opened the store. Returns (killed,
    seconds from opening the store to exiting when it exited first)."""
    started = time.monotonic()
    opened_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if opened_at is None and store.opened_by(proc.pid):
            opened_at = now
        if opened_at is not None and now - opened_at >= delay:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True, None
        if now - started > timeout:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"a lowtide process neither exited nor reached its kill moment in {timeout:g} s")
        time.sleep(WATCH)
    return False, (time.monotonic() - (opened_at or started))


def one_trial(n: int, args: argparse.Namespace, span: float | None, root: Path) -> tuple[Trial, float | None]:
    """Run trial `n` (with `span` None: the calibration run, no kills). Also returns how long
    the first launch took from opening the store to exiting, when it ran the whole job
    unkilled: a fresh sample of the span."""
    t0 = time.monotonic()
    trial = Trial(n)
    folder = root / f"trial-{n:04d}"
    folder.mkdir()
    rng = random.Random(f"{args.seed}-{n}")
    expected = write_source(folder / "tickets.csv", args.rows, n)
    server = Server(folder) if args.route == "openai-batch" else None
    store = ClientStore(folder, args.db)
    measured: float | None = None
    try:
        if server:
            options = server.options(args.chunk)
        else:
            options = {"dispatch_size": rng.choice([500, 2000, 5000])}
        spec = write_spec(folder, args.route, options)
        env = {**os.environ, KEY_ENV: "killtest-key"}
        launcher = Launcher(store, spec, args.command, env, folder / "client.log")
        kills_left = 0 if span is None else args.kills
        while kills_left:
            remaining = max(0.5, 1.0 - terminal_share(store, args.rows))
            delay = rng.uniform(0.0, span * remaining)
            proc = launcher.start()
            trial.launches += 1
            killed, took = run_until(proc, store, delay, args.timeout)
            if not killed and trial.launches == 1 and args.command == "run":
                measured = took  # the whole job, unkilled: the span was drawn too long this time
            if killed:
                trial.kills += 1
                phase = phase_of(store, args.rows, args.route)
                trial.kill_phases[phase] = trial.kill_phases.get(phase, 0) + 1
                kills_left -= 1
            elif proc.returncode != 0:
                trial.crashes += 1
                trial.problems.append(f"launch {trial.launches} exited {proc.returncode} without being killed")
                break
            elif launcher.finished(proc):
                break  # the job ended before this kill's moment came
        # The last process (and, in worker mode, whatever is left of the sequence) runs unkilled.
        while True:
            proc = launcher.start()
            trial.launches += 1
            try:
                _, took = run_until(proc, store, float("inf"), args.timeout)
            except TimeoutError as err:
                trial.problems.append(str(err))
                trial.not_converged = 1
                break
            if span is None:
                measured = (measured or 0.0) + (took or 0.0)
            if proc.returncode != 0:
                trial.crashes += 1
                trial.problems.append(f"the unkilled launch {trial.launches} exited {proc.returncode}")
                trial.not_converged = 1
                break
            if launcher.finished(proc):
                break
        if args.command == "worker" and not trial.not_converged:  # `run` writes the output file itself
            subprocess.run([LOWTIDE, "--db", store.url, "results", JOB, "--out", str(folder / "results.csv")],
                           env=env, capture_output=True, timeout=args.timeout, check=True)  # fmt: skip
        check(trial, store, folder, expected, server)
    except Exception as err:  # a broken trial is a failed trial, not a crashed harness
        trial.problems.append(f"harness: {type(err).__name__}: {err}")
        trial.not_converged = 1
    finally:
        if server:
            server.stop()
        store.drop()
    trial.wall = time.monotonic() - t0
    return trial, measured


def check(trial: Trial, store: ClientStore, folder: Path, expected: dict[str, str], server: Server | None) -> None:
    engine = store.engine()
    try:
        with engine.connect() as conn:
            job = conn.execute(sa.text("SELECT id, state FROM jobs WHERE name = :n"), {"n": JOB}).one()
            rows = conn.execute(
                sa.text("SELECT id, source_key, state, output FROM requests WHERE job_id = :j"), {"j": job.id}
            ).all()
            applied = dict(
                conn.execute(
                    sa.text("SELECT request_id, COUNT(*) FROM attempts WHERE applied AND ok AND job_id = :j GROUP BY request_id"),
                    {"j": job.id},
                ).all()
            )
            after = conn.execute(
                sa.text(
                    "SELECT COUNT(*) FROM attempts a JOIN attempts s ON s.request_id = a.request_id "
                    "AND s.applied AND s.ok WHERE a.id > s.id AND a.job_id = :j"
                ),
                {"j": job.id},
            ).scalar_one()
            keys = set(conn.execute(sa.text("SELECT key FROM dispatches WHERE job_id = :j AND kind = 'batch'"), {"j": job.id}).scalars())
            provider_ids = conn.execute(
                sa.text("SELECT provider_id FROM dispatches WHERE job_id = :j AND provider_id IS NOT NULL"), {"j": job.id}
            ).scalars().all()
    finally:
        engine.dispose()

    by_key = collections.Counter(r.source_key for r in rows)
    lost = set(expected) - set(by_key)
    not_terminal = [r for r in rows if r.state not in ("succeeded", "failed", "cancelled")]
    # Requests still in flight are the job not converging, not losses; ended ones that did not
    # succeed are losses (no fault is injected).
    unsucceeded = [r for r in rows if r.state in ("failed", "cancelled")]
    trial.lost = len(lost) + len(unsucceeded)
    if lost:
        trial.problems.append(f"{len(lost)} source row(s) with no request, e.g. {sorted(lost)[:3]}")
    if unsucceeded:
        states = collections.Counter(r.state for r in unsucceeded)
        trial.problems.append(f"requests that did not succeed: {dict(states)}")
    if not_terminal or job.state != "finished":
        trial.not_converged = 1
        trial.problems.append(f"job state {job.state}, {len(not_terminal)} request(s) not terminal")

    dup = [r for r in rows if r.state == "succeeded" and applied.get(r.id, 0) != 1]
    dup_keys = [k for k, c in by_key.items() if c > 1]
    wrong = [r for r in rows if r.state == "succeeded" and r.output != expected.get(r.source_key)]
    # The output file is written at the end of a run: only a finished job has one to check.
    out_problems = _check_output(folder / "results.csv", expected) if job.state == "finished" else 0
    trial.duplicated = len(dup) + len(dup_keys) + after + len(wrong) + out_problems
    if dup:
        trial.problems.append(f"{len(dup)} succeeded request(s) without exactly one applied success")
    if dup_keys:
        trial.problems.append(f"{len(dup_keys)} source row(s) with more than one request")
    if after:
        trial.problems.append(f"{after} attempt(s) made after the request's applied success")
    if wrong:
        trial.problems.append(f"{len(wrong)} answer(s) other than echo's, e.g. {wrong[0].source_key}")
    if out_problems:
        trial.problems.append(f"{out_problems} output row(s) missing or repeated in results.csv")

    if server is not None:
        created = server.batches_by_key()
        trial.provider_batches = sum(created.values())
        extra = sum(c - 1 for c in created.values() if c > 1)
        orphans = sum(c for k, c in created.items() if k not in keys)
        trial.double_submitted = extra + orphans + (len(provider_ids) - len(set(provider_ids)))
        if extra:
            trial.problems.append(f"{extra} provider batch(es) beyond the first for one dispatch key")
        if orphans:
            trial.problems.append(f"{orphans} provider batch(es) whose key no dispatch holds")
        trial.orphan_uploads = max(0, server.uploads() - trial.provider_batches)


def _check_output(path: Path, expected: dict[str, str]) -> int:
    if not path.exists():
        return len(expected)
    with path.open(encoding="utf-8", newline="") as f:
        ids = collections.Counter(r["ticket_id"] for r in csv.DictReader(f))
    return len(set(expected) - set(ids)) + sum(c - 1 for c in ids.values() if c > 1) + len(set(ids) - set(expected))


# -- all trials -----------------------------------------------------------------------------


def run_trials(args: argparse.Namespace, echo=print) -> Summary:
    """The calibration run, then `args.trials` trials; see the module's docstring."""
    summary = Summary(args.route, args.command, args.rows, args.seed)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="lowtide-killtest-"))
    try:
        calibration, span = one_trial(-1, args, None, root)
        if not calibration.ok or span is None:
            summary.trials.append(calibration)
            echo(f"calibration run failed: {calibration.problems}")
            return summary
        summary.span = span
        echo(f"calibration: {args.rows} rows on {args.route} take {span:.2f} s after the store is open")
        # The span follows the machine: a whole unkilled first launch is a new sample, and the
        # median of all samples is used (a busy machine during calibration would otherwise
        # draw most kill moments after the job had already ended).
        samples = [span]
        for n in range(args.trials):
            trial, sample = one_trial(n, args, statistics.median(samples), root)
            if sample:
                samples.append(sample)
            summary.trials.append(trial)
            mark = "ok" if trial.ok else "FAIL " + "; ".join(trial.problems)
            echo(f"trial {n + 1:4d}/{args.trials}: {trial.kills} kill(s), {trial.launches} launch(es), {trial.wall:5.1f} s  {mark}")
            if trial.ok and not args.keep:
                shutil.rmtree(root / f"trial-{n:04d}", ignore_errors=True)
            if args.json:  # after every trial: a long run stopped early still leaves its figures
                summary.wall = time.monotonic() - t0
                args.json.write_text(json.dumps(summary.to_json(), indent=2), encoding="utf-8")
    finally:
        summary.wall = time.monotonic() - t0
        if args.keep or not summary.ok:
            echo(f"trial folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return summary


def table(summary: Summary) -> str:
    head = ["route", "trials", "kills", "lost", "duplicated", "double-submitted", "not converged", "crashes", "wall time"]
    row = [
        f"{summary.route} ({summary.command})", str(len(summary.trials)), str(summary.total("kills")), str(summary.total("lost")),
        str(summary.total("duplicated")), str(summary.total("double_submitted")) if summary.route != "echo" else "n/a",
        str(summary.total("not_converged")), str(summary.total("crashes")), f"{summary.wall / 60:.1f} min",
    ]  # fmt: skip
    return markdown_table(head, row)


def markdown_table(head: list[str], row: list[str]) -> str:
    """One header and one row as a Markdown table, columns padded to line up."""
    widths = [max(len(h), len(c)) for h, c in zip(head, row, strict=True)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", line(row)])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--route", choices=["echo", "openai-batch"], default="echo")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--rows", type=int, default=10_000, help="source rows per trial (default 10,000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs per trial before the last, unkilled run (default 3)")
    p.add_argument("--chunk", type=int, default=500, help="openai-batch: requests per provider batch (max_requests)")
    p.add_argument("--command", choices=["run", "worker"], default="run", help="`lowtide run`, or `submit` then `worker --until-idle`")
    p.add_argument("--db", help="a PostgreSQL URL: each trial gets a fresh schema in it (default: a SQLite file per trial)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one process may run (a safety net, not a limit)")
    p.add_argument("--json", type=Path, help="also write the figures here as JSON")
    p.add_argument("--keep", action="store_true", help="keep every trial's folder")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    summary = run_trials(args)
    print()
    print(table(summary))
    print("\nwhere the kills landed: " + ", ".join(f"{k}: {v}" for k, v in summary.kill_phases().items()))
    if args.json:
        args.json.write_text(json.dumps(summary.to_json(), indent=2), encoding="utf-8")
    if not summary.ok:
        print("\nFAILED: some figure is not 0", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
