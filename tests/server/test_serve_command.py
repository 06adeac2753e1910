"""The real `lowtide serve` command: keys from the environment, and a batch that survives the
server being killed (SIGKILL) and started again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.server.conftest import chat_line, create_batch, file_lines, wait_openai, wait_until

LOWTIDE = Path(sys.executable).with_name("lowtide")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not LOWTIDE.exists(), reason=f"no lowtide script at {LOWTIDE}")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, port: int, *args: str, env_keys: str | None = "secret-1, secret-2", key: str = "secret-2") -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    if env_keys is not None:
        env["LOWTIDE_SERVE_API_KEYS"] = env_keys
    cmd = [str(LOWTIDE), "serve", "--port", str(port), "--backend", "echo", "--db", str(tmp_path / "lt.db"),
           "--data-dir", str(tmp_path / "data"), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read()
        try:
            client.batches.list()
            return True
        except openai.APIConnectionError:
            return False

    wait_until(up, timeout=90, what="lowtide serve to start")  # a bound: a loaded machine starts it slowly
    return proc


def test_a_batch_in_flight_survives_sigkill_and_a_restart(tmp_path):
    port = _free_port()
    first = _start(tmp_path, port, "--time-scale", "3600", "--complete-after", "360000")  # 100 s: held in progress
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="secret-1", max_retries=0)
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="secret-3", max_retries=0).batches.list()
        batch = create_batch(client, [chat_line(f"r{i}", f"text {i}") for i in range(3000)])
        wait_openai(client, batch.id, ("in_progress",))
    finally:
        first.send_signal(signal.SIGKILL)
        output = first.communicate(timeout=30)[0]
    assert "2 API key(s) accepted" in output
    assert "secret" not in output  # keys are never printed

    second = _start(tmp_path, port, "--time-scale", "3600")
    try:
        done = wait_openai(client, batch.id)
        assert done.status == "completed"
        assert done.request_counts.model_dump() == {"total": 3000, "completed": 3000, "failed": 0}
        ids = [line["custom_id"] for line in file_lines(client, done.output_file_id)]
        assert len(ids) == 3000 and set(ids) == {f"r{i}" for i in range(3000)}
    finally:
        second.terminate()
        second.communicate(timeout=30)


def test_port_0_listens_on_a_free_port_and_prints_the_one_it_got(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    cmd = [str(LOWTIDE), "serve", "--port", "0", "--backend", "echo", "--db", str(tmp_path / "lt.db"), "--data-dir", str(tmp_path / "data")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while 'OpenAI(base_url="' not in line:  # the banner comes once the socket listens
            line = proc.stdout.readline()
            assert line, "lowtide serve ended before printing its URLs"
        url = line.split('base_url="', 1)[1].split('"', 1)[0]
        assert not url.startswith("http://127.0.0.1:0/") and url.endswith("/v1")
        assert openai.OpenAI(base_url=url, api_key="k", max_retries=0).batches.list().data == []
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_socket_listens_before_the_banner_so_an_early_client_waits_instead_of_being_refused():
    """The banner is printed before uvicorn starts (its app's startup may take a while under
    load); a client that connects in between must be queued, not refused (a CI flake above)."""
    from lowtide.cli.serve import bind

    sock = bind("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass  # refused (ECONNREFUSED) by a socket bound but not listening
    finally:
        sock.close()


def test_a_port_in_use_is_refused_by_name_before_serving(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
        cmd = [str(LOWTIDE), "serve", "--port", str(port), "--db", str(tmp_path / "lt.db"), "--data-dir", str(tmp_path / "data")]
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"lowtide: cannot listen on 127.0.0.1:{port}: Address already in use; give another --port (0: any free one)" in done.stderr
    assert "OpenAI(base_url=" not in done.stdout


def test_keys_come_from_a_file_and_a_key_on_the_command_line_is_warned_of(tmp_path):
    """A key on the command line is in the process list (`ps`) for anyone to read: a key file
    (or LOWTIDE_SERVE_API_KEYS) keeps it out; --api-key still works, with a warning."""
    keys = tmp_path / "keys"
    keys.write_text("# serve's keys\nfile-key-1\n\n  file-key-2  \n")
    port = _free_port()
    proc = _start(tmp_path, port, "--api-key-file", str(keys), "--api-key", "argv-key", env_keys=None, key="file-key-2")
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for key in ("file-key-1", "file-key-2", "argv-key"):
            assert openai.OpenAI(base_url=url, api_key=key, max_retries=0).batches.list().data == []
        for key in ("# serve's keys", "file-key", "other"):
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url, api_key=key, max_retries=0).batches.list()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0]
    assert "3 API key(s) accepted" in output
    assert "warning: --api-key shows the key to anyone who can list processes" in output and "--api-key-file" in output
    assert "file-key" not in output and "argv-key" not in output
