"""Bad input to embedding jobs: each refused before anything is stored (file, row, field,
fix), or failed per row with the reason; nothing stored is lost."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from lowtide.core.clock import ManualClock
from lowtide.core.errors import InputError
from lowtide.core.spec import build_spec
from lowtide.core.types import Outcome, Usage
from lowtide.engine.loader import load_job
from lowtide.engine.packs import unpack
from lowtide.store.db import Store
from lowtide.store.payloads import payload_text
from lowtide.store.schema import attempts, requests
from tests.conftest import drive_to_end, write_csv
from tests.embeddings.helpers import docs, echo_reference, embed_spec
from tests.routes.conftest import KEY_ENV, _run, serve  # noqa: F401  (serve: the fixture)


def count(store) -> int:
    with store.begin() as conn:
        return conn.execute(select(func.count()).select_from(requests)).scalar_one()


def test_whitespace_text_is_refused_naming_file_row_and_column(sqlite_store, clock, tmp_path):
    rows = docs(3)
    rows[1]["text"] = "   "
    source = write_csv(tmp_path / "docs.csv", rows)
    with pytest.raises(InputError) as err:
        load_job(sqlite_store, build_spec(embed_spec(source)), clock)
    said = str(err.value)
    assert "docs.csv row 2" in said and 'column "text" is empty' in said and "nothing was stored" in said
    assert count(sqlite_store) == 0


def test_a_template_rendering_only_whitespace_is_refused(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "docs.csv", [{"doc_id": "a", "text": "x", "pad": " "}])
    data = embed_spec(source, template={"user": "{% if false %}{{ text }}{% endif %}{{ pad }}"})
    data["source"]["optional_columns"] = ["pad"]
    spec = build_spec(data)
    with pytest.raises(InputError) as err:
        load_job(sqlite_store, spec, clock)
    assert 'field "input"' in str(err.value) and "docs.csv row 1" in str(err.value) and "only whitespace" in str(err.value)


def test_an_input_over_the_token_limit_is_refused_with_its_count_or_cut_when_asked(sqlite_store, clock, tmp_path):
    rows = docs(2)
    rows[0]["text"] = "word " * 8000  # 40,000 characters: about 10,000 tokens, over 8,192
    source = write_csv(tmp_path / "docs.csv", rows)
    with pytest.raises(InputError) as err:
        load_job(sqlite_store, build_spec(embed_spec(source)), clock)
    said = str(err.value)
    assert "docs.csv row 1" in said and "10000 tokens (approximated: characters / 4, more outside ASCII)" in said and "at most 8192" in said and "truncate: true" in said
    assert count(sqlite_store) == 0
    status = drive_to_end(sqlite_store, build_spec(embed_spec(source, truncate=True)), clock)
    assert status.counts == {"succeeded": 2}
    with sqlite_store.begin() as conn:
        payload = json.loads(conn.execute(select(payload_text().label("payload")).where(requests.c.source_key == "doc-1")).scalar_one())
    assert len(payload["body"]["input"]) == 8192 * 4 and rows[0]["text"].startswith(payload["body"]["input"])


def test_a_japanese_input_under_the_limit_in_characters_over_4_but_over_it_in_tokens_is_refused(sqlite_store, clock, tmp_path):
    # 9,000 characters: 2,250 "tokens" as characters / 4, which passed; about 9,000 to 10,800
    # real ones (cl100k_base, Claude's), which the provider refuses. Now counted 11,250.
    rows = docs(2)
    rows[0]["text"] = ("注文した商品が二日遅れて届き、箱が破損していました。" * 400)[:9000]
    source = write_csv(tmp_path / "docs.csv", rows)
    with pytest.raises(InputError) as err:
        load_job(sqlite_store, build_spec(embed_spec(source)), clock)
    assert "docs.csv row 1" in str(err.value) and "11250 tokens" in str(err.value) and "at most 8192" in str(err.value)
    assert count(sqlite_store) == 0
    drive_to_end(sqlite_store, build_spec(embed_spec(source, truncate=True)), clock)
    with sqlite_store.begin() as conn:
        payload = json.loads(conn.execute(select(payload_text().label("payload")).where(requests.c.source_key == "doc-1")).scalar_one())
    cut = payload["body"]["input"]
    assert len(cut) == 8192 * 4 // 5 and rows[0]["text"].startswith(cut)  # 1.25 a character: 6,553 of them


@pytest.mark.parametrize(("model", "dims", "said"), [
    ("text-embedding-ada-002", 256, "does not take `dimensions`"),
    ("text-embedding-3-small", 4096, "at most 1536"),
    ("text-embedding-3-large", 0, "at least 1"),
])  # fmt: skip
def test_unsupported_dimensions_are_refused_by_the_spec(tmp_path, model, dims, said):
    with pytest.raises(InputError) as err:
        build_spec(embed_spec(tmp_path / "d.csv", model=model, params={"dimensions": dims}))
    assert said in str(err.value) and "params.dimensions" in str(err.value)


def test_a_parameter_the_sdk_does_not_know_is_refused_by_name(tmp_path):
    with pytest.raises(InputError) as err:
        build_spec(embed_spec(tmp_path / "d.csv", params={"normalize": True}))
    assert '"normalize" is not a parameter of /v1/embeddings' in str(err.value) and "dimensions, encoding_format, user" in str(err.value)


@pytest.mark.parametrize("route", ["echo", "openai-batch"])
@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens", "prompt"])
def test_a_key_of_text_generation_is_refused_on_any_route(tmp_path, route, key):
    """On a route that carries keys the SDK does not declare (openai-batch: a new field
    reaches the provider), a text generation key was carried too: every request of the job
    then failed at the provider, which takes no `max_tokens` for an embedding."""
    with pytest.raises(InputError, match=rf'"{key}" is not a parameter of /v1/embeddings'):
        build_spec(embed_spec(tmp_path / "d.csv", route=route, params={key: 16}))


def test_a_wrong_length_vector_from_the_backend_fails_its_rows(serve, tmp_path):  # noqa: F811
    # The upstream runs every request as another model (`--model`): echo then makes 16
    # numbers, where text-embedding-3-small's vectors have 1536.
    url = serve("--model", "some-other-model")
    source = write_csv(tmp_path / "docs.csv", docs(3))
    store = Store(str(tmp_path / "client.db"))
    spec = build_spec(embed_spec(source, route="openai-compatible", params={},
                                 route_options={"base_url": f"{url}/v1", "api_key_env": KEY_ENV}))  # fmt: skip
    load_job(store, spec, ManualClock())
    assert _run(store, "vectors").counts == {"failed": 3}
    with store.begin() as conn:
        errors = conn.execute(select(requests.c.error_code, requests.c.error_message)).all()
        billed = conn.execute(select(func.sum(attempts.c.input_tokens))).scalar_one()
    assert {e.error_code for e in errors} == {"bad_vector"}
    assert all("vector of 16 numbers; the job asks for 1536" in e.error_message for e in errors)
    assert billed > 0  # the provider billed the call: the ledger keeps it


def test_a_pack_answer_with_too_few_vectors_hands_no_vector_out():
    members = ["a", "b", "c"]
    data = [{"object": "embedding", "index": i, "embedding": echo_reference(t, 4)} for i, t in enumerate("ab")]
    outcome = Outcome("lt-pack-1-3-3", True, usage=Usage(input_tokens=9), response={"object": "list", "data": data, "model": "m"})
    rows = unpack(outcome, members, 4)
    assert [r.custom_id for r in rows] == members and not any(r.ok for r in rows)
    assert all(r.retryable and r.error_code == "bad_response" and "holds 2 vector(s)" in r.error_message for r in rows)


def test_a_failed_pack_is_retried_whole_and_only_once_more(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "docs.csv", docs(30))
    # A fresh store numbers the rows 1..30: the pack of all of them is lt-pack-1-30-30.
    spec = build_spec(embed_spec(source, route_options={"fail_attempts": {"lt-pack-1-30-30": 1}}))
    status = drive_to_end(sqlite_store, spec, clock)
    assert status.counts == {"succeeded": 30}
    with sqlite_store.begin() as conn:
        assert set(conn.scalars(select(requests.c.attempts))) == {2}


def test_only_the_failed_row_is_retried_without_packing(sqlite_store, clock, tmp_path):
    source = write_csv(tmp_path / "docs.csv", docs(5))
    spec = build_spec(embed_spec(source, packing=False, route_options={"fail_attempts": {"doc-3": 1}}))
    assert drive_to_end(sqlite_store, spec, clock).counts == {"succeeded": 5}
    with sqlite_store.begin() as conn:
        tries = dict(conn.execute(select(requests.c.source_key, requests.c.attempts)).all())
    assert tries == {"doc-1": 1, "doc-2": 1, "doc-3": 2, "doc-4": 1, "doc-5": 1}
