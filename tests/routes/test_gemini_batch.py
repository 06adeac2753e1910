"""gemini-batch against `lowtide serve` run as a subprocess: the official google-genai SDK on
both sides of a real HTTP connection, inline and file batches, adoption, bad input."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from lowtide.core.clock import SystemClock
from lowtide.core.errors import LowtideError
from lowtide.core.types import Request
from lowtide.engine.loader import load_job
from lowtide.routes import create_route
from lowtide.store.db import Store
from lowtide.store.schema import attempts, dispatches, requests
from tests.conftest import make_spec, ticket_rows, write_csv
from tests.routes.conftest import KEY_ENV, _run

MODEL = "gemini-2.5-flash"


def _options(url: str, **more) -> dict:
    return {"base_url": url, "api_key_env": KEY_ENV, "poll_interval": [0.05, 0.2], **more}


@pytest.mark.parametrize("inline_bytes", [10 * 2**20, 0], ids=["inline", "file"])
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
        payload = conn.execute(sa.select(requests.c.payload).where(requests.c.custom_id == "T1003")).scalar_one()
        provider_ids = conn.execute(sa.select(dispatches.c.provider_id)).scalars().all()
        tiers = set(conn.execute(sa.select(attempts.c.tier)).scalars())
        usage = conn.execute(sa.select(sa.func.sum(attempts.c.input_tokens), sa.func.sum(attempts.c.cost_picousd),
                                       sa.func.sum(attempts.c.realtime_picousd))).one()  # fmt: skip
    assert outputs["T1003"] == "Ticket: ticket 1003 about shipping"  # echo, matched by key
    assert '"endpoint": "/v1/chat/completions"' in payload or '"endpoint":"/v1/chat/completions"' in payload  # stored as rendered
    assert len(provider_ids) == 3 and all(p.startswith("batches/") for p in provider_ids)  # 10 + 10 + 5
    assert tiers == {"batch"}
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
