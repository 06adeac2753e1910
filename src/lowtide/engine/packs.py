"""Packing embedding requests: several stored rows' inputs in one provider request, and the
answer unpacked back to one outcome per row (docs/embeddings.md "Packing").

Where a pack lives. The store keeps one request per source row, so a retry, a resume or an
export stays per row; a pack exists only on the wire. The engine packs as it hands a
dispatch's requests to the route: consecutive requests (in the dispatch's id order) whose
bodies are the same but for a text `input` join one body whose `input` is their texts, up to
MAX_INPUTS inputs and MAX_REQUEST_TOKENS tokens. A pack of one is sent as the row's own request.

A pack's custom_id names it without any state: `lt-pack-<first id>-<last id>-<n>`, the store
ids of its first and last rows and how many it holds (64 characters at most, as providers
require). Its answer is unpacked by position: the i-th vector (by `index`) is the i-th row,
and the rows are found again as the requests of that dispatch with ids in that range that
are still waiting on it or have an attempt from it. If that finds other than n rows, or the
answer holds other than n vectors, no vector is handed to any row (a vector must never go
to the wrong row): the rows fail retryably and go again.

Usage: the provider's `prompt_tokens` for the pack is shared out evenly (the remainder to
the first rows), so the rows' sum is exactly what the provider reported. Each row keeps its
own item of the answer, the answer's model, its share of the usage, and `lowtide_pack`: the
pack's custom_id, the row's position, the pack's size and its whole usage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.embeddings import MAX_INPUTS, MAX_REQUEST_TOKENS, decode
from lowtide.core.endpoints import EMBEDDINGS
from lowtide.core.tokens import approx_tokens
from lowtide.core.types import Outcome, Request, Usage

PACK_ID = re.compile(r"^lt-pack-(\d+)-(\d+)-(\d+)$")


def pack_id(first: int, last: int, n: int) -> str:
    return f"lt-pack-{first}-{last}-{n}"


def parse_pack_id(custom_id: str) -> tuple[int, int, int] | None:
    m = PACK_ID.match(custom_id) if custom_id.startswith("lt-pack-") else None
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def pack_size(custom_id: str) -> int:
    """How many rows an outcome is for: a pack's size, else 1."""
    ids = parse_pack_id(custom_id)
    return ids[2] if ids else 1


def packing(spec: Any) -> bool:
    """Whether a job's requests are packed: an embedding job that does not say `packing: false`."""
    return spec.request_endpoint == EMBEDDINGS and spec.packing


class PerRow:
    """The vector length a row must get is its own body's (`dimensions` from its param column
    or its own body, else the job's, else the model's), read from the store when its answer
    comes: a job whose rows may each ask for their own `dimensions`."""

    def __repr__(self) -> str:
        return "PER_ROW"


PER_ROW = PerRow()
Expected = int | PerRow | None


@dataclass(frozen=True, slots=True)
class Vectors:
    # The length every vector of the job must have, where known; PER_ROW where rows may
    # each ask for their own.
    expected: Expected


def vector_check(spec: Any) -> Vectors | None:
    """For an embedding job, what its vectors are checked against; None for any other job."""
    if spec.request_endpoint != EMBEDDINGS:
        return None
    if spec.template.body_column is not None or "dimensions" in spec.param_columns:
        return Vectors(PER_ROW)
    from lowtide.core.embeddings import expected_length

    return Vectors(expected_length({"model": spec.model, **spec.params}))


def fits(shape: dict | None, rest: dict, inputs: int, tokens: int, n: int, max_inputs: int, max_tokens: int) -> bool:
    """Whether an input of `n` tokens, whose body is otherwise `rest`, joins the open pack."""
    return rest == shape and inputs < max_inputs and tokens + n <= max_tokens


@dataclass(slots=True)
class PackCount:
    """How many provider requests the packer would make of a stream of bodies (`lowtide
    estimate`), without keeping them."""

    requests: int = 0
    _shape: dict | None = None
    _inputs: int = 0
    _tokens: int = 0

    def add(self, body: dict[str, Any]) -> None:
        text = body.get("input")
        if not isinstance(text, str):
            self.requests += 1
            self._inputs = 0
            return
        rest = {k: v for k, v in body.items() if k != "input"}
        n = approx_tokens(text)
        if self._inputs and fits(self._shape, rest, self._inputs, self._tokens, n, MAX_INPUTS, MAX_REQUEST_TOKENS):
            self._inputs += 1
            self._tokens += n
            return
        self.requests += 1
        self._shape, self._inputs, self._tokens = rest, 1, n


@dataclass(slots=True)
class Packer:
    """Packs a stream of requests; `members` remembers each pack's rows (custom_ids, in
    input order) for a caller that unpacks in the same process (a direct route's)."""

    max_inputs: int = MAX_INPUTS
    max_tokens: int = MAX_REQUEST_TOKENS
    members: dict[str, list[str]] = field(default_factory=dict)

    def __call__(self, requests: Iterable[Request]) -> Iterator[Request]:
        group: list[Request] = []
        shape: dict[str, Any] | None = None
        tokens = 0
        for request in requests:
            text = request.body.get("input")
            if request.endpoint != EMBEDDINGS or not isinstance(text, str):
                yield from self._flush(group)
                group, shape, tokens = [], None, 0
                yield request
                continue
            rest = {k: v for k, v in request.body.items() if k != "input"}
            n = approx_tokens(text)
            if group and not fits(shape, rest, len(group), tokens, n, self.max_inputs, self.max_tokens):
                yield from self._flush(group)
                group, tokens = [], 0
            group.append(request)
            shape = rest
            tokens += n
        yield from self._flush(group)

    def _flush(self, group: list[Request]) -> Iterator[Request]:
        if not group:
            return
        if len(group) == 1:
            yield group[0]
            return
        first = group[0]
        cid = pack_id(first.row_id, group[-1].row_id, len(group))
        self.members[cid] = [r.custom_id for r in group]
        body = dict(first.body)
        body["input"] = [r.body["input"] for r in group]
        yield Request(cid, EMBEDDINGS, body, attempt=first.attempt, row_id=first.row_id)


def unpack(outcome: Outcome, members: list[str], expected: int | None) -> list[Outcome]:
    """One outcome per row of a pack's answer (see the module doc); `expected`: the vector
    length every row must get, where known."""
    n = len(members)
    if not outcome.ok:
        return [Outcome.failure(cid, outcome.error_code or "error", outcome.error_message or "the pack failed", outcome.retryable)
                for cid in members]  # fmt: skip
    response = outcome.response or {}
    data = response.get("data")
    items = [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    items.sort(key=lambda d: d["index"] if type(d.get("index")) is int else -1)
    total = outcome.usage.input_tokens
    if len(items) != n or [d.get("index") for d in items] != list(range(n)):
        why = f"the provider's answer to a pack of {n} inputs holds {len(items)} vector(s), not one per input at index 0..{n - 1}"
        failed = [Outcome.failure(cid, "bad_response", why + "; retried", True) for cid in members]
        for i, row in enumerate(failed):  # billed all the same: the ledger keeps the provider's usage
            row.usage = Usage(input_tokens=total // n + (1 if i < total % n else 0))
        return failed
    whole = response.get("usage")
    out = []
    for i, (cid, item) in enumerate(zip(members, items, strict=True)):
        share = total // n + (1 if i < total % n else 0)
        body = {
            "object": "list", "data": [item], "model": response.get("model"),
            "usage": {"prompt_tokens": share, "total_tokens": share},
            "lowtide_pack": {"custom_id": outcome.custom_id, "position": i, "size": n, "usage": whole},
        }  # fmt: skip
        row = Outcome(cid, True, usage=Usage(input_tokens=share), tier=outcome.tier, response=body)
        out.append(check_vector(row, expected))
    return out


def check_vector(outcome: Outcome, expected: int | None) -> Outcome:
    """A successful embedding outcome whose vector is unreadable, or not of the expected
    length, fails with the reason (its usage is kept: the provider billed it)."""
    if not outcome.ok:
        return outcome
    data = (outcome.response or {}).get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return _bad(outcome, "the answer holds no vector (`data[0].embedding`)")
    lengths = []
    for item in data:
        vector = item.get("embedding") if isinstance(item, dict) else None
        # A list of numbers is only glanced at (its first number): export reads every one.
        if isinstance(vector, list) and (not vector or isinstance(vector[0], float | int)):
            lengths.append(len(vector))
            continue
        try:
            lengths.append(len(decode(vector)))
        except ValueError as err:
            return _bad(outcome, f"data[{item.get('index') if isinstance(item, dict) else '?'}].embedding is unreadable: {err}")
    wrong = [n for n in lengths if n != (expected or lengths[0])]
    if wrong:
        said = f"the job asks for {expected}" if expected else "the answer's vectors differ in length"
        return _bad(outcome, f"the backend returned a vector of {wrong[0]} numbers; {said} (the row's `dimensions`, else "
                             "params.dimensions, else the model's own length). "
                             "Check the backend's model, or the job's dimensions")  # fmt: skip
    return outcome


def _bad(outcome: Outcome, why: str) -> Outcome:
    failed = Outcome.failure(outcome.custom_id, "bad_vector", why, False)
    failed.usage = outcome.usage
    failed.response = outcome.response
    return failed


async def execute_packed(route: Any, batch: list[Request], packing: bool, expected: int | None = None):
    """A direct route's `execute`, with embedding requests packed and their answers unpacked
    (and every vector checked); other requests pass as they are."""
    if not any(r.endpoint == EMBEDDINGS for r in batch):
        async for outcome in route.execute(batch):
            yield outcome
        return
    from lowtide.core.embeddings import expected_length

    lengths = {r.custom_id: expected or expected_length(r.body) for r in batch}
    packer = Packer()
    sent = list(packer(batch)) if packing else batch
    for r in sent:
        if r.custom_id in packer.members:
            lengths[r.custom_id] = lengths[packer.members[r.custom_id][0]]
    async for outcome in route.execute(sent):
        members = packer.members.get(outcome.custom_id)
        if members is None:
            yield check_vector(outcome, lengths.get(outcome.custom_id))
        else:
            for row in unpack(outcome, members, lengths[outcome.custom_id]):
                yield row


def stored_members(conn: Any, job_id: int, dispatch_id: int, first: int, last: int, n: int) -> list[str]:
    """The custom_ids of a batch pack's rows, in input order (see the module doc): the
    job's requests with ids first..last that still wait on the dispatch, or have an attempt
    from it (an earlier, broken-off ingest of the same batch applied theirs)."""
    from sqlalchemy import and_, exists, or_, select

    from lowtide.core.states import RequestState
    from lowtide.store.schema import attempts, requests

    in_range = (requests.c.job_id == job_id, requests.c.id >= first, requests.c.id <= last)
    waiting = select(requests.c.custom_id).where(
        *in_range, requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value
    )
    found = list(conn.scalars(waiting.order_by(requests.c.id)))
    if len(found) == n:  # the usual case: the whole pack still waits on the batch
        return found
    tried = exists().where(attempts.c.request_id == requests.c.id, attempts.c.dispatch_id == dispatch_id)
    stmt = (
        select(requests.c.custom_id)
        .where(
            *in_range, or_(and_(requests.c.dispatch_id == dispatch_id, requests.c.state == RequestState.DISPATCHED.value), tried),
        )
        .order_by(requests.c.id)
    )  # fmt: skip
    return list(conn.scalars(stmt))


def row_lengths(conn: Any, job_id: int, custom_ids: list[str]) -> dict[str, int | None]:
    """The vector length each row's own stored body asks for (core/embeddings.expected_length)."""
    from sqlalchemy import select

    from lowtide.core import fastjson
    from lowtide.core.embeddings import expected_length
    from lowtide.store.payloads import payload_text
    from lowtide.store.schema import requests

    out: dict[str, int | None] = {}
    for start in range(0, len(custom_ids), 500):  # within every store's limit on bound values
        stmt = select(requests.c.custom_id, payload_text()).where(
            requests.c.job_id == job_id, requests.c.custom_id.in_(custom_ids[start : start + 500])
        )
        for cid, payload in conn.execute(stmt):
            body = fastjson.loads(payload).get("body")
            out[cid] = expected_length(body) if isinstance(body, dict) else None
    return out


def unpack_stored(conn: Any, job_id: int, dispatch_id: int, outcomes: list[Outcome], expected: Expected) -> list[Outcome]:
    """A batch's outcomes with each pack's answer unpacked to its rows (found in the store).
    With `expected` PER_ROW each vector is checked against its row's own length; a pack's
    rows share theirs (the packer joins only bodies alike but for `input`)."""
    out = []
    lengths: dict[str, int | None] = {}
    if expected is PER_ROW:
        lengths = row_lengths(conn, job_id, [o.custom_id for o in outcomes if o.response is not None and parse_pack_id(o.custom_id) is None])
    for outcome in outcomes:
        ids = parse_pack_id(outcome.custom_id)
        if ids is None:
            want = lengths.get(outcome.custom_id) if expected is PER_ROW else expected
            out.append(check_vector(outcome, want) if outcome.response is not None else outcome)  # type: ignore[arg-type]
            continue
        first, last, n = ids
        members = stored_members(conn, job_id, dispatch_id, first, last, n)
        if len(members) != n:
            why = (f"pack {outcome.custom_id}: {len(members)} of its {n} rows are still with this batch; "
                   "no vector is handed out by guess: they are retried")  # fmt: skip
            out.extend(Outcome.failure(cid, "pack_mismatch", why, True) for cid in members)
            continue
        want = row_lengths(conn, job_id, members[:1]).get(members[0]) if expected is PER_ROW else expected
        out.extend(unpack(outcome, members, want))  # type: ignore[arg-type]
    return out
