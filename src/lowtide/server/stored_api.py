"""OpenAI's stored chat completions (`GET /v1/chat/completions`, `/{id}`, `/{id}/messages`,
`POST /{id}`, `DELETE /{id}`), as an account that stored none answers them: serve's own
engines refuse `store` by name (they keep nothing to list), so the list is empty and every
id is unknown. Without these a client's clean-up loop got 405 and 404 "Unknown path" where
OpenAI answers an empty page and "not found"."""

from __future__ import annotations

from fastapi import APIRouter

from lowtide.server.errors import ApiError

router = APIRouter(prefix="/v1/chat/completions")
EMPTY_PAGE = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def _unknown(completion_id: str) -> ApiError:
    return ApiError(404, f"No chat completion found with id '{completion_id}'.")


@router.get("")
def list_stored() -> dict:
    return EMPTY_PAGE


@router.get("/{completion_id}")
def retrieve(completion_id: str) -> dict:
    raise _unknown(completion_id)


@router.post("/{completion_id}")
def update(completion_id: str) -> dict:
    raise _unknown(completion_id)


@router.delete("/{completion_id}")
def delete(completion_id: str) -> dict:
    raise _unknown(completion_id)


@router.get("/{completion_id}/messages")
def messages(completion_id: str) -> dict:
    raise _unknown(completion_id)
