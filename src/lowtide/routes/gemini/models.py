"""Which Gemini models the Gemini routes accept: those the price catalog prices for `google`
(genai-prices' Gemini models, or the user's price file), plus `route_options.models`. Gemini
rejects an unknown model only when the batch is created or the call made, so lowtide asks
before anything is stored (DESIGN invariant 7)."""

from __future__ import annotations

from collections.abc import Collection

from lowtide.core.errors import RouteError
from lowtide.core.pricing import load_catalog


def check_gemini_model(route: str, model: str, extra: Collection[str] = ()) -> None:
    name = model.removeprefix("models/")
    catalog = load_catalog()
    if name in extra or catalog.lookup("google", name) is not None:
        return
    known = [m for m in catalog.known_models("google") if m.startswith("gemini")]
    raise RouteError(
        f'{route}: unknown Gemini model "{model}"; known: {", ".join(known)}. Fix `model:` in the job spec, or, for a '
        f"model newer than lowtide's price catalog, add it to route_options.models (and its prices to your price file)"
    )
