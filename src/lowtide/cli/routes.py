"""`lowtide routes [NAME]`: each route's capability card (core/cards.py): its limits, how a
batch is found after a crash, what the provider keeps and for how long, its discount."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape as markup_escape

from lowtide.cli.common import fail, out
from lowtide.cli.tables import Col, fitted_table
from lowtide.core.cards import CARDS, Card
from lowtide.core.errors import InputError
from lowtide.routes import known_routes


def routes(
    name: Annotated[str | None, typer.Argument(help="A route's name: show its whole card.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the cards as JSON.")] = False,
) -> None:
    """List the routes and what each provider allows and keeps.

    UNCONFIRMED: a figure no primary source settled. Example: lowtide routes openai-batch
    """
    if name is not None and name not in CARDS:
        raise fail(InputError(f'no route "{name}"; known routes: {", ".join(sorted(CARDS))}'))
    cards = [CARDS[name]] if name is not None else list(CARDS.values())
    if as_json:
        shown: Any = card_json(cards[0]) if name is not None else {c.name: card_json(c) for c in cards}
        print(json.dumps(shown, indent=2))
        return
    if name is not None:
        _print_card(cards[0])
        return
    rows = [_row(c) for c in cards]
    cols = [Col("route"), Col("kind"), Col("provider", drop=4), Col("requests", figure=True), Col("bytes", figure=True),
            Col("found after a crash", drop=2), Col("window", figure=True, drop=3), Col("results kept", figure=True, drop=3),
            Col("of real time", figure=True, drop=1)]  # fmt: skip
    out.print(fitted_table(out, cols, rows, title="routes (`lowtide routes NAME` for a whole card)"))
    others = sorted(set(known_routes()) - set(CARDS))
    if others:
        out.print(f"installed without a card (plugins): {', '.join(others)}", markup=False)


def card_json(card: Card) -> dict[str, Any]:
    return card.model_dump(mode="json")


def _row(card: Card) -> list[str]:
    lim, ret = card.limits, card.retention
    return [
        card.name, card.kind, markup_escape(card.provider), _count(lim.max_requests), size(lim.max_bytes),
        card.recovery.how if card.recovery else "-", duration(ret.window_s), duration(ret.results_s),
        _pays(card),
    ]  # fmt: skip


def _print_card(card: Card) -> None:
    flat = _flatten(card_json(card))
    unconfirmed = set(card.unconfirmed)
    rows = [[key, markup_escape(_value(key, value)) + (" (UNCONFIRMED)" if key in unconfirmed or _under(key, unconfirmed) else "")]
            for key, value in flat if key not in ("name", "unconfirmed")]  # fmt: skip
    out.print(fitted_table(out, [Col("field"), Col("value")], rows, title=f"route {card.name}"))


def _under(key: str, fields: set[str]) -> bool:
    return any(key.startswith(f + ".") for f in fields)


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict) and data:
        return [kv for k, v in data.items() for kv in _flatten(v, f"{prefix}.{k}" if prefix else k)]
    return [(prefix, data)]


def _value(key: str, value: Any) -> str:
    if value is None or value == {}:
        return "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and key.endswith("_s"):
        return duration(int(value))
    if isinstance(value, int) and key.endswith("bytes"):
        return size(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _pays(card: Card) -> str:
    d = card.discount
    if card.tier == "free":
        return "free"
    if d is None or d.factor is None or card.kind == "direct":
        return "-" if card.tier != "self_hosted" else "own GPU"
    return f"{(d.factor * 100).normalize():f}%"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale:,} {unit}"
    return f"{n:,} B"


def duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds // scale} {unit}"
    return f"{seconds} s"
