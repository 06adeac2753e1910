"""genai-prices for the hosts of open models that lowtide's batch routes reach.

Groq, Together, Novita and Doubleword each run open models (Llama, Qwen, gpt-oss, …)
behind an OpenAI-compatible Batch API (`openai-compatible-batch`, one profile each). Their
price lists are in genai-prices under the same provider ids; `lookup` reads one the way
core/genai_source.py reads OpenAI's, Anthropic's and Google's (the same `GenaiEntry`), so
`pricing.Catalog` treats a host like any other price list.

A model's id is the host's own (`openai/gpt-oss-120b` at Groq, Together and Novita alike;
`meta-llama/Llama-3.3-70B-Instruct-Turbo` at Together): a job's `model` is priced at
each candidate host by that one id, and a host that does not list it has no price.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from functools import lru_cache
from typing import Any

from genai_prices import data_snapshot

from lowtide.core import genai_source
from lowtide.core.genai_source import CONTEXTS, GenaiEntry

# lowtide's price-list name -> genai-prices' provider id
HOST_IDS = {"groq": "groq", "together": "together", "novita": "novita", "doubleword": "doubleword"}
HOSTS = tuple(HOST_IDS)


@lru_cache(maxsize=4096)
def lookup(host: str, model: str, day: date) -> GenaiEntry | None:
    """`model` at `host` on `day` (tiers as genai_source.lookup gives them), or None."""
    found = _find(host, model)
    if found is None:
        return None
    provider, info = found
    ts = datetime.combine(day, time(12), tzinfo=UTC)
    notes: list[str] = []
    tiers: dict[str, Any] = {"realtime": genai_source._fields(info.get_prices(ts), notes)}
    for tier, context in CONTEXTS.items():
        active = genai_source._active_variant(info, context, ts)
        tiers[tier] = genai_source._fields(info.get_prices(ts, context), []) if active else None
    offered = frozenset(t for t, c in CONTEXTS.items() if any(v.when == c for v in info.price_variants or ()))
    return GenaiEntry(info.id, provider.id, day, tiers, offered | {"realtime"}, "; ".join(dict.fromkeys(notes)) or None)


def _find(host: str, model: str) -> tuple[Any, Any] | None:
    provider_id = HOST_IDS.get(host)
    if provider_id is None:
        return None
    try:
        return data_snapshot.get_snapshot().find_provider_model(model, None, provider_id, None)
    except LookupError:
        return None


def model_ids(host: str) -> list[str]:
    """The package's model ids at `host` (for messages that list them)."""
    pid = HOST_IDS.get(host)
    found = next((p for p in data_snapshot.get_snapshot().providers if p.id == pid), None)
    return sorted(m.id for m in found.models) if found else []
