"""gemini-batch against `lowtide serve` run as a subprocess: the official google-genai SDK on
both sides of a real HTTP connection, inline and file batches, adoption, bad input."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import sqlalchemy as sa
import yaml

from lowtide.core.clock import SystemClock
from lowtide.core.errors import LowtideError
from lowtide.core.types import Request
from lowtide.engine.loader import load_job
from lowtide.routes import create_route
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, dispatches, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, _run

MODEL = "gemini-2.5-flash"


def _options(url: str, **more) -> dict:
    return {"base_url": url, "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], **more}


# "switch": a chunk goes over inline_bytes part way, and its first lines go into the file too
@pytest.mark.parametrize("inline_bytes", [10 * 2**20, 0, 700], ids=["inline", "file", "switch"])
def test_a_templated_job_runs_through_geminis_batch_protocol(inline_bytes, serve, tmp_path):
    url = serve()
    source = write_csv(tmp_path / "t.csv", ticket_rows(25))
    spec = make_spec(source, model=MODEL, route="gemini-batch", route_options=_options(url, max_requests=10, inline_bytes=inline_bytes))
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 25}
    with store.begin() as conn:
        outputs = dict(conn.execute(sa.select(requests.c.custom_id, requests.c.output)).all())
        payload = conn.execute(sa.select(payload_text().label("payload")).where(requests.c.custom_id == "T1003")).scalar_one()
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
        tiers = list(conn.execute(sa.select(attempts.c.tier)).scalars())
        usage = conn.execute(sa.select(sa.func.sum(attempts.c.input_tokens), sa.func.sum(attempts.c.cost_picousd),
                                       sa.func.sum(attempts.c.realtime_picousd))).one()  # fmt: skip
    assert outputs["T1003"] == "Ticket: ticket 1003 about shipping"  # echo, matched by key
    assert '"endpoint": "/v1/chat/completions"' in payload or '"endpoint":"/v1/chat/completions"' in payload  # stored as rendered
    assert len(provider_ids) == 3 and all(p.startswith("batches/") for p in provider_ids)  # 10 + 10 + 5
    assert tiers == ["batch"] * 25  # one attempt each: none was lost and retried
    assert usage[0] > 0 and usage[1] > 0  # priced from the catalog's gemini-2.5-flash batch tier:
    assert usage[2] == 2 * usage[1]  # half the real-time price


def test_a_batch_created_before_a_crash_is_found_by_its_display_name(serve, tmp_path, monkeypatch):
    url = serve()
    monkeypatch.setenv(KEY_ENV, "test-key")

    async def go():
        route = create_route("gemini-batch", _options(url))
        try:
            reqs = [Request.chat(f"r{i}", MODEL, [{"role": "user", "content": f"hi {i}"}]) for i in range(3)]
            made = await route.submit("job-1.d7", reqs)
            other = await route.submit("job-1.d8", reqs[:1])
            # The dispatch record was lost with the crash: only the key is known.
            found = await route.find("job-1.d7", 3, 0.0)
            missing = await route.find("job-1.d9", 3, 0.0)
            return made, other, found, missing
        finally:
            await route.aclose()

    made, other, found, missing = asyncio.run(go())
    assert found == made != other
    assert missing is None


def test_an_unknown_gemini_model_is_refused_before_anything_is_stored(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    spec = make_spec(source, model="gemini-9-ultra", route="gemini-batch", route_options=_options("http://127.0.0.1:9"))
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(LowtideError) as err:
        load_job(store, spec, SystemClock())
    message = str(err.value)
    assert 'unknown Gemini model "gemini-9-ultra"' in message and "gemini-2.5-flash" in message and "route_options.models" in message
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(requests)).scalar_one() == 0


def test_a_chat_parameter_without_a_gemini_mapping_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "k")
    source = write_csv(tmp_path / "t.csv", ticket_rows(2))
    spec = make_spec(source, model=MODEL, route="gemini-batch", route_options=_options("http://127.0.0.1:9"),
                     params={"max_tokens": 64, "logprobs": True})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    with pytest.raises(LowtideError) as err:
        load_job(store, spec, SystemClock())
    assert "logprobs: has no Gemini mapping" in str(err.value) and "gemini-batch" in str(err.value)


def test_poll_reads_a_failed_batchs_error_and_counts_from_the_operation(serve, tmp_path, monkeypatch):
    # The SDK's BatchJob (Gemini API) carries neither the operation's error nor batchStats.
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"batches": [{"api": "gemini", "fail_validation": {"code": "invalid", "message": "quota gone"}}]}))
    url = serve("--faults", str(plan))
    monkeypatch.setenv(KEY_ENV, "test-key")

    async def go():
        route = create_route("gemini-batch", _options(url))
        try:
            name = await route.submit("job-1.d1", [Request.chat(f"r{i}", MODEL, [{"role": "user", "content": "hi"}]) for i in range(3)])
            for _ in range(200):  # the server's fast clock ends it within a few polls
                status = await route.poll(name)
                if status.ended:
                    return status
                await asyncio.sleep(0.02)
            raise AssertionError("the batch did not end")
        finally:
            await route.aclose()

    status = asyncio.run(go())
    assert status.phase == "JOB_STATE_FAILED"
    assert status.errors == ["400 INVALID_ARGUMENT: quota gone"]
    assert status.counts["requestCount"] == 3


class _Gemini(BaseHTTPRequestHandler):
    """A Gemini API of one ended inline batch, answering as `batches.get` and `list` do. Its
    field masks: "ignored" (the whole answer), "refused" (400), "misapplied" (an answer
    without the metadata asked for). Each GET's query is kept."""

    batch: dict = {}
    masks = "ignored"
    queries: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        path, _, query = self.path.partition("?")
        self.queries.append(query)
        masked = "fields=" in query
        if masked and self.masks == "refused":
            self._send(400, {"error": {"code": 400, "message": "Invalid field selection", "status": "INVALID_ARGUMENT"}})
        elif path == "/v1beta/batches/b1":
            self._send(200, {"name": "batches/b1", "done": True} if masked and self.masks == "misapplied" else self.batch)
        elif path == "/v1beta/batches":
            self._send(200, {"operations": [{"name": "batches/b1"} if masked and self.masks == "misapplied" else self.batch]})
        else:
            self._send(404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def gemini_api(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "test-key")
    _Gemini.queries = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gemini)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# A response with keys the installed SDK's types lack (a newer API's), and values a typed
# round trip would rewrite: each must reach the outcome exactly as sent.
SENT = {
    "candidates": [{"content": {"role": "model", "parts": [{"text": "hi", "thoughtSignature": "q+/w", "futurePart": {"x": 1}}]},
                    "finishReason": "STOP", "index": 0, "futureCandidateField": [1, 2]}],
    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1, "totalTokenCount": 4, "futureCount": 7},
    "modelVersion": "gemini-2.5-flash", "responseId": "r-1", "futureTopLevel": {"nested": {"deep": True}},
}  # fmt: skip


def _ended(items: list, state: str = "BATCH_STATE_SUCCEEDED") -> dict:
    output = {"inlinedResponses": {"inlinedResponses": items}}
    meta = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch", "model": f"models/{MODEL}",
            "displayName": "k", "state": state, "name": "batches/b1", "output": output,
            "batchStats": {"requestCount": str(len(items)), "successfulRequestCount": str(len(items))}}  # fmt: skip
    return {"name": "batches/b1", "metadata": meta, "done": True, "response": output}


@pytest.mark.parametrize("masks", ["ignored", "refused", "misapplied"])
def test_inline_responses_reach_the_outcome_exactly_as_sent(gemini_api, masks):
    _Gemini.batch = _ended([{"response": SENT, "metadata": {"key": "a"}},
                            {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}, "metadata": {"key": "b"}},
                            {"response": SENT}, {"response": SENT, "metadata": "a"}])  # fmt: skip  (no key: names no request, skipped)
    _Gemini.masks = masks

    async def go():
        route = create_route("gemini-batch", _options(gemini_api))
        try:
            polls = [await route.poll("batches/b1") for _ in range(2)]
            found = await route.find("k", 4, 0.0)
            return polls, found, [o async for o in route.results("batches/b1")]
        finally:
            await route.aclose()

    polls, found, outcomes = asyncio.run(go())
    assert found == "batches/b1"
    assert [p.phase for p in polls] == ["JOB_STATE_SUCCEEDED"] * 2 and polls[0].ended
    assert polls[0].counts == {"requestCount": 4, "successfulRequestCount": 4}
    by_key = {o.custom_id: o for o in outcomes}
    assert set(by_key) == {"a", "b"}
    assert by_key["a"].ok and by_key["a"].text == "hi" and by_key["a"].tier == "batch"
    assert by_key["a"].response == SENT  # every key, camelCase, as the server sent it
    assert not by_key["b"].ok and by_key["b"].error_code == "resource_exhausted" and by_key["b"].retryable
    # Each GET asks only for what it reads; a server that refuses or misapplies the mask is
    # asked again without one, and from then on (poll, poll, find, results).
    masked = ["fields=" in q for q in _Gemini.queries]
    assert masked == ([True, True, True, True] if masks == "ignored" else [True, False, False, False, False])


# A batch that expired with requests not run: serve says so per request as a DEADLINE_EXCEEDED
# line (server/gemini_outputs.py). Read as the error it is word for word (`deadline_exceeded`),
# each went to another Gemini batch; out of time, it goes to the fallback at once, as an
# OpenAI `batch_expired` line or a line missing from the output does (docs/fallback.md).
@pytest.mark.parametrize("inline_bytes", [10 * 2**20, 0], ids=["inline", "file"])
def test_requests_a_batch_expired_go_to_the_fallback_route_at_once(inline_bytes, serve, tmp_path):
    plan = tmp_path / "faults.yaml"
    plan.write_text(yaml.safe_dump({"batches": [{"first": 1, "expire_after": 3}]}))
    url = serve("--faults", str(plan))
    source = write_csv(tmp_path / "t.csv", ticket_rows(10))
    spec = make_spec(source, model=MODEL, route="gemini-batch", route_options=_options(url, inline_bytes=inline_bytes),
                     fallback={"route": "echo"}, retry={"max_attempts": 3, "backoff_seconds": 0})  # fmt: skip
    store = Store(str(tmp_path / "client.db"))
    load_job(store, spec, SystemClock())
    status = _run(store, "tickets")
    assert status.counts == {"succeeded": 10}
    with store.begin() as conn:
        where = dict(conn.execute(sa.select(requests.c.lane_reason, sa.func.count()).group_by(requests.c.lane_reason)).all())
        sent = conn.execute(sa.select(sa.func.count()).select_from(attempts).where(attempts.c.route == "gemini-batch")).scalar_one()
    assert where == {None: 3, "batch_expired on gemini-batch": 7}
    assert sent == 10  # one batch: none of the seven was sent to Gemini again


@pytest.mark.parametrize(("state", "code"), [("BATCH_STATE_EXPIRED", "batch_expired"), ("BATCH_STATE_SUCCEEDED", "deadline_exceeded")])
def test_a_deadline_exceeded_line_is_out_of_time_only_in_a_batch_that_expired(gemini_api, state, code):
    # In a batch that ran to its end, DEADLINE_EXCEEDED is that request's own timeout: retried
    # as the retry policy says, not sent to the fallback for it.
    late = {"error": {"code": 504, "message": "not run before the batch expired", "status": "DEADLINE_EXCEEDED"}, "metadata": {"key": "b"}}
    _Gemini.batch = _ended([{"response": SENT, "metadata": {"key": "a"}}, late], state)
    _Gemini.masks = "ignored"

    async def go():
        route = create_route("gemini-batch", _options(gemini_api))
        try:
            return {o.custom_id: o for o in [o async for o in route.results("batches/b1")]}
        finally:
            await route.aclose()

    by_key = asyncio.run(go())
    assert by_key["a"].ok
    assert (by_key["b"].ok, by_key["b"].error_code, by_key["b"].retryable) == (False, code, True)
    assert by_key["b"].error_message == "not run before the batch expired"  # the provider's words, kept


def test_a_responses_file_deleted_at_the_provider_is_said_gone_by_name(serve, tmp_path, monkeypatch):
    # A 404 on the download is the file gone there (the engine gives the batch up after a
    # grace, engine/batches.py `_not_read`), not a download that broke off (read again).
    from google import genai

    from lowtide.engine.results_window import results_gone

    url = serve()
    monkeypatch.setenv(KEY_ENV, "test-key")

    async def go():
        route = create_route("gemini-batch", _options(url, inline_bytes=0))  # a file batch
        try:
            name = await route.submit("job-1.d1", [Request.chat(f"r{i}", MODEL, [{"role": "user", "content": "hi"}]) for i in range(2)])
            for _ in range(200):  # the server's fast clock ends it within a few polls
                if (await route.poll(name)).ended:
                    break
                await asyncio.sleep(0.02)
            client = genai.Client(api_key="test-key", http_options={"base_url": url})
            responses = client.batches.get(name=name).dest.file_name
            client.files.delete(name=responses)
            try:
                read = [o async for o in route.results(name)]
            except Exception as err:  # what the engine is told: judged below
                return responses, err
            raise AssertionError(f"read {read} from a deleted file")
        finally:
            await route.aclose()

    responses, err = asyncio.run(go())
    assert responses and f"not found) for file {responses}, the results of batch" in str(err) and results_gone(err)
