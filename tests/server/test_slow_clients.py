"""Slowloris (server/listen.py): a connection that does not finish a request's head (request
line and headers) within the header timeout is closed, whether it sent nothing, part of a
head, or part of the next head on a kept-alive connection. A whole head is served as ever.
The timeout is made small; the test waits for the server to close the socket (EOF), with a
generous bound of its own, and asserts no timing."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn

from lowtide.server import ServeConfig, create_app, listen
from tests.conftest import wait_until
from tests.server.test_serve_command import LOWTIDE, _free_port

HEAD_TIMEOUT = 0.3
BOUND = 60.0  # seconds the test waits for the server's EOF before calling it held open


@contextmanager
def listening(tmp_path: Path) -> Iterator[int]:
    """serve's app as the commands listen: uvicorn with the head deadline, on a loopback port."""
    app = create_app(ServeConfig(data_dir=tmp_path / "data", db=str(tmp_path / "lowtide.db")))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(listen.config(app, header_timeout=HEAD_TIMEOUT, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), what="the server to start")
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def closed_by_server(conn: socket.socket) -> bool:
    """True once the server closed the connection (EOF or reset); False if held for BOUND s."""
    conn.settimeout(BOUND)
    try:
        while conn.recv(65536):
            pass  # an answer (there should be none) before the close
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


HEAD = b"GET /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize("sent", [b"", b"GET /v1/bat", b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl"])
def test_a_head_not_finished_in_time_is_disconnected(tmp_path, sent):
    with listening(tmp_path) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(sent)
        assert closed_by_server(conn), f"a connection that sent {sent!r} was held open {BOUND:g} s"


def test_the_next_head_on_a_kept_alive_connection_has_its_deadline_too(tmp_path):
    with listening(tmp_path) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(HEAD)
        first = b""
        while b"\r\n\r\n" not in first:
            first += conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")  # a whole head is served
        conn.sendall(b"GET /v1/batches HTTP/1.1\r\nHo")
        assert closed_by_server(conn)


@pytest.mark.slow
@pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")
def test_lowtide_serve_disconnects_a_slow_head(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    cmd = [str(LOWTIDE), "serve", "--port", str(port), "--db", str(tmp_path / "lt.db"), "--data-dir", str(tmp_path / "data"),
           "--header-timeout", str(HEAD_TIMEOUT)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read()
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                return True
            except OSError:
                return False

        wait_until(up, timeout=90, what="lowtide serve to start")  # a bound: a loaded machine starts it slowly
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert closed_by_server(conn)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
