"""A job's tokens before anything is stored: rows rendered exactly as `submit` renders
them (the loader's own row renderer) and counted; what `lowtide estimate` and `route: auto`
price candidates with. Nothing is stored and no route is contacted.

Beyond the text the counter counts, each image is counted at the most one image is billed
on the job's model, the input of a request that asks to write a prompt cache is priced at
the write rate, and what has no bound (a PDF, audio) is counted apart, as a budget's
estimate counts them (core/input_bounds.py, engine/budget.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from lowtide.core.endpoints import NO_TEXT
from lowtide.core.errors import SourceError, SpecError
from lowtide.core.input_bounds import ImageBound, image_bound, longer_ttl, scan
from lowtide.core.pricing import billing_of
from lowtide.core.sources import Watermark, source_of
from lowtide.core.spec import JobSpec
from lowtide.core.templates import MessageTemplate
from lowtide.core.tokens import TokenCounter
from lowtide.core.types import Request, Usage
from lowtide.engine.loader import RowRenderer
from lowtide.engine.packs import PackCount, packing

MAX_SHOWN_PROBLEMS = 5


@dataclass
class Count:
    """Tokens of the rows counted, and how many rows there are in all."""

    rows: int = 0  # every data row of the source
    counted: int = 0  # rows rendered and counted (all of them, or the sample)
    refused: int = 0  # counted rows `submit` would refuse
    input_tokens: int = 0
    output_tokens: int = 0
    # Tokens of the first request's system prompt (instructions): the prefix every request
    # of a templated job shares, which a provider's prompt cache can serve.
    prefix_tokens: int = 0
    problems: list[str] = field(default_factory=list)
    # Embedding jobs: the provider requests the counted rows make, packed (engine/packs.py).
    packs: PackCount | None = None
    images: int = 0  # image parts of the counted requests
    image_bound: ImageBound | None = None  # the tokens each is counted at (in input_tokens); None: not counted
    cache_write_tokens: int = 0  # of input_tokens, those of requests that ask to write a prompt cache
    cache_write_ttl: str | None = None  # the longest TTL they ask for
    unbounded: int = 0  # counted requests holding what no figure bounds (a PDF, audio; an image with no bound)
    unbounded_what: str | None = None

    @property
    def extrapolated(self) -> bool:
        return self.counted < self.rows

    def scaled(self, tokens: int) -> int:
        """Tokens of the counted rows, extrapolated to every row."""
        if not self.extrapolated or self.counted == 0:
            return tokens
        return round(tokens * self.rows / self.counted)

    @property
    def usage(self) -> Usage:
        """The tokens of every row: input, the part of it written to a prompt cache, output."""
        writes = self.scaled(self.cache_write_tokens)
        return Usage(input_tokens=self.scaled(self.input_tokens) - writes, cache_write_tokens=writes,
                     output_tokens=self.scaled(self.output_tokens))  # fmt: skip


def system_text(body: dict) -> str:
    """The system prompt of a body: Anthropic's `system`, Responses' `instructions`, or a
    leading system / developer message's text."""
    for key in ("system", "instructions"):
        value = body.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "".join(b.get("text", "") for b in value if isinstance(b, dict))
    messages = body.get("messages") or body.get("input")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer"):
        content = messages[0].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def count_rows(
    spec: JobSpec, where: str, counter: TokenCounter, sample: int | None, output_tokens: int | None,
    on_rows: Callable[[int], None] | None = None, routes_checked: bool = False, after: Watermark | None = None,
) -> Count:  # fmt: skip
    """Render and count the first `sample` rows (all when None); count every row (past
    `after`, a `since` job's watermark: what its next load would read)."""
    template = MessageTemplate.from_spec(spec, where)
    source = source_of(spec, after)
    if source.columns is not None:
        if spec.source.id_column not in source.columns:
            raise SourceError(
                f'{source.label}: no column "{spec.source.id_column}" (source.id_column); columns are: {", ".join(source.columns)}'
            )
        template.check_columns(source.columns, source.name)
    render = RowRenderer(spec, template, source, routes_checked)
    count = Count(packs=PackCount() if packing(spec) else None)
    no_output = spec.request_endpoint in NO_TEXT  # an embedding or a moderation: input tokens only
    billing = billing_of(spec.route, spec.route_options)
    bound = image_bound(spec.model, billing.provider if billing else None)
    route_ttl = billing.cache_write_ttl if billing is not None and spec.route_options.get("cache_prefix") else None
    for chunk in source.chunks():
        for row in chunk:
            count.rows += 1
            if sample is not None and count.counted >= sample:
                continue  # past the sample: only the rows are counted
            count.counted += 1
            item = render(row)
            if not isinstance(item, dict):
                count.refused += 1
                if len(count.problems) < MAX_SHOWN_PROBLEMS:
                    count.problems.append(item if isinstance(item, str) else f"row {item.row}: {item.message}")
                continue
            request = Request.from_payload("", json.loads(item["payload"]))
            tokens = counter.count_request(request.endpoint, request.body)
            if not no_output:  # an embedding's or a moderation's input is text
                extra, writes = _parts(count, request.body, bound, route_ttl)
                tokens += extra
                count.cache_write_tokens += tokens if writes else 0
            count.input_tokens += tokens
            if count.counted == 1:
                count.prefix_tokens = counter.count_text(system_text(request.body))
            if no_output:  # packing (embeddings) changes the requests, not the tokens
                if count.packs is not None:
                    count.packs.add(request.body)
                continue
            limit = request.output_bound if output_tokens is None else output_tokens
            if limit is None:
                raise SpecError(
                    f"{where}: the requests set no output limit, so their output has no bound to estimate; "
                    "pass --output-tokens N, or set params.max_tokens"
                )
            count.output_tokens += limit
        if on_rows:
            on_rows(count.rows)
    return count


def _parts(count: Count, body: dict, bound: ImageBound | None, route_ttl: str | None) -> tuple[int, bool]:
    """What a body holds beyond its text, noted in `count`: the tokens of its images, and
    whether it writes a prompt cache."""
    found = scan(body)
    ttl = longer_ttl(found.cache_ttl, route_ttl)
    count.cache_write_ttl = longer_ttl(count.cache_write_ttl, ttl)
    if found.unbounded or (found.images and bound is None):
        count.unbounded += 1
        count.unbounded_what = count.unbounded_what or found.unbounded or "an image, on a model with no documented most"
    if not found.images or bound is None:
        return 0, ttl is not None
    count.images += found.images
    count.image_bound = bound
    return found.images * bound.tokens, ttl is not None
