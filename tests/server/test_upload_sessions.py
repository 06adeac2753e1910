"""Gemini resumable upload sessions started and never finished expire a week after their
start on serve's clock, and their bytes go (issue 34: they were never cleaned). The
module on a folder with explicit times, then serve on an injected clock."""

from __future__ import annotations

import json

import httpx

from lowtide.core.clock import ManualClock
from lowtide.server.upload_sessions import SESSION_TTL, stamped, sweep

T0 = 1_900_000_000.0


def _session(staging, upload_id: str, head: dict, size: int = 10) -> None:
    (staging / f"{upload_id}.json").write_text(json.dumps(head))
    (staging / f"{upload_id}.part").write_bytes(b"x" * size)


def test_a_session_goes_with_its_bytes_once_its_time_is_up(tmp_path):
    _session(tmp_path, "old", stamped({"displayName": "a"}, T0))
    _session(tmp_path, "new", stamped({"displayName": "b"}, T0 + 3600))
    assert sweep(tmp_path, T0 + SESSION_TTL - 1) == []
    assert sweep(tmp_path, T0 + SESSION_TTL) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "new.part"]
    assert sweep(tmp_path, T0 + 3600 + SESSION_TTL) == ["new"]
    assert list(tmp_path.iterdir()) == []


def test_a_session_from_before_the_stamp_expires_a_week_from_its_first_sweep(tmp_path):
    _session(tmp_path, "legacy", {"displayName": "a", "size": None})
    (tmp_path / "broken.json").write_text("{not json")
    assert sweep(tmp_path, T0) == []
    assert json.loads((tmp_path / "legacy.json").read_text()) == {"displayName": "a", "size": None, "started": T0}
    assert sweep(tmp_path, T0 + SESSION_TTL) == ["broken", "legacy"]
    assert list(tmp_path.iterdir()) == []


def _start(s) -> str:
    start = httpx.post(f"{s.url}/upload/v1beta/files", json={"file": {"displayName": "in.jsonl"}},
                       headers={"x-goog-api-key": "k", "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"})  # fmt: skip
    assert start.status_code == 200, start.text
    return start.headers["x-goog-upload-url"]


def _send(url: str, data: bytes, offset: int, command: str = "upload") -> httpx.Response:
    return httpx.post(url, content=data, headers={"x-goog-api-key": "k", "X-Goog-Upload-Command": command,
                                                  "X-Goog-Upload-Offset": str(offset)})  # fmt: skip


def test_serve_drops_an_abandoned_upload_a_week_after_its_start(serve):
    with serve(clock=ManualClock(T0), run_worker=False) as s:
        staging = s.server.data_dir / "uploads"
        abandoned = _start(s)
        assert _send(abandoned, b"x" * 1000, 0).status_code == 200
        s.server.clock.clock.advance(SESSION_TTL - 60)
        finished = _start(s)  # a call a minute before the week is up leaves it
        assert sorted(p.suffix for p in staging.iterdir()) == [".json", ".json", ".part", ".part"]
        s.server.clock.clock.advance(60)
        assert _send(finished, b"y" * 5, 0, "upload, finalize").json()["file"]["sizeBytes"] == "5"
        assert list(staging.iterdir()) == []  # the abandoned one went, bytes and all
        late = _send(abandoned, b"x", 1000)
        assert late.status_code == 404 and "start the upload again" in late.json()["error"]["message"]
