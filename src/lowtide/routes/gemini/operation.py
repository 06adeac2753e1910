"""A Gemini batch as the API sends it, read as plain JSON: the long-running operation

    {"name": "batches/…", "done": bool, "error": {"code", "message", "status"},
     "metadata": {"state": "BATCH_STATE_…", "displayName", "batchStats": {"requestCount": "…", …},
                  "output": {"responsesFile": "files/…"} | {"inlinedResponses": {"inlinedResponses": [...]}}},
     "response": {the same output}}

The SDK's `batches.get` builds typed objects of every inline response on each call (the
route's poll was mostly that), its Gemini-API mapping keeps neither the operation's `error`
nor `batchStats`, and a typed response dumped back drops the keys its types lack. Here the
route reads the few keys it acts on and hands each inline response on as the dict it came as.

The `*_FIELDS` are Google's partial-response masks (the `fields` system parameter every
Google API takes): a poll asks for the state, not for 50,000 responses, and the results ask
for the output once, not twice.
"""

from __future__ import annotations

from typing import Any

POLL_FIELDS = "name,done,error,metadata(state,batchStats)"
# The output, and the state its lines are read by (an expired batch's); the operation's
# `response` is the same output again.
RESULTS_FIELDS = "metadata(state,output)"
FIND_FIELDS = "operations(name,metadata(displayName)),nextPageToken"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# What a masked answer must hold, else the mask went wrong and the whole batch is asked for.
def has_state(operation: dict[str, Any]) -> bool:
    return isinstance(_dict(operation.get("metadata")).get("state"), str)


def has_output(operation: dict[str, Any]) -> bool:
    return bool(output_of(operation))


def has_results(operation: dict[str, Any]) -> bool:
    return has_state(operation) and has_output(operation)


def has_names(page: dict[str, Any]) -> bool:
    operations = page.get("operations")
    return not operations or any(display_name_of(b) is not None for b in operations)


def display_name_of(operation: Any) -> Any:
    return _dict(_dict(operation).get("metadata")).get("displayName")


def key_of(item: Any) -> Any:
    """An inline response's key (its `metadata.key`)."""
    return _dict(_dict(item).get("metadata")).get("key")


def state_of(operation: dict[str, Any]) -> str:
    """The batch's state in the SDK's words (`JOB_STATE_*`, which the API spells `BATCH_STATE_*`)."""
    state = _dict(operation.get("metadata")).get("state")
    if not isinstance(state, str):
        return "JOB_STATE_UNSPECIFIED"
    return state.replace("BATCH_STATE_", "JOB_STATE_", 1)


def counts_of(operation: dict[str, Any]) -> dict[str, int]:
    """`batchStats` as numbers (the API sends its int64 counts as text)."""
    counts = {}
    for key, value in _dict(_dict(operation.get("metadata")).get("batchStats")).items():
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            counts[key] = int(value)
    return counts


def error_of(operation: dict[str, Any]) -> str:
    """Why a failed batch failed: the operation's `error` (a google.rpc.Status)."""
    error = _dict(operation.get("error"))
    message = error.get("message")
    if not isinstance(message, str) or not message:
        return "the provider failed the batch without saying why"
    said = " ".join(str(error[k]) for k in ("code", "status") if error.get(k) is not None)
    return f"{said}: {message}" if said else message


def output_of(operation: dict[str, Any]) -> dict[str, Any]:
    """The batch's output: `metadata.output`, or the operation's `response` (the same)."""
    return _dict(_dict(operation.get("metadata")).get("output")) or _dict(operation.get("response"))


def inline_responses(output: dict[str, Any]) -> list[Any]:
    items = _dict(output.get("inlinedResponses")).get("inlinedResponses")
    return items if isinstance(items, list) else []


def responses_file(output: dict[str, Any]) -> str | None:
    name = output.get("responsesFile")
    return name if isinstance(name, str) and name else None
