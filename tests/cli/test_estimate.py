"""`lowtide estimate`, in-process through Typer's CliRunner, checked against hand computations.

TIKTOKEN_CACHE_DIR is set empty so the counts are the documented approximation on every
machine, whether or not tiktoken and its files happen to be there.
"""

from __future__ import annotations

import csv
import json
import math
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lowtide.cli import app
from tests.conftest import write_csv

ROOT = Path(__file__).resolve().parents[2]
ENV = {"COLUMNS": "200", "TIKTOKEN_CACHE_DIR": "", "LOWTIDE_PRICES": ""}


def estimate(*args: str):
    return CliRunner().invoke(app, ["estimate", *map(str, args)], env=ENV)


def approx(text: str) -> int:
    return math.ceil(len(text) / 4)


def write_job(folder: Path, rows: list[dict], **extra) -> Path:
    write_csv(folder / "tickets.csv", rows)
    spec = {
        "name": "tickets",
        "source": {"path": "tickets.csv", "id_column": "ticket_id"},
        "template": {"system": "Classify.", "user": "Ticket: {{ body }}"},
        "model": "gpt-4o-mini",
        "route": "openai-batch",
        "params": {"max_tokens": 100},
        **extra,
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


# Four rows whose user message "Ticket: " + body is 16 characters: 4 tokens.
# A request: system "Classify." 9 chars = 3 tokens, + 3; user 4 + 3; reply 3 = 16 tokens.
FOUR = [{"ticket_id": f"T{i}", "body": f"body-{i:03d}"} for i in range(4)]


def test_help_has_an_example():
    result = estimate("--help")
    assert result.exit_code == 0, result.output
    assert "Example" in result.output and "lowtide estimate" in result.output


def test_openai_batch_on_gpt_4o_mini_against_a_hand_computation(tmp_path):
    spec = write_job(tmp_path, FOUR)
    result = estimate(spec, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"] == 4 and report["counted_rows"] == 4 and not report["extrapolated"]
    assert report["input_tokens"] == 4 * 16 == 64
    assert report["output_tokens"] == 4 * 100
    assert report["token_count"]["exact"] is False
    lines = {r["route"]: r for r in report["routes"]}
    assert list(lines) == ["openai", "openai (flex)", "openai-batch", "openai-compatible"]
    # real time: 64 × 0.15 + 400 × 0.60 = 9.6 + 240 = 249.6 per M
    assert Decimal(lines["openai"]["usd"]) == Decimal("0.0002496")
    # batch: 64 × 0.075 + 400 × 0.30 = 4.8 + 120 = 124.8 per M
    batch = lines["openai-batch"]
    assert batch["this_job"] and Decimal(batch["usd"]) == Decimal("0.0001248")
    assert Decimal(batch["saving_usd"]) == Decimal("0.0001248") and batch["saving_percent"] == 50
    assert batch["latency"] == "up to 24 h"
    assert lines["openai (flex)"]["usd"] is None and "no flex price" in lines["openai (flex)"]["note"]
    assert lines["openai-compatible"]["usd"] is None
    assert report["prices"]["catalog_date"]


def test_the_text_report(tmp_path):
    result = estimate(write_job(tmp_path, FOUR))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert 'estimate for job "tickets": 4 rows; model gpt-4o-mini, route openai-batch' in text
    assert "input:  64 tokens (approximation: characters / 4" in text
    assert "output: 400 tokens assumed (the output limit (100) per request: an upper bound" in text
    assert "openai-batch ◀ this job" in text
    assert "$0.000125" in text and "(50%)" in text and "$0.000250" in text
    assert "genai-prices" in text and "derived by lowtide" in text


def test_sample_extrapolates_and_says_so(tmp_path):
    rows = FOUR + [{"ticket_id": f"U{i}", "body": "x" * 40} for i in range(4)]  # longer, not sampled
    result = estimate(write_job(tmp_path, rows), "--sample", "2", "--json")
    report = json.loads(result.stdout)
    assert report["rows"] == 8 and report["counted_rows"] == 2 and report["extrapolated"]
    assert report["input_tokens"] == 16 * 8  # 2 rows of 16, times 8 / 2
    text = estimate(write_job(tmp_path, rows), "--sample", "2").stdout
    assert "8 rows, extrapolated from the first 2" in text


def test_output_tokens_option(tmp_path):
    report = json.loads(estimate(write_job(tmp_path, FOUR), "--output-tokens", "5", "--json").stdout)
    assert report["output_tokens"] == 20
    # batch: 64 × 0.075 + 20 × 0.30 = 4.8 + 6 = 10.8 per M
    assert Decimal(next(r for r in report["routes"] if r["this_job"])["usd"]) == Decimal("0.0000108")


def test_anthropic_batch_rows(tmp_path):
    spec = write_job(tmp_path, FOUR, model="claude-haiku-4-5-20251001", route="anthropic-batch")
    report = json.loads(estimate(spec, "--json").stdout)
    lines = {r["route"]: r for r in report["routes"]}
    assert list(lines) == ["anthropic", "anthropic-batch", "openai-compatible"]
    # real time: 64 × 1 + 400 × 5 = 2,064 per M; batch half
    assert Decimal(lines["anthropic"]["usd"]) == Decimal("0.002064")
    assert Decimal(lines["anthropic-batch"]["usd"]) == Decimal("0.001032")


def test_a_price_file_changes_the_figures(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "openai:\n  gpt-4o-mini:\n    realtime: {input: 1, output: 1}\n    batch: {input: 0.5, output: 0.5}\n"
        "self_hosted:\n  gpt-4o-mini:\n    gpu_hourly_usd: 3.6\n    input_tokens_per_second: 64\n    output_tokens_per_second: 100\n",
        encoding="utf-8",
    )
    report = json.loads(estimate(write_job(tmp_path, FOUR), "--prices", prices, "--json").stdout)
    lines = {r["route"]: r for r in report["routes"]}
    assert Decimal(lines["openai-batch"]["usd"]) == Decimal("0.000232")  # 464 tokens × 0.5 per M
    # self-hosted: 64 / 64 + 400 / 100 = 5 s at 3.60 an hour = 0.005
    assert Decimal(lines["openai-compatible"]["usd"]) == Decimal("0.005")
    assert lines["openai-compatible"]["duration_seconds"] == 5.0
    assert report["prices"]["overrides"] == [str(prices)]


def test_a_bad_price_file_is_refused_with_its_line(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("openai:\n  gpt-4o-mini:\n    realtime: {input: 1, ouput: 1}\n", encoding="utf-8")
    result = estimate(write_job(tmp_path, FOUR), "--prices", prices)
    assert result.exit_code == 2
    assert f"{prices} line 3: unknown key `openai.gpt-4o-mini.realtime.ouput`" in result.output


def test_an_unknown_model_is_reported_as_unknown(tmp_path):
    report = json.loads(estimate(write_job(tmp_path, FOUR, model="gpt-99"), "--json").stdout)
    own = next(r for r in report["routes"] if r["this_job"])
    assert own["usd"] is None and '"gpt-99" is not in the price catalog' in own["note"]


def test_rows_submit_would_refuse_are_counted_and_shown(tmp_path):
    rows = FOUR + [{"ticket_id": "T9", "body": ""}]
    spec = write_job(tmp_path, rows)
    report = json.loads(estimate(spec, "--json").stdout)
    assert report["refused_rows"] == 1 and report["input_tokens"] == 64
    assert 'column "body" is empty' in report["problems"][0]
    result = estimate(spec)
    assert result.exit_code == 0
    assert "1 of the 5 rows counted would be refused by `lowtide submit`" in result.output


def test_a_bad_spec_exits_with_a_usage_error(tmp_path):
    spec = write_job(tmp_path, FOUR, template={"user": "{{ nope }}"})
    result = estimate(spec)
    assert result.exit_code == 2
    assert 'uses "nope"' in result.output


def test_the_embedded_model_example():
    spec = ROOT / "examples" / "classify-tickets.yaml"
    result = estimate(spec, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    data = yaml.safe_load(spec.read_text(encoding="utf-8"))
    with (ROOT / "examples" / "tickets.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    system = data["template"]["system"].removesuffix("\n")  # Jinja drops one trailing newline
    expected = sum(
        approx(system) + 3 + approx(f"Ticket ({r['channel']}): {r['body']}\nCategory:") + 3 + 3 for r in rows
    )
    assert report["rows"] == len(rows)
    assert report["input_tokens"] == expected
    assert report["output_tokens"] == len(rows) * data["params"]["max_tokens"]
    own = next(r for r in report["routes"] if r["this_job"])
    assert own["route"] == "local" and own["usd"] == "0" and "priced at 0" in own["note"]
    unknown = [r for r in report["routes"] if not r["this_job"]]
    assert [r["route"] for r in unknown] == ["real time", "batch"]
    assert all(r["usd"] is None for r in unknown)


@pytest.mark.parametrize("flag", [[], ["--json"]])
def test_the_example_prints_without_error(flag):
    result = estimate(ROOT / "examples" / "classify-tickets.yaml", *flag)
    assert result.exit_code == 0, result.output


# ---- the cost curve and route: auto ----------------------------------------------------

LONG_SYSTEM = "Classify the ticket into billing, shipping or other. " * 100  # 5,300 chars: 1,325 tokens


def test_the_cost_curve_per_tier_with_a_prompt_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./lowtide.db: the priors
    spec = write_job(tmp_path, FOUR, model="gpt-5-mini", template={"system": LONG_SYSTEM, "user": "Ticket: {{ body }}"})
    report = json.loads(estimate(spec, "--json").stdout)
    tiers = {t["tier"]: t for t in report["tiers"]}
    assert list(tiers) == ["real time", "real time + cache", "flex", "batch", "batch + prompt cache", "self-hosted"]
    prefix = approx(LONG_SYSTEM.removesuffix("\n"))
    assert prefix >= 1024
    inp, out = report["input_tokens"], report["output_tokens"]
    # gpt-5-mini today (genai-prices): 0.25 / cached 0.025 / out 2; batch and flex half
    realtime = (Decimal(inp) * Decimal("0.25") + Decimal(out) * 2) / 10**6
    assert Decimal(tiers["real time"]["usd"]) == realtime
    reads = prefix * 3  # every request but the first reads the prefix
    cached = (Decimal(inp - reads) * Decimal("0.25") + Decimal(reads) * Decimal("0.025") + Decimal(out) * 2) / 10**6
    assert Decimal(tiers["real time + cache"]["usd"]) == cached
    assert Decimal(tiers["batch"]["usd"]) == realtime / 2 and Decimal(tiers["batch + prompt cache"]["usd"]) == cached / 2
    assert f"{prefix:,}-token shared prefix read from the cache by 3 requests" in tiers["batch + prompt cache"]["note"]
    # waits: priors until the store has measured the route
    assert tiers["batch"]["wait_p95_seconds"] == 86400 and tiers["batch"]["wait_basis"].startswith("prior: OpenAI")
    assert tiers["real time"]["wait_p95_seconds"] == 4 * 2.0  # 2 s a request in effect, 4 requests
    assert tiers["self-hosted"]["usd"] is None and report["auto"] is None


def test_max_wait_says_which_tier_auto_would_take(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_job(tmp_path, FOUR, model="gpt-5-mini")
    report = json.loads(estimate(spec, "--json", "--max-wait", "1d").stdout)
    assert report["auto"]["route"] == "openai" and report["auto"]["route_options"] == {"service_tier": "flex"}
    assert report["auto"]["reason"].startswith("openai (flex): p95 40 s fits 24 h")
    short = json.loads(estimate(spec, "--json", "--max-wait", "5s").stdout)["auto"]
    assert short["route"] is None and "the fastest, openai, takes 8 s" in short["refused"]
    text = estimate(spec, "--max-wait", "2h").stdout
    assert "cost curve" in text and "auto, max_wait 2h (2 h): openai (flex): p95 40 s fits 2 h" in text
    bad = estimate(spec, "--max-wait", "soon")
    assert bad.exit_code == 2 and "--max-wait: 'soon' is not a duration" in bad.output


def test_an_auto_spec_is_advised_over_its_own_candidates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    spec = write_job(tmp_path, FOUR, model="gpt-5-mini", route="auto",
                     auto={"max_wait": "1d", "candidates": [{"route": "openai-batch"}, {"route": "openai"}]})  # fmt: skip
    report = json.loads(estimate(spec, "--json").stdout)
    assert report["auto"]["max_wait"] == "1d (the spec's)"
    assert report["auto"]["route"] == "openai-batch" and report["auto"]["next_tier_up"] == "openai"
    assert report["auto"]["chain"] == ["openai"]


def test_an_auto_job_runs_on_its_pick_not_on_a_route_called_auto(tmp_path, monkeypatch):
    # "auto" is no route: the estimate marks the candidate auto takes as this job's line,
    # priced, and never lists an unpriced "auto" line ("no price rule for route auto").
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    candidates = [{"route": "openai-batch"}, {"route": "openai", "route_options": {"service_tier": "flex"}}, {"route": "openai"}]
    spec = write_job(tmp_path, FOUR, model="gpt-5-mini", route="auto", auto={"max_wait": "2h", "candidates": candidates})
    report = json.loads(estimate(spec, "--json").stdout)
    assert report["auto"]["label"] == "openai (flex)"
    assert "auto" not in [r["route"] for r in report["routes"]]
    mine = [r for r in report["routes"] if r["this_job"]]
    assert [(r["route"], r["tier"]) for r in mine] == [("openai (flex)", "flex")] and mine[0]["usd"] is not None
    text = estimate(spec).stdout
    assert "openai (flex) ◀ this job" in text and "auto ◀" not in text
    # No candidate fits: the job would run nowhere, so no line is this job's.
    spec = write_job(tmp_path, FOUR, model="gpt-5-mini", route="auto", auto={"max_wait": "5s", "candidates": candidates})
    report = json.loads(estimate(spec, "--json").stdout)
    assert report["auto"]["route"] is None and not any(r["this_job"] for r in report["routes"])


def test_a_db_that_names_no_store_is_not_made_one(tmp_path, monkeypatch):
    # "Nothing is stored": a --db without a store gets the priors; estimate made the file.
    monkeypatch.chdir(tmp_path)
    spec = write_job(tmp_path, FOUR)
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "none.db"), "estimate", str(spec), "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    batch = next(t for t in json.loads(result.stdout)["tiers"] if t["tier"] == "batch")
    assert batch["wait_basis"].startswith("prior: OpenAI")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "tickets.csv"]


def test_a_request_asking_n_answers_is_assumed_at_n_times_the_limit_and_says_so(tmp_path):
    result = estimate(write_job(tmp_path, FOUR, params={"max_tokens": 100, "n": 8}))
    assert result.exit_code == 0, result.output
    assert "output: 3,200 tokens assumed (the output limit (100) × 8 answers (n) per request: an upper bound" in result.stdout


def test_rows_with_their_own_output_limit_are_assumed_at_it_and_say_so(tmp_path):
    # The label named the spec's params.max_tokens (5), though each row's own was counted.
    rows = [row | {"mt": 50} for row in FOUR]
    result = estimate(write_job(tmp_path, rows, params={"max_tokens": 5}, param_columns={"max_tokens": "mt"}))
    assert result.exit_code == 0, result.output
    assert "output: 200 tokens assumed (each request's own output limit × the answers it asks for (n): an upper bound" in result.stdout


def test_an_embedding_job_assumes_no_output_and_its_json_says_so(tmp_path):
    rows = [{"ticket_id": f"D{i}", "body": f"document {i}"} for i in range(3)]
    spec = write_job(tmp_path, rows, template={"user": "{{ body }}"}, model="text-embedding-3-small", endpoint="embeddings",
                     params={"dimensions": 8}, budget_usd=5)  # fmt: skip
    result = estimate(spec, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["output_tokens"], report["output_basis"]) == (0, "none: billed by input tokens only")


def test_images_are_counted_at_the_most_one_is_billed_and_say_so(tmp_path):
    # An image by URL was not counted at all (its text parts only): gpt-4o-mini bills up to
    # 2,833 + 8 tiles x 5,667 = 48,169 tokens for one (OpenAI's images guide).
    rows = [{**r, "img": f"https://example.com/{i}.png"} for i, r in enumerate(FOUR)]
    spec = write_job(tmp_path, rows, template={"system": "Classify.", "user": "Ticket: {{ body }}", "images": [{"column": "img"}]})
    report = json.loads(estimate(spec, "--json").stdout)
    assert (report["images"], report["image_tokens"]) == (4, 4 * 48_169)
    assert report["input_tokens"] == 4 * 16 + 4 * 48_169
    batch = next(r for r in report["routes"] if r["this_job"])
    assert Decimal(batch["usd"]) == (Decimal(4 * 16 + 4 * 48_169) * Decimal("0.075") + 400 * Decimal("0.30")) / 1_000_000
    text = estimate(spec).stdout
    assert "of which 192,676 for 4 image(s), each at the most one is billed: 48,169 tokens" in text


def test_a_pdf_is_said_not_counted(tmp_path):
    rows = [{**r, "doc": "https://example.com/a.pdf"} for r in FOUR]
    spec = write_job(tmp_path, rows, model="claude-haiku-4-5", route="anthropic-batch",
                     template={"system": "Classify.", "user": "Ticket: {{ body }}", "files": [{"column": "doc"}]})  # fmt: skip
    result = estimate(spec, "--json")
    report = json.loads(result.stdout)
    assert report["unbounded_requests"] == 4 and "PDF" in report["unbounded"]
    assert "NOT counted: what 4 request(s) hold beyond text" in estimate(spec).stdout


def test_requests_that_write_a_prompt_cache_are_priced_at_the_write_rate(tmp_path):
    # anthropic-batch with cache_prefix writes each system prompt with the 1-hour TTL: 2x input.
    spec = write_job(tmp_path, FOUR, model="claude-haiku-4-5", route="anthropic-batch", route_options={"cache_prefix": True})
    report = json.loads(estimate(spec, "--json").stdout)
    assert (report["input_tokens"], report["cache_write_tokens"], report["cache_write_ttl"]) == (64, 64, "1h")
    batch = next(r for r in report["routes"] if r["this_job"])
    assert Decimal(batch["usd"]) == (64 * Decimal("1") + 400 * Decimal("2.5")) / 1_000_000  # batch: write 1h 1.0, output 2.5
