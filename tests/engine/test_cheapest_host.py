"""`route: auto` among several providers of one open model (openai-compatible-batch's
profiles), and `lowtide estimate` quoting each: price, expected wait, why taken or not.

openai/gpt-oss-120b is one id at Groq, Together and Novita alike. genai-prices has Groq's
batch price for it (50% from 2026-10-14); Together and Novita state no flat discount, so
their batch tier is unknown until a price file gives it (here: a file of the test's own).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from typer.testing import CliRunner

from lowtide.cli import app
from lowtide.core.errors import SpecError
from lowtide.engine import turnaround
from lowtide.engine.loader import load_job
from lowtide.store.schema import dispatches, events, jobs
from tests.conftest import make_spec, write_csv

MODEL = "openai/gpt-oss-120b"
NAME = "openai-compatible-batch"
HOSTS = [{"route": NAME, "route_options": {"profile": p}} for p in ("groq", "together", "novita")]
# Together's batch price for the test's model, as a user's price file gives it (USD / 1M tokens)
TOGETHER_BATCH = {"together": {MODEL: {"realtime": {"input": 0.15, "output": 0.6}, "batch": {"input": 0.05, "output": 0.2}}}}
ROWS = [{"ticket_id": f"T{i}", "body": f"ticket body number {i}"} for i in range(20)]


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    """The hosts' keys where their routes read them (a route is made to check the spec; nothing is sent)."""
    for env in ("GROQ_API_KEY", "TOGETHER_API_KEY", "NOVITA_API_KEY"):
        monkeypatch.setenv(env, "k")


def _prices(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _spec(tmp_path: Path, candidates: list[dict], max_wait: str = "1d"):
    source = write_csv(tmp_path / "t.csv", ROWS)
    return make_spec(source, model=MODEL, route="auto", params={"max_tokens": 50},
                     auto={"max_wait": max_wait, "candidates": candidates})  # fmt: skip


def _choice(store) -> tuple[str, dict, str]:
    with store.begin() as conn:
        spec = json.loads(conn.execute(sa.select(jobs.c.spec)).scalar_one())
        reason = conn.execute(sa.select(events.c.message).where(events.c.kind == "route_choice")).scalar_one()
    return spec["route"], spec["route_options"], reason


def test_auto_takes_the_cheapest_host_of_the_model_and_says_why(store, clock, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWTIDE_PRICES", str(_prices(tmp_path, TOGETHER_BATCH)))
    load_job(store, _spec(tmp_path, HOSTS[:2]), clock)
    route, options, reason = _choice(store)
    assert (route, options) == (NAME, {"profile": "together"})
    # Together's file price ($0.05/$0.20) under Groq's genai-prices batch price ($0.075/$0.30)
    assert reason.startswith(f"{NAME}:together: p95 24 h fits 24 h (prior: Together:")
    assert f"vs {NAME}:groq $" in reason


def test_a_host_without_a_batch_price_is_refused_by_name_with_how_to_add_one(store, clock, tmp_path, monkeypatch):
    monkeypatch.setenv("LOWTIDE_PRICES", "")
    with pytest.raises(SpecError) as err:
        load_job(store, _spec(tmp_path, HOSTS[:2]), clock)
    message = str(err.value)
    assert f"auto.candidates[1] ({NAME}:together) has no price" in message
    assert f"add `batch:` prices for {MODEL} under `together:` in a price file" in message
    with store.begin() as conn:  # nothing stored
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def test_a_candidate_its_card_contradicts_is_refused_naming_the_fix(store, clock, tmp_path):
    # Fireworks' batch API is not the openai SDK's: no profile (docs/batch-routes.md)
    with pytest.raises(SpecError) as err:
        load_job(store, _spec(tmp_path, [*HOSTS[:1], {"route": NAME, "route_options": {"profile": "fireworks"}}]), clock)
    assert (f"auto.candidates[1] ({NAME}): unknown route_options.profile 'fireworks'; "
            "known: groq, together, novita, doubleword") in str(err.value)  # fmt: skip
    looser = {"route": NAME, "route_options": {"profile": "together", "max_bytes": 150 * 2**20}}
    with pytest.raises(SpecError) as err:
        load_job(store, _spec(tmp_path, [*HOSTS[:1], looser]), clock)
    assert "auto.candidates[1]: openai-compatible-batch:together: route_options.max_bytes is 157,286,400, over " in str(err.value)
    assert "give at most 104,857,600" in str(err.value)
    with store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 0


def _estimate(tmp_path: Path, candidates: list[dict], *args: str, prices: dict | None = None):
    source = write_csv(tmp_path / "tickets.csv", ROWS)
    spec = {
        "name": "tickets", "source": {"path": source.name, "id_column": "ticket_id"},
        "template": {"system": "Classify.", "user": "Ticket: {{ body }}"}, "model": MODEL, "route": "auto",
        "params": {"max_tokens": 50}, "auto": {"max_wait": "1d", "candidates": candidates},
    }  # fmt: skip
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    env = {"COLUMNS": "240", "TIKTOKEN_CACHE_DIR": "", "LOWTIDE_PRICES": str(_prices(tmp_path, prices)) if prices else ""}
    return CliRunner().invoke(app, ["--db", str(tmp_path / "none.db"), "estimate", str(path), *args], env=env)


def test_estimate_quotes_each_host_with_price_wait_and_why(tmp_path):
    result = _estimate(tmp_path, HOSTS, "--json", prices=TOGETHER_BATCH)
    assert result.exit_code == 0, result.output
    auto = json.loads(result.output)["auto"]
    quoted = {q["label"]: q for q in auto["candidates"]}
    assert list(quoted) == [f"{NAME}:groq", f"{NAME}:together", f"{NAME}:novita"]
    # Novita has neither a batch price nor a turnaround prior: reported, not dropped, so auto refuses
    assert quoted[f"{NAME}:novita"]["usd"] is None
    assert quoted[f"{NAME}:novita"]["why"].startswith("no price: no batch price for openai/gpt-oss-120b at novita")
    assert auto["route"] is None and f"auto.candidates[2] ({NAME}:novita) has no price" in auto["refused"]
    assert quoted[f"{NAME}:groq"]["wait_p95_seconds"] == 86400 and quoted[f"{NAME}:groq"]["usd"] is not None


def test_estimate_table_names_the_chosen_host_and_why_the_others_were_not(tmp_path):
    result = _estimate(tmp_path, HOSTS[:2], "--max-wait", "1d", prices=TOGETHER_BATCH)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "auto candidates" in text
    lines = {ln.split()[1]: ln for ln in text.splitlines() if ln.strip().startswith(("│ openai-compatible", "┃ openai-compatible"))}
    assert "chosen: the cheapest that fits" in lines[f"{NAME}:together"]
    assert f"dearer than {NAME}:together" in lines[f"{NAME}:groq"]
    assert "auto, max_wait 1d" in text and f"{NAME}:together: p95 24 h fits 24 h" in text


def _batches(store, profile: str, seconds: float, n: int = 3) -> None:
    """An earlier job's `n` ended batches on `profile`, each taking `seconds`."""
    spec = json.dumps({"route": NAME, "route_options": {"profile": profile}})
    with store.begin() as conn:
        job_id = conn.execute(sa.insert(jobs).values(name=f"earlier-{profile}", spec=spec, route=NAME, state="finished",
                                                     created_at=0, updated_at=0)).inserted_primary_key[0]  # fmt: skip
        for i in range(n):
            conn.execute(sa.insert(dispatches).values(
                job_id=job_id, route=NAME, kind="batch", key=f"{profile}-{i}", state="ended", size=10, polls=0,
                cancel_requested=False, created_at=1000, submitted_at=1000, ended_at=1000 + seconds, model=MODEL,
            ))  # fmt: skip


def test_each_host_is_measured_apart_and_waits_by_its_own_card_until_then(store):
    _batches(store, "groq", 600.0)
    with store.begin() as conn:
        groq = turnaround.expected(conn, NAME, {"profile": "groq"}, MODEL, "batch", 100)
        together = turnaround.expected(conn, NAME, {"profile": "together"}, MODEL, "batch", 100)
        novita = turnaround.expected(conn, NAME, {"profile": "novita"}, MODEL, "batch", 100)
    assert (groq.p95, groq.basis) == (600.0, "measured: 3 batches")
    assert together.p95 == 86400 and together.basis.startswith("prior: Together:")  # Groq's batches say nothing of Together
    assert novita.p95 is None and novita.basis == f"no batches of {NAME}:novita measured yet and no prior for it"
