"""N requests through `openai-batch` against `lowtide serve`, by K workers on one PostgreSQL,
against one worker on SQLite.

    .venv/bin/python bench/scale.py                          # 1,000,000 requests, 2 PostgreSQL workers, then SQLite
    .venv/bin/python bench/scale.py --n 100000 --workers 3
    .venv/bin/python bench/scale.py --n 100000 --workers 3 --kill-every 5 --stores postgres
    .venv/bin/python bench/scale.py --n 10000000 --stores postgres
    .venv/bin/python bench/scale.py --n 1000000 --stores postgres --time-scale 60   # no batch expires queued

For each store: `lowtide submit` renders and stores the job (a CSV of N tickets, the
pipeline bench's), then K `lowtide worker --until-idle` processes (one on SQLite) claim its
chunks, submit them to `lowtide serve --backend echo` (fast clock), poll, download and ingest,
until every request has ended; `lowtide results` exports the CSV. Every process is a real
`lowtide` command; its CPU and peak RSS come from the kernel when it exits (`wait4`).

`--kill-every S` ends a random worker's PostgreSQL connection every S seconds
(`pg_terminate_backend`, found by the `application_name` this bench gives the workers'
URL); a worker that exits is started again, and its claims are taken over after their lease.

Prints, per store: wall and requests/s per phase and end to end; chunks claimed and requests
claimed per second of the workers' phase; CPU per request of the submitting process, the
workers together and serve; each worker's peak RSS; the store's bytes per request, before and
after `lowtide prune` of the finished job; requests retried after a failed attempt, by the
failure (an expired batch: serve's fast clock gives a batch 24 s of real time); and
duplicates, which must be 0: one dispatch's answer applied twice to a request, or two
succeeded answers (the store's attempts), dispatch keys that reached serve twice (serve's batches). A
PostgreSQL store is a fresh schema, dropped at the end; everything else lives in a temporary
folder, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from killtest import KEY_ENV, LOWTIDE, ClientStore, Server  # noqa: E402
from pipeline import make_source  # noqa: E402

PG_BASE = "postgresql://postgres@127.0.0.1:5432/test"
APP_NAME = "lowtide-scale"


@dataclass
class Process:
    """A finished `lowtide` process: its wall, CPU and peak RSS."""

    argv: list[str]
    wall: float
    cpu: float
    rss_mb: float
    code: int


def run(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> Process:
    t = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return reap(proc, argv, t)


def reap(proc: subprocess.Popen, argv: list[str], started: float) -> Process:
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Process(argv, time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode)


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Result:
    store: str
    workers: int
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds
    submit: Process | None = None
    worker_runs: list[Process] = field(default_factory=list)
    serve_cpu: float = 0.0
    serve_rss_mb: float = 0.0
    chunks: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    pruned: int = 0  # `lowtide prune`'s exit code
    applied_twice: int = 0
    retried: int = 0  # requests with more than one applied attempt (a failure, then another try)
    failed_attempts: dict = field(default_factory=dict)  # error code -> applied failed attempts
    sent_twice: int = 0
    kills: int = 0
    restarts: int = 0


class Crew:
    """K `worker --until-idle` processes; one that exits before the job is done is started again."""

    def __init__(self, argv: list[str], k: int, cwd: Path, env: dict[str, str], log: Path, result: Result):
        self.argv, self.k, self.cwd, self.env, self.log, self.result = argv, k, cwd, env, log, result

    def start(self) -> tuple[subprocess.Popen, float]:
        with self.log.open("ab") as out:
            return subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT), time.perf_counter()

    def run(self, done) -> None:
        running = [self.start() for _ in range(self.k)]
        while running:
            proc, started = running.pop(0)
            ended = reap(proc, self.argv, started)
            self.result.worker_runs.append(ended)
            if ended.code != 0 and not done():  # killed by a cut connection: take its place
                self.result.restarts += 1
                running.append(self.start())


def store_bytes(store: ClientStore) -> int:
    if store.sqlite_path is not None:
        return sum(p.stat().st_size for p in store.sqlite_path.parent.glob(store.sqlite_path.name + "*"))
    engine = store.engine()
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :s AND c.relkind IN ('r', 'm')"
            ), {"s": store.schema}).scalar_one())  # fmt: skip
    finally:
        engine.dispose()


def all_ended(store: ClientStore, n: int) -> bool:
    engine = store.engine()
    try:
        with engine.connect() as conn:
            ended = conn.execute(sa.text("SELECT COUNT(*) FROM requests WHERE state IN ('succeeded', 'failed', 'cancelled')")).scalar_one()
    except sa.exc.DBAPIError:
        return False
    finally:
        engine.dispose()
    return ended == n


def killer(store: ClientStore, every: float, stop: threading.Event, result: Result, seed: int) -> None:
    """Every `every` seconds, end one worker connection of this run (PostgreSQL only)."""
    rng = random.Random(seed)
    admin = sa.create_engine(PG_BASE.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    try:
        while not stop.wait(every):
            with admin.connect() as conn:
                pids = conn.execute(sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :a"),
                                    {"a": f"{APP_NAME}-{store.schema}"}).scalars().all()  # fmt: skip
                if pids:
                    conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": rng.choice(pids)})
                    result.kills += 1
    finally:
        admin.dispose()


def one_store(kind: str, args: argparse.Namespace, root: Path) -> Result:
    folder = root / kind
    folder.mkdir()
    result = Result(kind, args.workers if kind == "postgres" else 1)
    source = folder / "tickets.csv"
    make_source(source, args.n)
    server = Server(folder, ("--time-scale", str(args.time_scale)))  # the last --time-scale given wins
    store = ClientStore(folder, PG_BASE if kind == "postgres" else None)
    url = store.url if kind == "sqlite" else f"{store.url}&application_name={APP_NAME}-{store.schema}"
    env = dict(os.environ) | {KEY_ENV: "sk-scale"}
    log = folder / "lowtide.log"
    try:
        spec = {"name": "scale", "source": {"path": str(source), "id_column": "ticket_id"},
                "template": {"system": "Classify the ticket.", "user": "Channel: {{ channel }}\n{{ body }}"},
                "model": "gpt-4o-mini", "route": "openai-batch", "route_options": server.options(args.chunk),
                "choices": ["billing", "technical", "account", "shipping", "feedback"]}  # fmt: skip
        (folder / "job.yaml").write_text(yaml.safe_dump(spec))
        base = [LOWTIDE, "--db", url]
        t0 = time.perf_counter()
        result.submit = run([*base, "submit", "job.yaml"], folder, env, log)
        if result.submit.code != 0:
            raise SystemExit(f"{kind}: lowtide submit exited {result.submit.code}; see {log}")
        result.phases["submit (render + persist)"] = result.submit.wall

        stop = threading.Event()
        kill_thread = None
        if args.kill_every and kind == "postgres":
            kill_thread = threading.Thread(target=killer, args=(store, args.kill_every, stop, result, args.seed), daemon=True)
            kill_thread.start()
        t = time.perf_counter()
        Crew([*base, "worker", "--until-idle"], result.workers, folder, env, log, result).run(lambda: all_ended(store, args.n))
        stop.set()
        if kill_thread is not None:
            kill_thread.join()
        result.phases["workers (claim, submit, poll, ingest)"] = time.perf_counter() - t
        if not all_ended(store, args.n):
            raise SystemExit(f"{kind}: the workers stopped with requests not ended; see {log}")

        exported = run([*base, "results", "scale", "--out", str(folder / "results.csv")], folder, env, log)
        if exported.code:
            raise SystemExit(f"{kind}: `lowtide results` exited {exported.code}; see {log}")
        result.phases["export (CSV)"] = exported.wall
        result.phases["end to end"] = time.perf_counter() - t0
        result.serve_cpu, result.serve_rss_mb = proc_cpu(server.proc.pid), proc_peak_mb(server.proc.pid)

        engine = store.engine()
        with engine.connect() as conn:
            result.chunks = conn.execute(sa.text("SELECT COUNT(*) FROM dispatches WHERE kind = 'batch'")).scalar_one()
            # A duplicate: one dispatch's answer applied twice to a request, or two answers that
            # succeeded. A request retried after a failed attempt (an expired batch) is no duplicate.
            result.applied_twice = conn.execute(sa.text(
                "SELECT COUNT(*) FROM (SELECT request_id FROM attempts WHERE applied GROUP BY request_id, dispatch_id HAVING COUNT(*) > 1"
                " UNION SELECT request_id FROM attempts WHERE applied AND ok GROUP BY request_id HAVING COUNT(*) > 1) t"
            )).scalar_one()
            result.retried = conn.execute(sa.text(
                "SELECT COUNT(*) FROM (SELECT request_id FROM attempts WHERE applied GROUP BY request_id HAVING COUNT(*) > 1) t"
            )).scalar_one()
            result.failed_attempts = dict(conn.execute(sa.text(
                "SELECT error_code, COUNT(*) FROM attempts WHERE applied AND NOT ok GROUP BY error_code ORDER BY 2 DESC"
            )).all())  # fmt: skip
        engine.dispose()
        result.sent_twice = sum(c - 1 for c in server.batches_by_key().values() if c > 1)
        result.bytes_before = store_bytes(store)
        result.pruned = run([*base, "prune", "--older-than", "1s", "--keep-results", "--vacuum", "--yes"], folder, env, log).code
        result.bytes_after = store_bytes(store)
        return result
    finally:
        server.stop()
        store.drop()


def show(r: Result, n: int) -> None:
    print(f"\n{r.store}: {n:,} requests on openai-batch against lowtide serve, {r.workers} worker(s)"
          + (f", {r.kills} connections cut, {r.restarts} workers restarted" if r.kills else ""))  # fmt: skip
    for phase, wall in r.phases.items():
        print(f"  {phase:<40} {wall:8.1f}s {n / wall:>10,.0f} req/s")
    workers_wall = r.phases["workers (claim, submit, poll, ingest)"]
    print(f"  claims: {r.chunks:,} chunks, {n / workers_wall:,.0f} requests claimed (and ended) per second of the workers' phase")
    worker_cpu = sum(p.cpu for p in r.worker_runs)
    print(f"  CPU per request: submit {r.submit.cpu / n * 1e6:.0f} µs, workers {worker_cpu / n * 1e6:.0f} µs "
          f"({', '.join(f'{p.cpu:.1f}s' for p in r.worker_runs)}), serve {r.serve_cpu / n * 1e6:.0f} µs")  # fmt: skip
    print(f"  peak RSS: submit {r.submit.rss_mb:.0f} MB, workers {', '.join(f'{p.rss_mb:.0f}' for p in r.worker_runs)} MB, serve {r.serve_rss_mb:.0f} MB")
    reuse = " (PostgreSQL's VACUUM keeps the files' size: the space freed is reused by later rows)" if r.store == "postgres" else ""
    prune = "`lowtide prune --keep-results --vacuum`"
    after = f"{r.bytes_after / n:,.0f} after {prune}{reuse}" if not r.pruned else f"no figure after {prune}: it FAILED (exit {r.pruned}; see its log)"
    print(f"  store: {r.bytes_before / n:,.0f} bytes per request, {after}")
    failures = ", ".join(f"{code} {n:,}" for code, n in r.failed_attempts.items()) or "none"
    print(f"  retried: {r.retried:,} requests sent again after a failed attempt (failed attempts: {failures})")
    print(f"  duplicates: {r.applied_twice} requests applied twice, {r.sent_twice} chunks sent to serve twice")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2, help="worker processes on PostgreSQL (SQLite: always one)")
    parser.add_argument("--chunk", type=int, default=50_000, help="requests per provider batch (OpenAI's limit)")
    parser.add_argument("--stores", choices=["both", "postgres", "sqlite"], default="both")
    parser.add_argument("--kill-every", type=float, default=0.0, help="cut a worker's PostgreSQL connection every S seconds")
    parser.add_argument("--time-scale", type=float, default=3600.0,
                        help="serve's clock speed (3600: a batch's 24 h are 24 s; past ~300,000 requests later chunks "
                             "expire queued and are sent again: 60 keeps them)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lowtide-scale-"))
    results: list[Result] = []
    try:
        for kind in ("postgres", "sqlite"):
            if args.stores in ("both", kind):
                results.append(one_store(kind, args, root))
                show(results[-1], args.n)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    by = {r.store: r for r in results}
    if len(by) == 2:
        pg, lite = by["postgres"].phases["end to end"], by["sqlite"].phases["end to end"]
        print(f"\nPostgreSQL ({by['postgres'].workers} workers) / SQLite (1 worker) throughput: {lite / pg:.2f}x")
    bad = [r.store for r in results if r.applied_twice or r.sent_twice]
    if bad:
        raise SystemExit(f"duplicates on {', '.join(bad)}")
    unpruned = [r.store for r in results if r.pruned]
    if unpruned:
        raise SystemExit(f"`lowtide prune` failed on {', '.join(unpruned)}")


if __name__ == "__main__":
    main()
