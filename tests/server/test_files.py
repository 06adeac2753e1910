"""OpenAI's Files API beyond upload and content: the paginated list, expiry (of uploads and
of a batch's output files, `output_expires_after`), and uploads named without an extension."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import wait_until
from tests.server.conftest import chat_line, create_batch, jsonl, upload, wait_openai


def test_files_are_listed_newest_first_and_the_sdk_follows_the_pages(server):
    client = server.openai()
    ids = [upload(client, [chat_line(f"r{i}")], name=f"in{i}.jsonl").id for i in range(7)]
    notes = client.files.create(file=("notes.txt", b"hi"), purpose="user_data").id

    page = client.files.list(limit=3, purpose="batch")
    assert [f.id for f in page.data] == ids[::-1][:3] and page.has_more is True
    raw = client.files.with_raw_response.list(limit=3, purpose="batch").http_response.json()
    assert set(raw) == {"object", "data", "first_id", "last_id", "has_more"}
    assert (raw["object"], raw["first_id"], raw["last_id"]) == ("list", ids[6], ids[4])

    assert [f.id for f in client.files.list(limit=3, purpose="batch")] == ids[::-1]  # auto-pagination: `after`
    assert [f.id for f in client.files.list(limit=2, order="asc", purpose="batch")] == ids
    assert [f.id for f in client.files.list(limit=2, after=ids[2], order="asc")] == ids[3:] + [notes]
    assert [f.id for f in client.files.list()] == [notes, *ids[::-1]]  # every purpose, one page of up to 10,000
    last = client.files.list(limit=1, after=ids[0], purpose="batch")
    assert last.data == [] and last.has_more is False
    for bad in ({"limit": 0}, {"limit": 10_001}, {"order": "sideways"}):
        with pytest.raises(openai.BadRequestError):
            client.files.list(**bad)
    with pytest.raises(openai.NotFoundError):
        client.files.list(after="file-nope")


def test_output_expires_after_sets_when_the_output_files_go(server):
    client = server.openai()
    keep = {"anchor": "created_at", "seconds": 3600}  # one scaled hour: a second of the test's clock
    batch = create_batch(client, [chat_line("ok"), chat_line("bad", max_tokens="many")], output_expires_after=keep)
    done = wait_openai(client, batch.id)
    for file_id in (done.output_file_id, done.error_file_id):
        file = client.files.retrieve(file_id)
        assert file.expires_at == file.created_at + 3600
        assert client.files.content(file_id).read()
    wait_until(lambda: not _exists(client, done.output_file_id), what="the output file to expire")
    for call in (client.files.retrieve, client.files.content):
        with pytest.raises(openai.NotFoundError, match=f"No file found with id '{done.output_file_id}'"):
            call(done.output_file_id)
    assert done.output_file_id not in {f.id for f in client.files.list()}


def test_without_output_expires_after_output_files_live_30_days(server):
    client = server.openai()
    done = wait_openai(client, create_batch(client, [chat_line("ok")]).id)
    file = client.files.retrieve(done.output_file_id)
    assert file.expires_at == file.created_at + 30 * 86400


@pytest.mark.parametrize(
    ("value", "param"),
    [
        pytest.param({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds", id="too-short"),
        pytest.param({"anchor": "created_at", "seconds": 2_592_001}, "output_expires_after.seconds", id="too-long"),
        pytest.param({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds", id="text"),
        pytest.param({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor", id="anchor"),
        pytest.param({"seconds": 3600}, "output_expires_after.anchor", id="no-anchor"),
    ],
)
def test_a_bad_output_expires_after_is_refused_in_openais_words(server, value, param):
    client = server.openai()
    file = upload(client, [chat_line("a")])
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h",
                              output_expires_after=value)  # type: ignore[arg-type]  # fmt: skip
    assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"


def test_an_upload_without_an_extension_is_a_batch_input_and_a_wrong_one_is_refused(server):
    client = server.openai()
    raw = client.files.create(file=jsonl([chat_line("a", "from raw bytes")]), purpose="batch")  # the SDK names it `upload`
    assert raw.filename == "upload"
    named = client.files.create(file=("tickets", jsonl([chat_line("b")])), purpose="batch")
    assert named.filename == "tickets"
    done = wait_openai(client, client.batches.create(input_file_id=raw.id, endpoint="/v1/chat/completions", completion_window="24h").id)
    assert done.status == "completed" and done.request_counts.completed == 1
    for wrong in ("in.csv", "in.json", "in.jsonl.txt"):
        with pytest.raises(openai.BadRequestError, match="Invalid file format for Batch API. Must be .jsonl"):
            client.files.create(file=(wrong, b"{}\n"), purpose="batch")


def _exists(client: openai.OpenAI, file_id: str) -> bool:
    try:
        client.files.retrieve(file_id)
    except openai.NotFoundError:
        return False
    return True
