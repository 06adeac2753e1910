"""`lowtide prices MODEL`: what applies on a date and where each tier comes from."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lowtide.cli import app

ENV = {"COLUMNS": "250", "LOWTIDE_PRICES": ""}


def prices(*args: str):
    return CliRunner().invoke(app, ["prices", *map(str, args)], env=ENV)


def test_before_the_packages_batch_history_batch_is_derived_and_says_so():
    result = prices("gpt-4o-mini-2024-07-18", "--date", "2026-03-01", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["entry"] == "gpt-4o-mini" and data["date"] == "2026-03-01"
    assert data["tiers"]["realtime"]["input"] == "0.15" and "genai-prices" in data["tiers"]["realtime"]["from"]
    batch = data["tiers"]["batch"]
    assert (batch["input"], batch["cached_input"], batch["output"]) == ("0.075", "0.0375", "0.30")
    assert "derived.openai.batch" in batch["from"] and "platform.openai.com/docs/guides/batch" in batch["from"]
    assert data["not_offered"] == ["flex", "priority"]


def test_after_it_the_packages_own_tiers_apply():
    data = json.loads(prices("gpt-5", "--date", "2026-11-15", "--json").stdout)
    assert set(data["tiers"]) == {"realtime", "batch", "flex", "priority"}
    assert all("genai-prices" in t["from"] and "derived" not in t["from"] for t in data["tiers"].values())
    assert data["tiers"]["priority"]["output"] == "20"


def test_the_table_names_the_source_of_each_tier():
    result = prices("claude-sonnet-4-20250514", "--date", "2026-03-01")
    assert result.exit_code == 0, result.output
    assert "anthropic claude-sonnet-4-20250514 → claude-sonnet-4-0, prices of 2026-03-01" in result.stdout
    assert "derived.anthropic.batch" in result.stdout and "not offered: flex, priority" in result.stdout


def test_a_users_entry_wins_and_is_named(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("openai:\n  gpt-4o-mini:\n    realtime: {input: 9, output: 9}\n", encoding="utf-8")
    data = json.loads(prices("gpt-4o-mini", "--prices", mine, "--json").stdout)
    assert data["tiers"] == {"realtime": {"input": "9", "output": "9", "cached_input": None, "cache_write_5m": None,
                                          "cache_write_1h": None, "from": f"price file {mine}: openai.gpt-4o-mini.realtime"}}  # fmt: skip
    assert data["not_offered"] == ["batch", "flex", "priority"]


def test_an_unknown_model_or_bad_date_is_refused_with_the_fix():
    unknown = prices("gpt-99-ultra", "--date", "2026-03-01")
    assert unknown.exit_code == 2
    assert 'model "gpt-99-ultra" has no openai or anthropic or google or groq or together or novita or doubleword or mistral or openrouter or azure or aws price on 2026-03-01' in unknown.stderr
    assert "add it to a price file" in unknown.stderr
    bad = prices("gpt-4o", "--date", "2026-13-01")
    assert bad.exit_code == 2 and '--date "2026-13-01" is not a date; give YYYY-MM-DD' in bad.stderr
    wrong = prices("gpt-4o", "--provider", "acme")
    assert wrong.exit_code == 2 and '--provider "acme" is not known; use one of openai, anthropic, google' in wrong.stderr
