"""`echo` on `/v1/moderations`: a verdict that flags nothing, deterministic from the custom_id.

One result per input, as OpenAI answers: one for a text, one per text of a list, one for a
list of multi-modal parts. Each result has every category the installed openai SDK's
`Moderation` type declares, read from that type (a category OpenAI adds shows up the day the
SDK ships it): `flagged` false, each category false, each score in [0, 0.01) from
crc32(custom_id, category, index), and the input types each category applies to: "text",
and "image" too where the input has an image part and the SDK allows it for that category.
A moderation reports no usage, so echo counts none. The answer has OpenAI's shape
(`ModerationCreateResponse`): `{"id": "modr-...", "model", "results": [...]}`.
"""

from __future__ import annotations

import zlib
from functools import cache
from typing import Any

import typing_extensions

from lowtide.core.endpoints import MODERATIONS, known_keys
from lowtide.core.types import Outcome, Refusal, Request
from lowtide.routes.openai.wire import moderation_text
from lowtide.routes.replies import Ids

DEFAULT_MODEL = "omni-moderation-latest"  # OpenAI's, when a body names none


@cache
def categories() -> dict[str, tuple[str, ...]]:
    """{category as the API names it ("self-harm/intent"): the input types the SDK allows for it}."""
    from openai.types.moderation import CategoryAppliedInputTypes

    out = {}
    for name, field in CategoryAppliedInputTypes.model_fields.items():
        (literal,) = typing_extensions.get_args(field.annotation)  # List[Literal["text", "image"]]
        out[field.alias or name] = typing_extensions.get_args(literal)
    return out


def _inputs(given: Any) -> list[set[str]] | Refusal:
    """The input types of each input the answer has a result for."""
    if isinstance(given, str):
        return [{"text"}]
    if not isinstance(given, list) or not given:
        return Refusal("input", "must be a text, a non-empty list of texts, or a non-empty list of text and image_url parts")
    if all(isinstance(item, str) for item in given):
        return [{"text"} for _ in given]
    kinds = set()
    for i, part in enumerate(given):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("text", "image_url"):
            return Refusal(f"input[{i}]", "must be a text part or an image_url part (or give a list of texts)")
        kinds.add("image" if kind == "image_url" else "text")
    return [kinds]  # the parts together are one input


def refusal(request: Request) -> Refusal | None:
    for key in request.body:
        if key not in known_keys(MODERATIONS):
            return Refusal(key, f"is not a parameter of {MODERATIONS}")
    found = _inputs(request.body.get("input"))
    return found if isinstance(found, Refusal) else None


def _score(custom_id: str, category: str, index: int) -> float:
    return zlib.crc32(f"{custom_id}\x00{category}\x00{index}".encode("utf-8", "surrogatepass")) % 10_000 / 1_000_000


def outcome(request: Request, route: str) -> Outcome:
    refused = refusal(request)
    if refused is not None:
        return Outcome.failure(request.custom_id, "invalid_request", refused.message(route), False)
    results = []
    for i, kinds in enumerate(_inputs(request.body["input"])):
        known = categories()
        results.append({
            "flagged": False,
            "categories": dict.fromkeys(known, False),
            "category_scores": {c: _score(request.custom_id, c, i) for c in known},
            "category_applied_input_types": {c: [k for k in allowed if k in kinds] for c, allowed in known.items()},
        })  # fmt: skip
    response = {"id": Ids.own(route, request.custom_id)("modr-"), "model": request.model or DEFAULT_MODEL, "results": results}
    return Outcome(request.custom_id, True, text=moderation_text(response), response=response)
