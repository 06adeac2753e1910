"""Sources by http(s):// URL, from a real HTTP server on loopback serving a folder (fsspec's
HTTP filesystem, on aiohttp): one file of each format, and a missing file refused."""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lowtide.core.errors import SourceError
from lowtide.core.sources import SourceSpec, source_at


class _Files(SimpleHTTPRequestHandler):
    """A static file server that answers `Range: bytes=a-b` as every real one does (Parquet
    is read by its footer first); http.server's own handler ignores ranges."""

    def log_message(self, *args) -> None:
        pass

    def send_head(self):
        wanted = self.headers.get("Range", "")
        path = Path(self.translate_path(self.path))
        if not wanted.startswith("bytes=") or not path.is_file():
            return super().send_head()
        data = path.read_bytes()
        first, _, last = wanted[len("bytes=") :].partition("-")
        start, end = (int(first), int(last) if last else len(data) - 1) if first else (len(data) - int(last), len(data) - 1)
        end = min(end, len(data) - 1)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return io.BytesIO(data[start : end + 1])


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on loopback serving a fresh folder: (its URL, the folder)."""
    import fsspec

    root = tmp_path / "site"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fsspec.get_filesystem_class("http").clear_instance_cache()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def rows_of(url: str, **spec) -> list[dict]:
    source = source_at(SourceSpec(path=url, id_column="id", **spec))
    return [r.values for chunk in source.chunks() for r in chunk]


def test_csv_jsonl_and_parquet_files_by_url(web):
    url, root = web
    (root / "rows.csv").write_bytes(b"id,text\n1,hello\n2,world\n")
    (root / "rows.jsonl").write_bytes(b'{"id": 1, "text": "hello"}\n')
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a", "b", "c"]}), buf)
    (root / "rows.parquet").write_bytes(buf.getvalue())

    assert rows_of(f"{url}/rows.csv") == [{"id": "1", "text": "hello"}, {"id": "2", "text": "world"}]
    assert rows_of(f"{url}/rows.jsonl") == [{"id": 1, "text": "hello"}]
    assert rows_of(f"{url}/rows.parquet", filter=[["id", ">", 1]]) == [{"id": 2, "text": "b"}, {"id": 3, "text": "c"}]


def test_a_missing_file_is_named(web):
    url, _ = web
    with pytest.raises(SourceError) as caught:
        rows_of(f"{url}/gone.csv")
    assert str(caught.value).startswith(f"{url}/gone.csv: no such file") and "source.path" in str(caught.value)
