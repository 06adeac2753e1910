"""Object stores on loopback for the data-plane tests: moto's S3 server and a GCS emulator,
each started once per test module, with the clients pointed at them the way a user points
them at an S3-compatible server or an emulator: by the SDKs' own environment variables.

    def test_x(s3):                 # s3.bucket("name") -> "s3://name"; env set for the test
        ...
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

# gcsfs asks Google's gRPC control API what kind each bucket is, before the first read; the
# emulator speaks only JSON over HTTP, so each ask waits out a 60 s timeout. Read at gcsfs's
# import: set before any test imports it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Server:
    endpoint: str
    scheme = ""

    def fs(self):
        raise NotImplementedError

    def bucket(self, name: str) -> str:
        """A new, empty bucket: its URL."""
        fs = self.fs()
        if fs.exists(name):
            fs.rm(name, recursive=True)
        fs.mkdir(name)
        fs.invalidate_cache()
        return f"{self.scheme}://{name}"


class S3Server(_Server):
    scheme = "s3"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, key="testing", secret="testing")


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


def _fresh_fsspec() -> None:
    """fsspec keeps filesystem instances (and their listings) by their arguments: a test's
    environment must not meet an instance made under another's."""
    import fsspec

    for cls in fsspec.registry.values():
        clear = getattr(cls, "clear_instance_cache", None)
        if clear is not None:
            clear()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """The module's S3 server, with this test's environment pointing every S3 client at it
    (AWS_ENDPOINT_URL, as for MinIO or any S3-compatible store) and test credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    for k, v in S3Server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    _fresh_fsspec()
    yield s3_server
    _fresh_fsspec()


class GcsServer(_Server):
    scheme = "gs"

    def fs(self):
        import gcsfs

        return gcsfs.GCSFileSystem(endpoint_url=self.endpoint, token="anon", project="test")


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory) -> Iterator[GcsServer]:
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield GcsServer(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture
def gcs(gcs_server: GcsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcsServer]:
    """The module's GCS emulator, with STORAGE_EMULATOR_HOST (which gcsfs and Google's SDKs
    read) pointing at it, and anonymous access set in fsspec's configuration as a user sets
    it (~/.config/fsspec/conf.json or FSSPEC_GCS_TOKEN=anon): without it, Google's auth
    looks for a metadata server for a minute and a half."""
    import fsspec.config

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon", "project": "test"})
    _fresh_fsspec()
    yield gcs_server
    _fresh_fsspec()

