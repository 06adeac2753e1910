"""A client that hangs up in the middle of its body is logged as one INFO line, never as an
error with a traceback (errors.HangUps): serve and the gateway, on their real apps."""

from __future__ import annotations

import logging
import socket

import pytest

from lowtide.server import ServeConfig, create_app
from lowtide.server.gateway import create_gateway_app
from tests.conftest import wait_until
from tests.gateway.conftest import build_gateway_config
from tests.server.conftest import on_loopback

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")  # fmt: skip


def _hang_up(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(HEAD + b'{"model": "gpt-test", "messages": [')  # then gone, 99,970 bytes short


def _gateway(tmp_path):
    config = {"data_dir": str(tmp_path / "gw"), "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
              "batch": {"openai": {"route": "echo"}}}  # fmt: skip
    return create_gateway_app(build_gateway_config(config), db=str(tmp_path / "gw.db"))


@pytest.mark.parametrize("which", ["serve", "gateway"])
def test_a_client_hanging_up_mid_body_is_one_line_without_traceback(tmp_path, caplog, which):
    app = create_app(ServeConfig(data_dir=tmp_path / "d", db=str(tmp_path / "s.db"))) if which == "serve" else _gateway(tmp_path)
    caplog.set_level(logging.INFO)
    with on_loopback(app) as port:
        _hang_up(port)
        if which == "gateway":  # its hot path logs the hang-up; serve answers it quietly (errors.install)
            wait_until(lambda: any("hung up" in r.getMessage() for r in caplog.records), what="the hang-up's line")
        with socket.create_connection(("127.0.0.1", port)) as conn:  # and it serves on
            conn.sendall(HEAD.replace(b"100000", b"2") + b"{}")
            assert conn.recv(100).startswith(b"HTTP/1.1 ")
    mine = [r for r in caplog.records if r.name.startswith(("lowtide", "uvicorn"))]
    assert not [r for r in mine if r.exc_info or r.levelno >= logging.ERROR], [r.getMessage() for r in mine]
    lines = [r for r in mine if "hung up" in r.getMessage()]
    assert all(r.levelno == logging.INFO and "\n" not in r.getMessage() for r in lines)
