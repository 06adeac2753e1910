"""Taking a message batch in as its body arrives (`POST /v1/messages/batches`): the body is
split into its requests as it streams (jsonstream.py), each request is checked and written
into the batch's folder at once (intake.py), and nothing holds the batch whole. The first
request at fault refuses the batch (400, naming `requests.<i>`), and the folder is removed.
`params` are kept verbatim; params the backend refuses (`refuse`) fail that request alone,
as an `errored` result, as Anthropic validates params after the batch is taken.

The handler feeds chunks from the event loop through a thread (the work is CPU and disk):

    taking = MessageIntake(folder, batch_id, max_requests, max_depth, refuse)
    taking.feed(chunk) …; taking.finish()     # or taking.discard() on any error
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lowtide.core.ids import CUSTOM_ID_PATTERN
from lowtide.server import safejson
from lowtide.server.errors import ApiError
from lowtide.server.intake import Intake
from lowtide.server.jsonstream import ArraySplitter, StreamError
from lowtide.server.schemas import validated
from lowtide.server.translate import Rejection


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    custom_id: str = Field(pattern=CUSTOM_ID_PATTERN.pattern)
    params: dict[str, Any]


class MessageIntake:
    def __init__(self, folder: Any, batch_id: str, max_requests: int, max_depth: int,
                 refuse: Callable[[dict[str, Any]], Rejection | None] = lambda params: None):  # fmt: skip
        self.intake = Intake(folder, batch_id).__enter__()
        self.refuse = refuse
        self.max_requests = max_requests
        self.max_depth = max_depth
        self._split = ArraySplitter("requests", max_depth)
        self._seen: set[str] = set()

    def feed(self, chunk: bytes) -> None:
        try:
            items = self._split.feed(chunk)
        except StreamError as err:
            raise ApiError(400, err.message, param=err.param) from None
        for index, raw in items:
            self._take(index, raw)

    def finish(self) -> Intake:
        try:
            self._split.close()
        except StreamError as err:
            raise ApiError(400, err.message, param=err.param) from None
        self.intake.__exit__()
        return self.intake

    def discard(self) -> None:
        self.intake.discard()

    def _take(self, index: int, raw: bytes) -> None:
        where = f"requests.{index}"
        if index >= self.max_requests:
            raise ApiError(400, f"requests: a batch may have at most {self.max_requests:,} requests; this one has more.", param="requests")
        try:
            data = safejson.loads(raw, self.max_depth)
        except safejson.TooDeep as err:
            raise ApiError(400, f"{where}: {err}; a request may nest at most {self.max_depth} levels.", param=where) from None
        except ValueError as err:
            raise ApiError(400, f"{where}: not valid JSON ({err}).", param=where) from None
        if not isinstance(data, dict):
            raise ApiError(400, f"{where}: Input should be an object", param=where)
        item = validated(Item, data, prefix=where)
        if item.custom_id in self._seen:
            raise ApiError(400, f"requests: custom_id '{item.custom_id}' is used more than once; each request needs its own.", param=f"{where}.custom_id")
        self._seen.add(item.custom_id)
        model = item.params.get("model")
        if not isinstance(model, str) or not model:
            row: dict[str, Any] | Rejection = Rejection("model: Field required (a model name)", param="model")
        else:
            row = self.refuse(item.params) or {"body": item.params}
        self.intake.add(item.custom_id, model if isinstance(model, str) else "", row)
