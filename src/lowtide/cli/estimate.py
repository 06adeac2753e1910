"""`lowtide estimate`: what a job would cost and take on each route, before anything is sent.

Rows are streamed from the source and rendered exactly as `submit` renders them (the
engine's own row renderer); nothing is stored and no route is contacted.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape as markup_escape
from rich.progress import Progress, TextColumn, TimeElapsedColumn

from lowtide.cli.common import console, fail, out, state
from lowtide.cli.tables import Col, fitted_table
from lowtide.core.auto_spec import AUTO, duration_text, parse_duration
from lowtide.core.cards import CARDS
from lowtide.core.endpoints import EMBEDDINGS, MODERATIONS, NO_TEXT
from lowtide.core.errors import InputError, LowtideError, MissingStoreError
from lowtide.core.pricing import (
    PRICES_ENV,
    PROVIDERS,
    Catalog,
    Cost,
    Tier,
    attempt_cost,
    billing_of,
    load_catalog,
)
from lowtide.core.sources import Watermark
from lowtide.core.spec import JobSpec, load_spec
from lowtide.core.tokens import TokenCounter, counter_for
from lowtide.core.types import Usage
from lowtide.engine import advisor
from lowtide.engine.auto import Choice, Quote, money, wait_of
from lowtide.engine.counting import Count, count_rows
from lowtide.engine.watermarks import stored_watermark
from lowtide.store.db import Store

LATENCY = {
    Tier.REALTIME: "seconds per request",
    Tier.FLEX: "seconds to minutes per request",
    Tier.BATCH: "up to 24 h",
    Tier.FREE: "immediate",
}


@dataclass(frozen=True, slots=True)
class Line:
    route: str
    cost: Cost
    duration_s: Decimal | None
    latency: str
    this_job: bool


def estimate(
    spec_path: Annotated[Path, typer.Argument(help="The job spec (YAML).", show_default=False)],
    prices: Annotated[
        Path | None, typer.Option("--prices", help=f"A price file merged over the shipped catalog (default: ${PRICES_ENV}).")
    ] = None,
    sample: Annotated[
        int | None, typer.Option("--sample", min=1, help="Count only the first N rows and extrapolate to the rest.")
    ] = None,
    output_tokens: Annotated[
        int | None,
        typer.Option("--output-tokens", min=0, help="Assume this many output tokens per request (default: max_tokens)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimate as JSON.")] = False,
    max_wait: Annotated[
        str | None,
        typer.Option("--max-wait", help="Say which tier `route: auto` would take if the work may wait this long (90m, 2h, 1d)."),
    ] = None,
) -> None:
    """Estimate a job's tokens, cost and wait on each tier and route, before submitting it.

    Counts the input tokens of every rendered request (tiktoken for OpenAI models where its
    files are cached, else characters / 4, more outside ASCII; the output says which), each
    image at the most one image is billed on the model, and assumes max_tokens of output per
    request, an upper bound; a request that asks to write a prompt cache is priced at the
    write rate, and a PDF or audio, which cannot be measured before sending, is said apart.
    Prints the cost curve (real time, real time with a prompt cache, flex, batch, batch with
    a prompt cache, self-hosted) with each tier's expected wait, and with --max-wait (or a
    `route: auto` spec) the tier auto would take. Nothing is stored or sent.

    Example: lowtide estimate examples/classify-tickets.yaml --sample 1000 --max-wait 2h
    """
    try:
        spec = load_spec(spec_path)
        wait_text = max_wait
        try:
            wait = parse_duration(max_wait) if max_wait is not None else None
        except ValueError as err:
            raise InputError(f"--max-wait: {err}") from None
        if wait is None and spec.auto is not None:
            wait, wait_text = wait_of(spec, time.time()), f"{spec.auto.max_wait} (the spec's)"
        catalog = load_catalog(prices)
        first = spec.auto.candidates[0] if spec.auto is not None else None
        own = billing_of(first.route, first.route_options) if first else billing_of(spec.route, spec.route_options)
        provider = (own.provider if own else None) or catalog.provider_of(spec.model)
        counter = counter_for(spec.model, provider)
        count = _count(spec, str(spec_path), counter, sample, output_tokens, show=not as_json)
        with _measurements() as conn:
            points = advisor.curve(conn, spec, provider, count, catalog)
            pick = advisor.auto_pick(conn, spec, points, count, catalog, wait) if wait is not None else None
            quoted = advisor.candidate_quotes(conn, spec, count, catalog, wait, pick) if wait is not None and pick is not None else []
    except LowtideError as err:
        raise fail(err) from None
    usage = count.usage
    # A `route: auto` job runs where auto takes it (nowhere, when no candidate fits): "auto"
    # itself is no route and has no price.
    runs_on = (spec.route, spec.route_options)
    if spec.route == AUTO:
        runs_on = (pick.option.candidate.route, pick.option.candidate.route_options) if isinstance(pick, Choice) else None
    lines = _lines(spec, provider, usage, catalog, runs_on, count.cache_write_ttl)
    if as_json:
        report = _as_json(spec, count, counter, usage, lines, catalog, output_tokens)
        report["tiers"] = [_point_json(p) for p in points]
        report["auto"] = _pick_json(pick, wait, wait_text)
        if quoted:
            report["auto"]["candidates"] = [_quote_json(q) for q in quoted]
        print(json.dumps(report, indent=2))
    else:
        _print(spec, count, counter, usage, lines, catalog, output_tokens)
        _print_curve(points, pick, wait, wait_text)
        _print_quotes(quoted)


@contextmanager
def _measurements() -> Iterator[Any]:
    """A connection to the store for measured turnarounds, when there is one (--db, or
    ./lowtide.db); None otherwise (the priors). Nothing is stored: a --db that names no
    store is not made one."""
    try:
        store = Store(state.db, create=False)
    except MissingStoreError:
        yield None
        return
    try:
        with store.read() as conn:
            yield conn
    finally:
        store.close()


def _print_curve(points: list[advisor.Point], pick: Choice | str | None, wait: float | None, wait_text: str | None) -> None:
    rows = [
        [markup_escape(p.tier), markup_escape(p.route + _options_text(p.options)), _money(p.cost.usd), p.took.text(),
         markup_escape(p.took.basis), markup_escape(p.note)]
        for p in points
    ]  # fmt: skip
    cols = [Col("tier"), Col("route"), Col("cost", figure=True), Col("expected wait"), Col("basis", drop=1), Col("note", drop=2)]
    out.print(fitted_table(out, cols, rows, title="cost curve"))
    if isinstance(pick, Choice):
        out.print(f"auto, max_wait {wait_text} ({duration_text(wait or 0)}): {pick.reason}", markup=False)
    elif isinstance(pick, str):
        out.print(f"auto, max_wait {wait_text}: {pick}", markup=False)


def _print_quotes(quoted: list[Quote]) -> None:
    """An auto job's candidates: each one's price, expected wait and why it was taken or not."""
    if not quoted:
        return
    rows = [[markup_escape(q.option.label), _money(q.option.cost.usd), q.option.took.text(), markup_escape(q.verdict),
             markup_escape(q.option.took.basis)] for q in quoted]  # fmt: skip
    cols = [Col("candidate"), Col("cost", figure=True), Col("expected wait"), Col("why"), Col("wait basis", drop=1)]
    out.print(fitted_table(out, cols, rows, title="auto candidates"))


def _quote_json(q: Quote) -> dict[str, Any]:
    o = q.option
    return {
        "label": o.label, "route": o.candidate.route, "route_options": o.candidate.route_options,
        "usd": None if o.cost.usd is None else str(o.cost.usd), "price_note": o.cost.note or None,
        "wait_p50_seconds": o.took.p50, "wait_p95_seconds": o.took.p95, "wait_basis": o.took.basis, "why": q.verdict,
    }  # fmt: skip


def _options_text(options: dict[str, Any]) -> str:
    return "" if not options else " (" + ", ".join(f"{k}: {v}" for k, v in options.items()) + ")"


def _point_json(p: advisor.Point) -> dict[str, Any]:
    return {
        "tier": p.tier, "route": p.route, "route_options": p.options,
        "usd": None if p.cost.usd is None else str(p.cost.usd),
        "wait_p50_seconds": p.took.p50, "wait_p95_seconds": p.took.p95, "wait_basis": p.took.basis, "note": p.note,
    }  # fmt: skip


def _pick_json(pick: Choice | str | None, wait: float | None, wait_text: str | None) -> dict[str, Any] | None:
    if pick is None:
        return None
    if isinstance(pick, str):
        return {"max_wait": wait_text, "max_wait_seconds": wait, "route": None, "refused": pick}
    c = pick.option.candidate
    return {
        "max_wait": wait_text, "max_wait_seconds": wait, "route": c.route, "route_options": c.route_options,
        "label": pick.option.label, "usd": money(pick.option.cost.usd).lstrip("$"), "wait_p95_seconds": pick.option.took.p95,
        "next_tier_up": pick.faster.label if pick.faster else None, "chain": [o.label for o in pick.chain[1:]],
        "reason": pick.reason,
    }  # fmt: skip


def _count(spec: JobSpec, where: str, counter: TokenCounter, sample: int | None, output_tokens: int | None, show: bool) -> Count:
    progress = Progress(TextColumn("[bold]{task.description}"), TextColumn("{task.completed:,} rows"), TimeElapsedColumn(),
                        console=console, transient=True, disable=not show)  # fmt: skip
    with progress:
        task = progress.add_task(f"count {spec.name}", total=None)
        return count_rows(spec, where, counter, sample, output_tokens, lambda n: progress.update(task, completed=n),
                          routes_checked=spec.route == AUTO, after=_watermark(spec))  # fmt: skip


def _watermark(spec: JobSpec) -> Watermark | None:
    """A `since` job's stored watermark, when there is a store: the estimate prices what the
    next load would read, not the whole history."""
    if spec.source.since is None:
        return None
    try:
        store = Store(state.db, create=False)
    except MissingStoreError:
        return None
    try:
        return stored_watermark(store, spec)
    finally:
        store.close()


def _lines(
    spec: JobSpec, provider: str | None, usage: Usage, catalog: Catalog, runs_on: tuple[str, dict[str, Any]] | None,
    cache_write_ttl: str | None = None,
) -> list[Line]:
    """One line per route the job could take: its provider's tiers, self-hosted, and the
    route it runs on (`runs_on`: route and options) where that is neither. A model no
    provider's price list has gets one unknown line per provider tier. The tokens the
    requests ask to write to a prompt cache are priced at the longest TTL they ask for."""
    own_route, own_options = runs_on or ("", {})
    own = billing_of(own_route, own_options) if runs_on else None
    routes: list[tuple[str, dict[str, Any]]] = {
        "openai": [("openai", {}), ("openai", {"service_tier": "flex"}), ("openai-batch", {})],
        "anthropic": [("anthropic", {}), ("anthropic-batch", {})],
    }.get(provider or "", [])
    routes.append(("local" if own_route == "local" else "openai-compatible", {}))
    if runs_on and (own is None or own.tier is Tier.FREE):
        routes.append((own_route, own_options))
    lines = []
    if provider is None:
        unknown = f'no {" or ".join(PROVIDERS)} price for "{spec.model}"'
        for label, tier in (("real time", Tier.REALTIME), ("batch", Tier.BATCH)):
            lines.append(Line(label, Cost(None, None, tier, note=unknown), None, LATENCY[tier], False))
    for route, options in routes:
        billing = billing_of(route, options)
        # the job's own line: its route at its tier (a cache TTL of its options tells no route apart)
        this_job = runs_on is not None and route == own_route and (
            billing == own or (billing is not None and own is not None and (billing.provider, billing.tier) == (own.provider, own.tier)))
        ttl = cache_write_ttl if usage.cache_write_tokens else None
        cost = attempt_cost(usage, spec.model, route, own_options if this_job else options, catalog=catalog, cache_write_ttl=ttl)
        label = f"{route} (flex)" if billing and billing.tier is Tier.FLEX else route
        duration, latency = _latency(billing.tier if billing else None, spec.model, usage, catalog)
        lines.append(Line(label, cost, duration, latency, this_job))
    return lines


def _latency(tier: Tier | None, model: str, usage: Usage, catalog: Catalog) -> tuple[Decimal | None, str]:
    if tier is Tier.SELF_HOSTED:
        found = catalog.self_hosted_for(model)
        seconds = found[1].seconds(usage) if found else None
        if seconds is None:
            return None, "unknown: no measured throughput (docs/costs.md)"
        return seconds, f"about {_duration(seconds)} at the measured throughput"
    return None, LATENCY.get(tier, "unknown") if tier else "unknown"


def _duration(seconds: Decimal) -> str:
    s = float(seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _money(usd: Decimal | None) -> str:
    if usd is None:
        return "unknown"
    if usd == 0:
        return "$0"
    if usd < Decimal("0.01"):
        return f"${usd:.6f}"
    return f"${usd:,.4f}" if usd < 1 else f"${usd:,.2f}"


def _saving(line: Line, baseline: Decimal | None) -> tuple[Decimal | None, int | None]:
    if line.cost.usd is None or baseline is None or baseline == 0 or line.cost.tier in (Tier.REALTIME, Tier.FREE):
        return None, None
    saving = baseline - line.cost.usd
    return saving, round(saving * 100 / baseline)


def _baseline(lines: list[Line]) -> Decimal | None:
    """What the job's tokens cost in real time at its provider (the saving's reference)."""
    return next((ln.cost.usd for ln in lines if ln.cost.tier is Tier.REALTIME and ln.cost.known), None)


def provider_requests(spec: JobSpec, count: Count) -> dict[str, Any] | None:
    """An embedding job's provider requests and batches, packed and one row per request
    (extrapolated like the tokens); None for other jobs."""
    if spec.request_endpoint != EMBEDDINGS:
        return None
    from lowtide.engine.batches import DEFAULT_CHUNK, PACKED_CHUNK

    most = CARDS["openai-batch"].limits.max_requests or DEFAULT_CHUNK  # requests a batch (core/cards.py)
    packed = count.scaled(count.packs.requests) if count.packs is not None else None
    rows_per_batch = spec.chunk_size or (PACKED_CHUNK if packed is not None else DEFAULT_CHUNK)
    unpacked_batch = min(spec.chunk_size or DEFAULT_CHUNK, most)
    return {
        "packing": packed is not None, "rows": count.rows,
        "packed_requests": packed, "packed_batches": -(-count.rows // min(rows_per_batch, most)) if packed is not None else None,
        "unpacked_requests": count.rows, "unpacked_batches": -(-count.rows // unpacked_batch),
    }  # fmt: skip


def packing_line(spec: JobSpec, count: Count) -> str:
    p = provider_requests(spec, count)
    assert p is not None
    unpacked = f"{p['unpacked_requests']:,} requests (one per row) in {p['unpacked_batches']:,} batch(es) on a batch route"
    if not p["packing"]:
        return f"packing: off (`packing: false`): {unpacked}; the cost is the same (priced per input token)"
    return (f"packing: {p['rows']:,} rows in {p['packed_requests']:,} provider requests (up to 2,048 inputs each) in "
            f"{p['packed_batches']:,} batch(es) on a batch route; without it {unpacked}. The cost is the same (priced per input token)")


def _output_basis(spec: JobSpec, output_tokens: int | None) -> str:
    if output_tokens is not None:
        return f"{output_tokens} per request (--output-tokens)"
    if spec.request_endpoint in NO_TEXT:
        return "none: billed by input tokens only"
    if spec.output_bound is None:  # the rows' own limits (or n)
        each = "each request's own output limit × the answers it asks for (n)"
    else:
        answers = spec.output_bound // (spec.output_limit or 1)
        each = f"the output limit ({spec.output_limit})" + (f" × {answers} answers (n)" if answers > 1 else "") + " per request"
    return f"{each}: an upper bound; --output-tokens N to assume fewer"


def _print(spec: JobSpec, count: Count, counter: TokenCounter, usage: Usage, lines: list[Line], catalog: Catalog, output_tokens: int | None) -> None:
    rows = f"{count.rows:,} rows"
    if count.extrapolated:
        rows += f", extrapolated from the first {count.counted:,}"
    out.print(f'estimate for job "{spec.name}": {rows}; model {spec.model}, route {spec.route}', markup=False)
    out.print(f"  input:  {usage.input_tokens + usage.cache_write_tokens:,} tokens ({counter.method})", markup=False)
    for said in _beyond_text(count):
        out.print(f"          {said}", markup=False)
    if spec.request_endpoint == EMBEDDINGS:
        out.print("  output: none (an embedding is priced by its input tokens only)", markup=False)
        out.print(f"  {packing_line(spec, count)}", markup=False)
    elif spec.request_endpoint == MODERATIONS:
        out.print("  output: none (a moderation answers a verdict, not tokens)", markup=False)
    else:
        out.print(f"  output: {usage.output_tokens:,} tokens assumed ({_output_basis(spec, output_tokens)})", markup=False)
    baseline = _baseline(lines)
    rows = []
    for ln in lines:
        saving, pct = _saving(ln, baseline)
        shown = "-" if saving is None else f"{_money(saving)} ({pct}%)"
        route = ln.route + (" ◀ this job" if ln.this_job else "")
        rows.append([markup_escape(route), _money(ln.cost.usd), shown, markup_escape(ln.latency), markup_escape(ln.cost.note)])
    cols = [Col("route"), Col("cost", figure=True), Col("saving", figure=True), Col("takes", drop=2), Col("note", drop=1)]
    table = fitted_table(out, cols, rows)
    out.print(table)
    out.print(f"prices: {catalog.describe()}; saving against real time; no prompt-cache discount assumed", markup=False)
    if count.refused:
        print(f"lowtide: {count.refused} of the {count.counted:,} rows counted would be refused by `lowtide submit`; first:", file=sys.stderr)
        for p in count.problems:
            print(f"  - {p}", file=sys.stderr)


def _beyond_text(count: Count) -> list[str]:
    """What the input counts beyond text, and what it cannot count, in words."""
    said = []
    if count.images and count.image_bound is not None:
        b = count.image_bound
        said.append(f"of which {count.scaled(count.images * b.tokens):,} for {count.scaled(count.images):,} image(s), each at "
                    f"the most one is billed: {b.tokens:,} tokens ({b.source})")  # fmt: skip
    if count.cache_write_tokens:
        ttl = {"5m": "5-minute", "1h": "1-hour"}.get(count.cache_write_ttl or "", "")
        said.append(f"of which {count.scaled(count.cache_write_tokens):,} in requests that ask to write a prompt cache: "
                    f"priced at the {ttl} cache-write rate")  # fmt: skip
    if count.unbounded:
        said.append(f"NOT counted: what {count.scaled(count.unbounded):,} request(s) hold beyond text, {count.unbounded_what}, "
                    "which lowtide cannot measure before sending: the cost is higher than shown, and a budgeted job "
                    "refuses to send such requests")  # fmt: skip
    return said


def _as_json(spec: JobSpec, count: Count, counter: TokenCounter, usage: Usage, lines: list[Line], catalog: Catalog, output_tokens: int | None) -> dict[str, Any]:
    def money(d: Decimal | None) -> str | None:
        return None if d is None else str(d)

    baseline = _baseline(lines)
    routes = []
    for ln in lines:
        saving, pct = _saving(ln, baseline)
        routes.append({
            "route": ln.route, "tier": ln.cost.tier.value if ln.cost.tier else None, "this_job": ln.this_job,
            "usd": money(ln.cost.usd), "realtime_usd": money(ln.cost.realtime_usd),
            "saving_usd": money(saving), "saving_percent": pct,
            "duration_seconds": None if ln.duration_s is None else float(ln.duration_s),
            "latency": ln.latency, "price_entry": ln.cost.entry, "note": ln.cost.note,
        })  # fmt: skip
    return {
        "job": spec.name, "model": spec.model, "route": spec.route,
        "rows": count.rows, "counted_rows": count.counted, "extrapolated": count.extrapolated,
        "refused_rows": count.refused, "problems": count.problems,
        "input_tokens": usage.input_tokens + usage.cache_write_tokens, "output_tokens": usage.output_tokens,
        "images": count.scaled(count.images),
        "image_tokens": count.scaled(count.images * count.image_bound.tokens) if count.image_bound else 0,
        "cache_write_tokens": usage.cache_write_tokens, "cache_write_ttl": count.cache_write_ttl if usage.cache_write_tokens else None,
        "unbounded_requests": count.scaled(count.unbounded), "unbounded": count.unbounded_what,
        "token_count": {"method": counter.method, "exact": counter.exact},
        "output_basis": _output_basis(spec, output_tokens),
        "provider_requests": provider_requests(spec, count),
        "routes": routes,
        "prices": {"catalog_date": str(catalog.date) if catalog.date else None, "overrides": list(catalog.overrides), "currency": "USD"},
    }  # fmt: skip
