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
from typing import Any


def status_url(public_url: str | None, gid: str) -> str:
    return f"{(public_url or '').rstrip('/')}/v1/deferred/{gid}"


def deferred_view(row: Any, public_url: str | None, delivery: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": row.id,
        "object": "lowtide.deferred",
        "status": row.state,
        "decision": row.decision,
        "api": row.api,
        "model": row.model,
        "created_at": row.accepted_at,
        "deadline_at": row.deadline_at,
        "expected_completion_at": row.expected_at,
        "completed_at": row.finished_at,
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
            "delivered_at": row.delivered_at,
        }
    return view
