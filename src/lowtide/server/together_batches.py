"""Together's answers on serve's OpenAI Batch API: a batch whose input file was uploaded with
Together's purpose (`batch-api`) answers in Together's shape (together-python
types/batch.py, resources/batch.py), so `openai-compatible-batch`'s together profile meets
the differences it meets at Together:

- create answers `{"job": BATCH}`, not the batch itself;
- a batch's `status` is upper case (`IN_PROGRESS`, `CANCELING` with one L; no FINALIZING:
  serve's finalizing reads as IN_PROGRESS), its times are ISO 8601 text, its progress is
  `progress` (a percentage) where OpenAI has `request_counts`, its failure one `error`
  text where OpenAI has `errors.data`, and its model `model_id`.

List and cancel answer as OpenAI's (a list may mix both kinds of batch).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

PURPOSE = "batch-api"  # Together's word for a batch's input file (server/files.py takes it)
_STATUS = {"finalizing": "IN_PROGRESS", "cancelling": "CANCELING"}


def _iso(seconds: int | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def job(batch: dict[str, Any], file_bytes: int) -> dict[str, Any]:
    """serve's OpenAI batch object (openai_api.batch_object) as Together's batch job."""
    counts = batch["request_counts"]
    total = counts["total"]
    done = counts["completed"] + counts["failed"]
    errors = (batch.get("errors") or {}).get("data") or []
    return {
        "id": batch["id"], "user_id": "serve", "input_file_id": batch["input_file_id"], "file_size_bytes": file_bytes,
        "status": _STATUS.get(batch["status"], batch["status"].upper()), "job_deadline": _iso(batch["expires_at"]),
        "created_at": _iso(batch["created_at"]), "endpoint": batch["endpoint"],
        "progress": round(100.0 * done / total, 2) if total else 0.0, "model_id": batch.get("model"),
        "output_file_id": batch["output_file_id"], "error_file_id": batch["error_file_id"],
        "error": "; ".join(str(e.get("message")) for e in errors) or None,
        "completed_at": _iso(batch["completed_at"] or batch["failed_at"] or batch["cancelled_at"] or batch["expired_at"]),
    }  # fmt: skip
