"""How fast `lowtide serve` works through OpenAI batch files on its echo backend.

    .venv/bin/python bench/serve_echo.py                     # 100,000 lines in batches of 50,000
    .venv/bin/python bench/serve_echo.py --n 20000 --per-batch 20000
    .venv/bin/python bench/serve_echo.py --src /tmp/wt-base/src --src src --rounds 2   # before/after, interleaved

The client (the official `openai` SDK at its defaults) uploads N chat-completion lines as
files of at most `--per-batch` lines (OpenAI's limit is 50,000), creates one batch per file
at once, polls until every batch has ended, and downloads the output files (each line is
checked to be a success). Serve's time to work through them is measured from the first
create to the last batch's end: lines/s is N over that. Printed per run: that wall and
lines/s, serve's CPU seconds for the work (its start-up apart) and its peak RSS (VmHWM),
which shows whether a file is streamed or held whole.

`--src DIR` (repeatable) runs serve with `PYTHONPATH=DIR`: give a git worktree's `src` for
"before"; runs alternate between the sources for `--rounds` rounds, so a busy machine
weighs on both alike. Each run uses its own temporary folder, removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

MODEL = "gpt-4o-mini"
POLL = 0.2  # seconds between a client's looks at each batch (lowtide's route in bench/batch.py: 0.2–0.5)
WORDS = ["invoice", "refund", "password", "login", "shipping", "parcel", "broken", "screen", "charge", "twice", "account", "locked"]  # fmt: skip


def write_inputs(folder: Path, n: int, per_batch: int) -> list[Path]:
    """N chat lines as a client renders them, split into files of `per_batch` lines."""
    paths = []
    for start in range(0, n, per_batch):
        path = folder / f"input-{start // per_batch}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i in range(start, min(n, start + per_batch)):
                text = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(12))
                body = {"model": MODEL, "max_tokens": 64, "messages": [
                    {"role": "system", "content": "Classify the ticket."},
                    {"role": "user", "content": f"Channel: email\nCustomer {i} writes: {text}."}]}  # fmt: skip
                line = {"custom_id": f"t{i:07d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                f.write(json.dumps(line) + "\n")
        paths.append(path)
    return paths


def start_serve(tmp: Path, src: str | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    proc = subprocess.Popen(
        [sys.executable, "-c", "from lowtide._entry import main; main()", "serve", "--backend", "echo",
         "--port", str(port), "--time-scale", "100", "--db", str(tmp / "server.db"), "--data-dir", str(tmp / "data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            httpx.get(f"{url}/v1/batches", timeout=5)
            return proc, url
        except (OSError, httpx.TransportError):
            if proc.poll() is not None:
                raise SystemExit(f"lowtide serve exited with {proc.returncode}") from None
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("lowtide serve did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process (and its threads) used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_run(n: int, per_batch: int, src: str | None) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-serve-"))
    server, url = start_serve(tmp, src)
    try:
        inputs = write_inputs(tmp, n, per_batch)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="bench")
        t = time.perf_counter()
        files = [client.files.create(file=p.open("rb"), purpose="batch") for p in inputs]
        upload = time.perf_counter() - t
        rss_before = peak_rss_mb(server.pid)
        cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
        batches = [client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
                   for f in files]  # fmt: skip
        ended: dict[str, object] = {}
        while len(ended) < len(batches):
            for b in batches:
                if b.id not in ended:
                    got = client.batches.retrieve(b.id)
                    if got.status in ("completed", "failed", "expired", "cancelled"):
                        ended[b.id] = got
            time.sleep(POLL)
        wall, cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
        ok = 0
        for b in ended.values():
            assert b.status == "completed", (b.status, b.errors)
            for line in client.files.content(b.output_file_id).iter_lines():
                if line:
                    ok += json.loads(line)["response"]["status_code"] == 200
        assert ok == n, f"{ok} of {n} lines succeeded"
        return {"upload": upload, "wall": wall, "cpu": cpu, "rss_upload": rss_before, "rss": peak_rss_mb(server.pid)}
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="lines in all")
    parser.add_argument("--per-batch", type=int, default=50_000, help="lines per batch file (OpenAI: at most 50,000)")
    parser.add_argument("--src", action="append", help="run serve from this source folder (repeatable: runs alternate)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    sources = args.src or [None]
    print(f"lowtide serve --backend echo: {args.n:,} lines in batches of {args.per_batch:,} (on {os.cpu_count()} CPUs)")
    print(f"  {'serve from':<28} {'upload':>8} {'create→end':>11} {'lines/s':>9} {'serve CPU':>10} {'peak RSS':>9}")
    for _ in range(args.rounds):
        for src in sources:
            r = one_run(args.n, args.per_batch, src)
            print(f"  {src or 'installed':<28} {r['upload']:7.2f}s {r['wall']:10.2f}s {args.n / r['wall']:9,.0f} "
                  f"{r['cpu']:9.2f}s {r['rss']:6.0f} MB  (after upload {r['rss_upload']:.0f} MB)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
