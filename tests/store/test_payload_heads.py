"""A job's payload head is stored once, each request's own part beside it, and every reader's
whole payload (store/payloads.py `payload_text`, `payload_chars`, `payload_bytes`) is the
text the loader renders, byte for byte, for every endpoint and kind of ask; a pruned payload,
a requeued version and a deleted job keep it so."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from lowtide.core.spec import build_spec
from lowtide.engine.loader import RowRenderer, check_job, load_job
from lowtide.engine.retention import PRUNED, delete_job, prune
from lowtide.store.payloads import payload_bytes, payload_chars, payload_text
from lowtide.store.schema import jobs, payload_heads, request_versions, requests
from tests.conftest import drive_to_end, make_spec, ticket_rows, write_csv

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}, "score": {"type": "integer"}}, "required": ["label", "score"]}
# name -> (the spec's keys besides make_spec's, whether its rows share a head: a body the
# loader builds per row, Anthropic's with its system prompt, is stored whole)
SPECS = {
    "chat with choices": ({"choices": ["billing", "technical", "account"]}, True),
    "chat with a schema and params": ({"response_schema": SCHEMA, "params": {"temperature": 0.2, "max_tokens": 64}}, True),
    "anthropic messages": ({"route": "anthropic-batch", "model": "claude-3-5-haiku-latest", "params": {"max_tokens": 64}}, False),
    "gemini": ({"route": "gemini-batch", "model": "gemini-2.0-flash"}, True),
    "responses": ({"endpoint": "/v1/responses", "params": {"max_output_tokens": 64}}, True),
    "embeddings": ({"endpoint": "/v1/embeddings", "model": "text-embedding-3-small", "template": {"user": "{{ body }}"}, "params": {}}, True),
}


def _spec(source, **more):
    """make_spec's job with `more`'s keys in place of its own (not merged: an embedding job
    has no system prompt nor max_tokens)."""
    data = {"name": "tickets", "source": {"path": str(source), "id_column": "ticket_id"}, "model": "test-model", "route": "echo",
            "template": {"system": "Classify the ticket.", "user": "Ticket: {{ body }}"}, "params": {"max_tokens": 256}}  # fmt: skip
    return build_spec(data | more)


def _rows() -> list[dict]:
    rows = ticket_rows(7)
    rows[3]["body"] = "Lieferung beschädigt — 注文した商品が届きません 🚚"  # bytes beyond characters
    return rows


@pytest.mark.parametrize("name", SPECS)
def test_every_reader_reads_the_payload_the_loader_renders(store, clock, tmp_path, monkeypatch, name):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("GEMINI_API_KEY", "test")
    more, shared = SPECS[name]
    spec = _spec(write_csv(tmp_path / "t.csv", _rows()), **more)
    load_job(store, spec, clock)
    template, source = check_job(spec)
    render = RowRenderer(spec, template, source)  # no head: each payload rendered whole
    want = {item["custom_id"]: item["payload"] for chunk in source.chunks() for item in map(render, chunk)}
    with store.begin() as conn:
        heads = conn.execute(sa.select(sa.func.count()).select_from(payload_heads)).scalar_one()
        got = conn.execute(sa.select(requests.c.custom_id, payload_text(), payload_chars(), payload_bytes(), requests.c.head_id)).all()
    assert heads == 1
    assert {cid: text for cid, text, *_ in got} == want
    assert all((chars, size) == (len(text), len(text.encode())) for _, text, chars, size, _ in got)
    assert {head is not None for *_, head in got} == {shared}  # a row keeps its own part alone, or its whole payload


def test_a_requeued_version_a_pruned_payload_and_a_deleted_job(store, clock, tmp_path):
    source = write_csv(tmp_path / "t.csv", _rows())
    drive_to_end(store, make_spec(source), clock)
    with store.begin() as conn:
        first = dict(conn.execute(sa.select(requests.c.id, payload_text())).all())
    load_job(store, make_spec(source, model="other-model"), clock, requeue_changed=True)
    with store.begin() as conn:
        kept = dict(conn.execute(sa.select(request_versions.c.request_id, payload_text(request_versions))).all())
        now = dict(conn.execute(sa.select(requests.c.id, payload_text())).all())
        assert conn.execute(sa.select(sa.func.count()).select_from(payload_heads)).scalar_one() == 2  # one per model
    assert kept == first and all('"other-model"' in text for text in now.values())
    drive_to_end(store, make_spec(source, model="other-model"), clock)
    clock.advance(86400 * 2)
    prune(store, clock, 86400)
    with store.begin() as conn:
        pruned = conn.execute(sa.select(requests.c.payload, requests.c.head_id, payload_text())).all()
    assert {(p, h, t) for p, h, t in pruned} == {(PRUNED, None, PRUNED)}
    delete_job(store, "tickets", clock)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(payload_heads)).scalar_one() == 0


def test_requests_stored_whole_before_m026_are_sent_and_answered_as_before(store, clock, tmp_path):
    """A store migrated by m026 keeps its rows whole (head_id NULL): they are sent as they
    are, beside rows stored since with a head, and answered as the same job stored with heads."""
    source = write_csv(tmp_path / "t.csv", _rows())
    mixed, headed = (make_spec(source, name=n, choices=["billing", "technical", "account"]) for n in ("mixed", "headed"))
    load_job(store, mixed, clock)
    load_job(store, headed, clock)
    with store.begin() as conn:
        whole = requests.c.job_id == sa.select(jobs.c.id).where(jobs.c.name == "mixed").scalar_subquery()
        conn.execute(requests.update().where(whole, requests.c.id % 2 == 0).values(payload=payload_text(), head_id=None))
        kinds = {h is None for (h,) in conn.execute(sa.select(requests.c.head_id).where(whole))}
    assert kinds == {True, False}
    assert drive_to_end(store, mixed, clock).counts == drive_to_end(store, headed, clock).counts == {"succeeded": 7}
    with store.begin() as conn:
        answers = conn.execute(
            sa.select(jobs.c.name, requests.c.source_key, requests.c.output, requests.c.input_tokens).join(jobs, jobs.c.id == requests.c.job_id)
        ).all()
    by_job = {name: {key: (out, tokens) for n, key, out, tokens in answers if n == name} for name in ("mixed", "headed")}
    assert by_job["mixed"] == by_job["headed"] and len(by_job["mixed"]) == 7
