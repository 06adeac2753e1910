"""The real `lowtide gateway` command listens as serve does: open (no tenants), it answers
only to loopback names, IP addresses, public_url's and --allow-host's (a rebinding page could
otherwise spend the upstream key); a foreign Origin is refused; a slow request head is cut."""

from __future__ import annotations

import os
import socket
import subprocess

import httpx
import pytest
import yaml

from tests.conftest import wait_until
from tests.server.test_serve_command import LOWTIDE, _free_port
from tests.server.test_slow_clients import closed_by_server

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")]


def test_an_open_gateway_refuses_other_names_and_origins_and_cuts_slow_heads(tmp_path):
    config = {"data_dir": str(tmp_path / "gw"), "public_url": "https://llm.example.com",
              "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}, "batch": {"openai": {"route": "echo"}}}  # fmt: skip
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    cmd = [str(LOWTIDE), "--db", str(tmp_path / "gw.db"), "gateway", "--config", str(tmp_path / "gateway.yaml"), "--port", str(port),
           "--allow-host", "gw.lan", "--header-timeout", "0.3"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1/models"
    key = {"authorization": "Bearer any"}
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read()
            try:
                return httpx.get(url, headers=key).status_code > 0
            except httpx.TransportError:
                return False

        wait_until(up, timeout=90, what="lowtide gateway to start")
        refused = httpx.get(url, headers=key | {"host": "rebind.example"})
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert "--allow-host rebind.example" in message and "configure tenants" in message
        for host in (f"127.0.0.1:{port}", "localhost", "gw.lan", "llm.example.com"):  # public_url's name is its own
            assert "is not served" not in httpx.get(url, headers=key | {"host": host}).text, host
        foreign = httpx.get(url, headers=key | {"origin": "https://evil.example"})
        assert foreign.status_code == 403 and "--allow-origin https://evil.example" in foreign.json()["error"]["message"]
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert closed_by_server(conn)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
