"""How much memory `lowtide serve` takes while a big message batch streams in: starts the
real command, sends one small message batch (what is read once per process is read then),
then one chunked `POST /v1/messages/batches` of SIZE, and reports the server's resident
memory before the big one and at its peak (VmRSS, VmHWM from /proc).

    python -m tests.server.rss_probe --size 400MB --prompt-kb 8   # over the 256 MB limit: 413
    python -m tests.server.rss_probe --size 200MB       # a valid batch of ~95,000 requests

Used by test_body_memory.py with smaller sizes; run it by hand for the big figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOWTIDE = Path(sys.executable).with_name("lowtide")
WORDS = "lorem ipsum dolor sit amet "


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def body(size: int, prompt_kb: float = 2.2) -> Iterator[bytes]:
    """A message batch of about `size` bytes, as chunks: `{"requests": [...]}`. With 2.2 KB
    prompts, 200 MB stays under Anthropic's 100,000 requests."""
    text = WORDS * int(prompt_kb * 1024 / len(WORDS))
    yield b'{"requests": ['
    sent, i, pending = 0, 0, []
    while sent < size:
        item = json.dumps({"custom_id": f"r{i}", "params": {"model": "claude-test", "max_tokens": 16,
                           "messages": [{"role": "user", "content": f"{i} {text}"}]}}).encode()  # fmt: skip
        pending.append((b"," if i else b"") + item)
        sent += len(item) + 1
        i += 1
        if len(pending) >= 32:
            yield b"".join(pending)
            pending = []
    yield b"".join(pending) + b"]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(size: int, *args: str, prompt_kb: float = 2.2) -> dict[str, int | str]:
    """Start the server with `args`, send the batch, return the figures (KiB) and status."""
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        cmd = [str(LOWTIDE), "serve", "--port", str(port), "--db", f"{tmp}/lt.db", "--data-dir", f"{tmp}/data", *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_up(port, proc)
            # One small batch first: serve reads the Messages request types (importing the
            # anthropic package, 55-60 MB) at the first message batch it takes, once per process.
            _send(port, body(1, prompt_kb))
            before = _kib(proc.pid, "VmRSS")
            status = _send(port, body(size, prompt_kb))
            return {"status": status, "rss_before_kib": before, "rss_peak_kib": _kib(proc.pid, "VmHWM"),
                    "rss_after_kib": _kib(proc.pid, "VmRSS")}  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(30)


def _wait_up(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "lowtide serve exited"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /v1/messages/batches HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: k\r\nconnection: close\r\n\r\n")
                if s.recv(12).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("lowtide serve did not start")


def _send(port: int, chunks: Iterator[bytes]) -> str:
    """Send the body chunked; stop once the server has answered. The status line."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/messages/batches HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: k\r\n"
                  b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")  # fmt: skip
        s.setblocking(False)
        answer = b""
        try:
            for chunk in chunks:
                data = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                while data:
                    try:
                        answer += s.recv(65536)
                        if answer:
                            raise StopIteration
                    except BlockingIOError:
                        pass
                    try:
                        data = data[s.send(data) :]
                    except BlockingIOError:
                        time.sleep(0.001)
            s.setblocking(True)
            s.sendall(b"0\r\n\r\n")
        except (StopIteration, BrokenPipeError, ConnectionResetError):
            pass
        s.setblocking(True)
        s.settimeout(600)
        while b"\r\n" not in answer:
            part = s.recv(65536)
            if not part:
                break
            answer += part
        return answer.split(b"\r\n", 1)[0].decode(errors="replace")


def _size(text: str) -> int:
    units = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}
    return int(float(text[:-2]) * units[text[-2:].upper()]) if text[-2:].upper() in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="400MB")
    parser.add_argument("--prompt-kb", type=float, default=2.2, help="prompt size of each request")
    parser.add_argument("serve_args", nargs="*", help="more `lowtide serve` options, after --")
    args = parser.parse_args()
    size = _size(args.size)
    extra = list(args.serve_args)
    figures = measure(size, *extra, prompt_kb=args.prompt_kb)
    mb = {k: (f"{v / 1024:.0f} MB" if isinstance(v, int) else v) for k, v in figures.items()}
    print(json.dumps({"body_bytes": size, **mb}))


if __name__ == "__main__":
    main()
