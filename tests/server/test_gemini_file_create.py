"""serve answers a Gemini file batch's create at once and takes the file in afterwards, as
Gemini does (issue 32: taking a 2 GB file in before answering outlasted the client's read
timeout, and the client uploaded it again). Meanwhile the batch is PENDING; a line that is no
request fails the batch with its words, where it was a 400 to the create. An inline batch
(under 20 MB) is still taken in, and refused, by its create. A stepped serve (no worker
thread), so what happens before the worker's pass is seen."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from google import genai
from google.genai import errors, types

from lowtide.server.finalize import batch_folder
from tests.server.conftest import run_passes, stepped

MODEL = "gemini-2.5-flash"


def _client(s) -> genai.Client:
    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=s.url))


def _upload(c: genai.Client, lines: list) -> str:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    return c.files.upload(file=io.BytesIO(text.encode()), config={"mime_type": "jsonl"}).name


def _ask(text: str) -> dict:
    return {"contents": [{"role": "user", "parts": [{"text": text}]}]}


def test_a_file_batch_is_answered_before_its_file_is_taken_in(serve):
    with stepped(serve) as s:
        c = _client(s)
        name = _upload(c, [{"key": f"k{i}", "request": _ask(f"hello {i}")} for i in range(3)])
        made = c.batches.create(model=MODEL, src=name)
        assert made.state.value == "JOB_STATE_PENDING"
        folder = batch_folder(s.server, made.name.removeprefix("batches/"))
        assert not folder.exists() or not any(folder.iterdir())  # nothing taken in yet
        run_passes(s)
        done = c.batches.get(name=made.name)
        assert done.state.value == "JOB_STATE_SUCCEEDED"
        got = [json.loads(x) for x in c.files.download(file=done.dest.file_name).decode().splitlines()]
        assert sorted(g["key"] for g in got) == ["k0", "k1", "k2"]


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ([{"key": "a", "request": _ask("x")}, "{not json"], "line 2: not valid JSON"),
        ([{"key": "a", "request": _ask("x")}, {"key": "a", "request": _ask("y")}], "key 'a' is used more than once"),
        ([{"request": _ask("x")}], 'line 1: expected {"key": "...", "request": {...}}'),
    ],
)
def test_a_bad_line_fails_the_file_batch_with_its_words(serve, lines, said):
    with stepped(serve) as s:
        c = _client(s)
        made = c.batches.create(model=MODEL, src=_upload(c, lines))  # answered: the file is read after
        run_passes(s)
        assert c.batches.get(name=made.name).state.value == "JOB_STATE_FAILED"
        error = httpx.get(f"{s.url}/v1beta/{made.name}", headers={"x-goog-api-key": "k"}).json()["error"]  # the SDK keeps no error
        assert said in error["message"] and error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"


def test_a_missing_file_and_a_bad_inline_request_are_still_refused_by_the_create(serve):
    with stepped(serve) as s:
        c = _client(s)
        with pytest.raises(errors.ClientError) as missing:
            c.batches.create(model=MODEL, src="files/nosuchfile")
        assert missing.value.code in (400, 404)
        with pytest.raises(errors.ClientError) as twice:
            c.batches.create(model=MODEL, src=[{"contents": _ask("x")["contents"], "metadata": {"key": "a"}},
                                              {"contents": _ask("y")["contents"], "metadata": {"key": "a"}}])  # fmt: skip
        assert twice.value.code == 400 and "used more than once" in twice.value.message
