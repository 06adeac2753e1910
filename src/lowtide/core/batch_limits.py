"""OpenAI's batch queue limits: how many input tokens of one model an organization may have
enqueued (in batches not yet ended) at once, by usage tier.

A batch that would go over fails validation with `token_limit_exceeded` ("Enqueued token
limit reached for gpt-4o-mini in organization org-…. Limit: 2,000,000 enqueued tokens.
Please try again once some in_progress batches have been completed."). `openai-batch`
plans within the limit (engine/batches.py) and resubmits a batch refused for it.

The numbers are OpenAI's "Batch queue limit" column of its rate-limit tables (the model
pages at platform.openai.com/docs/models and platform.openai.com/docs/guides/rate-limits),
per tier 1..5. Sources: gpt-4o-mini all tiers and gpt-4o / gpt-4 / gpt-3.5-turbo tier 1 as
quoted from those tables on community.openai.com (threads 1269349 and 1028595); the other
cells are the model pages' as of late 2025 and are UNCONFIRMED here. Your organization's
own limits are at platform.openai.com/settings/organization/limits: when they differ, give
`route_options.max_enqueued_tokens` (one number, or one per model), which wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# model -> batch queue limit (input tokens) for tiers 1, 2, 3, 4, 5
OPENAI_BATCH_QUEUE: dict[str, tuple[int, int, int, int, int]] = {
    "gpt-4o-mini": (2_000_000, 20_000_000, 40_000_000, 1_000_000_000, 15_000_000_000),
    "gpt-4o": (90_000, 1_350_000, 50_000_000, 200_000_000, 5_000_000_000),
    "gpt-4.1": (900_000, 1_350_000, 50_000_000, 200_000_000, 5_000_000_000),
    "gpt-4.1-mini": (2_000_000, 20_000_000, 40_000_000, 1_000_000_000, 15_000_000_000),
    "gpt-4.1-nano": (2_000_000, 20_000_000, 40_000_000, 1_000_000_000, 15_000_000_000),
    "gpt-5": (1_500_000, 3_000_000, 100_000_000, 200_000_000, 15_000_000_000),
    "gpt-5-mini": (5_000_000, 20_000_000, 40_000_000, 1_000_000_000, 15_000_000_000),
    "gpt-5-nano": (2_000_000, 20_000_000, 40_000_000, 1_000_000_000, 15_000_000_000),
    "gpt-4": (100_000, 200_000, 5_000_000, 30_000_000, 5_000_000_000),
    "gpt-3.5-turbo": (2_000_000, 5_000_000, 50_000_000, 100_000_000, 10_000_000_000),
}
TIERS = (1, 2, 3, 4, 5)
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def enqueued_token_limit(model: str, tier: int | None, explicit: int | Mapping[str, int] | None) -> int | None:
    """The limit for `model`: `explicit` (one number, or a model's own entry, `*` for any
    other), else the documented one for `tier`; None when neither says (no limit planned)."""
    if isinstance(explicit, Mapping):
        if model in explicit:
            return int(explicit[model])
        if "*" in explicit:
            return int(explicit["*"])
    elif explicit is not None:
        return int(explicit)
    if tier is None:
        return None
    row = OPENAI_BATCH_QUEUE.get(model.lower()) or OPENAI_BATCH_QUEUE.get(_SNAPSHOT.sub("", model.lower()))
    return None if row is None else row[tier - 1]
