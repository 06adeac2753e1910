"""The providers' maximum sizes through `lowtide serve`, with each process's peak memory:
a 2 GB Gemini batch input, a 200 MB OpenAI batch input of 50,000 lines (its limits), and an
800 MB embeddings result (50,000 vectors of 3,072 floats). Target (issue 32): peak RSS
≤ 300 MB on the client and on serve, whatever the size.

    .venv/bin/python bench/maxsize.py                      # the three cases, full size
    .venv/bin/python bench/maxsize.py --case openai-input  # one of them
    .venv/bin/python bench/maxsize.py --scale 0.1          # a quick run: a tenth of the rows
    .venv/bin/python bench/maxsize.py --src /tmp/wt/src --src src --case embeddings-result   # before/after, interleaved

Each case is one job of 50,000 rows (× `--scale`) sent as one batch: `lowtide submit`
renders and stores it, `lowtide worker --until-idle` writes the batch file, uploads it
(OpenAI's multipart upload; Gemini's resumable one), polls, downloads the output and
ingests it, against `lowtide serve --backend echo` (real clock: a 24 h window does not end mid-batch), which takes the upload,
runs every line and writes the output file. Every process is fresh per case. A process's
peak RSS is its `VmHWM` (/proc/<pid>/status), read while it runs and, for the client's
commands, the kernel's figure at exit (`wait4`'s ru_maxrss, the same high-water mark);
serve's is read before it is stopped.

| case | route | a line | what is big |
|---|---|---|---|
| gemini-input | gemini-batch (file mode) | ~40 KB of prompt | the input file: 2.0 GB |
| openai-input | openai-batch | ~4 KB of prompt | the input file: 200 MB at 50,000 lines |
| embeddings-result | openai-batch, /v1/embeddings | one 3,072-dim vector (base64 float32, as the SDKs ask) | the output file: ~820 MB |

Echo answers a chat line with its prompt cut to 4 × max_tokens characters (16 tokens
here), so the inputs' outputs are small; an embeddings line's answer is its vector.
Everything lives in a temporary folder that is removed at the end; the free disk is
checked first (each case needs about six times its big file: the source, the client's
store, the upload's spool, serve's copy and serve's store), and a run that would not fit
is refused before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

LOWTIDE = [sys.executable, "-c", "from lowtide._entry import main; main()"]
KEY_ENV = "LOWTIDE_MAXSIZE_KEY"
TARGET_MB = 300
ROWS = 50_000
WORDS = ["invoice", "refund", "password", "login", "shipping", "parcel", "broken", "screen", "charge", "twice", "account",
         "locked", "order", "delivery", "late", "missing", "address", "update", "billing", "cycle", "plan", "upgrade"]  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    route: str
    model: str
    row_chars: int  # characters of text per source row
    big: str  # which file is big: the input, or the output
    big_bytes: int  # its size at scale 1 (what the text is sized for)
    endpoint: str | None = None
    params: dict = field(default_factory=dict)


CASES = {
    c.name: c
    for c in (
        Case("gemini-input", "gemini-batch", "gemini-2.5-flash", 40_000, "input", 2_000_000_000, params={"max_tokens": 16}),
        Case("openai-input", "openai-batch", "gpt-4o-mini", 3_850, "input", 200_000_000, params={"max_tokens": 16}),
        Case("embeddings-result", "openai-batch", "text-embedding-3-large", 200, "output", 820_000_000, endpoint="embeddings",
             params={"dimensions": 3072, "encoding_format": "base64"}),
    )
}
DISK_FACTOR = 6  # the big file's copies on disk at once (see the module's docstring), with room to spare


def make_source(path: Path, rows: int, chars: int) -> None:
    """A JSONL source of `rows` rows of about `chars` characters each, every row different."""
    block = " ".join(WORDS[(i * 7 + i // len(WORDS)) % len(WORDS)] for i in range(200_000))
    span = len(block) - chars - 1
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            start = (i * 7919) % span
            f.write(json.dumps({"id": f"r{i:06d}", "body": f"Row {i}: {block[start:start + chars]}"}) + "\n")


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def peak_of(pid: int) -> float:
    """VmHWM of a live process, in MB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Ran:
    """One finished process: wall, CPU, peak RSS."""

    name: str
    wall: float
    cpu: float
    rss_mb: float
    code: int = 0


def rss_of(pid: int) -> float:
    """VmRSS of a live process, in MB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(name: str, argv: list[str], cwd: Path, env: dict[str, str], log: Path, watch: Serve | None = None) -> Ran:
    """Run a `lowtide` command to its end, sampling its VmHWM while it runs; with `watch`,
    print both processes' RSS and serve's batch each second (where a peak comes from)."""
    t = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    seen = [0.0]
    done = threading.Event()

    def sample() -> None:
        tick = 0
        while not done.wait(0.2):
            seen[0] = max(seen[0], peak_of(proc.pid))
            tick += 1
            if watch is not None and tick % 5 == 0:
                print(f"    {time.perf_counter() - t:6.1f} s  {name}: RSS {rss_of(proc.pid):5.0f} MB   serve: RSS "
                      f"{rss_of(watch.proc.pid):5.0f} MB, batch {watch.batch()}", flush=True)  # fmt: skip

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Ran(name, time.perf_counter() - t, usage.ru_utime + usage.ru_stime, max(seen[0], usage.ru_maxrss / 1024), proc.returncode)


class Serve:
    """`lowtide serve --backend echo`, fast clock, taking files up to 2 GiB."""

    def __init__(self, folder: Path, env: dict[str, str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.db = folder / "serve.db"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (folder / "serve.log").open("wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [*LOWTIDE, "serve", "--backend", "echo", "--port", str(self.port), "--time-scale", "1",
             "--max-file-size", "2GB", "--db", str(self.db), "--data-dir", str(folder / "serve-data")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=folder,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"lowtide serve exited with {self.proc.returncode}; see {folder / 'serve.log'}")
            try:
                httpx.get(f"{self.url}/v1/batches", headers={"Authorization": "Bearer x"}, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise SystemExit("lowtide serve did not start within 120 s") from None
                time.sleep(0.05)
        self.start_rss = peak_of(self.proc.pid)

    def batch(self) -> str:
        """The status of serve's batch so far (where it is in its work)."""
        try:
            with sqlite3.connect(self.db, timeout=0.1) as conn:
                got = conn.execute("SELECT status FROM serve_batches ORDER BY created_at DESC LIMIT 1").fetchone()
        except sqlite3.Error:
            return "?"
        return got[0] if got else "-"

    def files(self) -> list[tuple[str, int]]:
        """(purpose, bytes) of every file serve holds: the upload and the outputs."""
        with sqlite3.connect(self.db) as conn:
            return conn.execute("SELECT purpose, bytes FROM serve_files ORDER BY created_at").fetchall()

    def stop(self) -> Ran:
        ran = Ran("lowtide serve", time.perf_counter() - self.started, cpu_of(self.proc.pid), peak_of(self.proc.pid))
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return ran


def spec_of(case: Case, rows: int, serve: Serve) -> dict:
    base = serve.url if case.route == "gemini-batch" else f"{serve.url}/v1"
    spec = {
        "name": "maxsize", "source": {"path": "rows.jsonl", "id_column": "id"},
        "template": {"user": "{{ body }}"}, "model": case.model, "route": case.route, "params": case.params,
        "chunk_size": rows, "packing": False,
        "route_options": {"base_url": base, "api_key_env": KEY_ENV, "poll_interval": [0.2, 1.0], "max_requests": rows},
    }  # fmt: skip
    if case.endpoint:
        spec["endpoint"] = case.endpoint
    else:
        del spec["packing"]  # a chat job has nothing to pack
    return spec


def states(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT state, COUNT(*) FROM requests GROUP BY state").fetchall())


def one_case(case: Case, scale: float, src: str | None, root: Path, watch: bool = False) -> dict:
    rows = max(1, round(ROWS * scale))
    folder = Path(tempfile.mkdtemp(prefix=f"maxsize-{case.name}-", dir=root))
    env = dict(os.environ) | {KEY_ENV: "sk-maxsize"}
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    log = folder / "lowtide.log"
    serve = None
    try:
        make_source(folder / "rows.jsonl", rows, case.row_chars)
        serve = Serve(folder, env)
        (folder / "job.yaml").write_text(yaml.safe_dump(spec_of(case, rows, serve)))
        db = folder / "client.db"
        base = [*LOWTIDE, "--db", str(db)]
        ran = [run("lowtide submit", [*base, "submit", "job.yaml"], folder, env, log)]
        if ran[0].code == 0:
            ran.append(run("lowtide worker", [*base, "worker", "--until-idle"], folder, env, log, serve if watch else None))
        files = serve.files()
        ran.append(serve.stop())
        serve = None
        failed = [r for r in ran if r.code != 0]
        if failed:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{case.name}: {failed[0].name} exited {failed[0].code}:\n{tail}")
        counts = states(db)
        if counts != {"succeeded": rows}:  # what went wrong, before the folder goes
            for name in ("lowtide.log", "serve.log"):
                print(f"--- {case.name}: the end of {name}\n{(folder / name).read_text(errors='replace')[-4000:]}", flush=True)
        return {"case": case, "rows": rows, "ran": ran, "files": files, "counts": counts, "src": src}
    finally:
        if serve is not None:
            serve.stop()
        shutil.rmtree(folder, ignore_errors=True)


def report(r: dict) -> list[str]:
    case, rows = r["case"], r["rows"]
    ok = r["counts"] == {"succeeded": rows}
    inputs = sum(b for p, b in r["files"] if p in ("batch", "gemini_input"))
    outputs = sum(b for p, b in r["files"] if p not in ("batch", "gemini_input"))
    lines = [f"{case.name} ({case.route}{', ' + r['src'] if r['src'] else ''}): {rows:,} lines, input file "
             f"{inputs / 1e6:,.1f} MB, output {outputs / 1e6:,.1f} MB; requests {r['counts']}"]  # fmt: skip
    worst = 0.0
    for p in r["ran"]:
        worst = max(worst, p.rss_mb)
        lines.append(f"  {p.name:<16} wall {p.wall:8.1f} s   CPU {p.cpu:8.1f} s   peak RSS {p.rss_mb:6.0f} MB")
    verdict = "PASS" if ok and worst <= TARGET_MB else "FAIL"
    why = "" if ok else " (not every request succeeded)"
    lines.append(f"  verdict: {verdict}: highest peak RSS {worst:.0f} MB (target ≤ {TARGET_MB} MB){why}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="run this case only (repeatable)")
    parser.add_argument("--scale", type=float, default=1.0, help="a share of the 50,000 rows (0.1: a quick run)")
    parser.add_argument("--src", action="append", help="run every lowtide process from this source folder (repeatable: runs alternate)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--watch", action="store_true", help="print serve's and the worker's RSS each second")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the temporary folders go")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error("--scale must be above 0 and at most 1 (the providers' limits)")
    cases = [CASES[n] for n in (args.case or CASES)]
    root = Path(args.tmp)
    need = max(c.big_bytes for c in cases) * args.scale * DISK_FACTOR
    have = free_bytes(root)
    if have < need:
        print(f"maxsize: {root} has {have / 1e9:.1f} GB free; the largest case needs about {need / 1e9:.1f} GB "
              f"({DISK_FACTOR} × its {max(c.big_bytes for c in cases) * args.scale / 1e9:.2f} GB file). Free some space, "
              "point --tmp at a bigger disk, or run a smaller --scale or --case.", file=sys.stderr)  # fmt: skip
        return 2
    print(f"maxsize: scale {args.scale}, {len(cases)} case(s), {os.cpu_count()} CPUs, {have / 1e9:.0f} GB free in {root}", flush=True)
    verdicts = []
    for _ in range(args.rounds):
        for case in cases:
            for src in args.src or [None]:
                lines = report(one_case(case, args.scale, src, root, args.watch))
                verdicts.append(lines[-1].split(":")[1].strip())
                print("\n".join(lines), flush=True)
    return 0 if all(v == "PASS" for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
