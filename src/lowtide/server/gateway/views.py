"""The status document of a deferred request: what `GET /v1/deferred/{id}` answers and
what a webhook delivers (without the `delivery` part).

    {"id": "dfr_…", "object": "lowtide.deferred", "status": "accepted|queued|succeeded|failed",
     "decision": "deferred|shaved", "api": "openai|anthropic", "model": "…",
     "created_at": 1700000000, "deadline_at": …, "expected_completion_at": …, "completed_at": null,
     "status_url": "http://…/v1/deferred/dfr_…",
     "route": "openai-batch", "response_status": 200,
     "response": {…the API's own chat.completion / message, or its error body…},
     "delivery": {"state": "none|pending|delivered|dead", "attempts": 0, "last_error": null,
                  "delivered_at": null}}
"""

from __future__ import annotations

import json
import math
from typing import Any


def status_url(public_url: str | None, gid: str) -> str:
    """Absolute under the configured `public_url`, else relative (`/v1/deferred/…`)."""
    return f"{(public_url or '').rstrip('/')}/v1/deferred/{gid}"


def _time(value: Any) -> float | None:
    """A stored time as JSON can carry it: a row written before durations were bounded may
    hold infinity, which would make the whole answer fail to serialise."""
    return value if isinstance(value, int | float) and math.isfinite(value) else None


def deferred_view(row: Any, public_url: str | None, delivery: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": row.id,
        "object": "lowtide.deferred",
        "status": row.state,
        "decision": row.decision,
        "api": row.api,
        "model": row.model,
        "created_at": _time(row.accepted_at),
        "deadline_at": _time(row.deadline_at),
        "expected_completion_at": _time(row.expected_at),
        "completed_at": _time(row.finished_at),
        "status_url": status_url(public_url, row.id),
        "route": row.route,
        "response_status": row.result_status,
        "response": json.loads(row.result) if row.result else None,
    }
    if delivery:
        view["delivery"] = {
            "state": row.delivery,
            "attempts": row.delivery_attempts,
            "last_error": row.delivery_error,
            "delivered_at": _time(row.delivered_at),
        }
    return view
