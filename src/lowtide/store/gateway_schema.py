"""The gateway's tables (`lowtide gateway`), on the same `metadata` as `schema.py`.

A **deferred request** is one API call the gateway answered `202 Accepted`: stored here
before the answer, later flushed into a lowtide job (`gateway_flushes` row = one job), its
result recorded here in the API's own response shape, and delivered by webhook.

    state:     accepted → queued → succeeded | failed
    delivery:  none (no callback) | pending → delivered | dead   (pending → pending: a retry)

An **owned object** is a file or batch a tenant created at the upstream through the
gateway's passthrough (or a batch's output file it was shown): only that tenant may read,
list, cancel or delete it (`gateway_objects`, written by `lowtide.server.gateway.owned`).

Only `lowtide.server.gateway.records` writes `state`, `delivery` and a flush's `state`,
checking each move against its transition table. API keys are never stored: tenants live in
the gateway's config, as SHA-256 hashes; rows carry only the tenant's name.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, Integer, String, Table, Text
from sqlalchemy.schema import PrimaryKeyConstraint

from lowtide.store.schema import metadata

gateway_requests = Table(
    "gateway_requests",
    metadata,
    Column("id", String(40), primary_key=True),  # dfr_…: the custom_id of its job's request
    Column("tenant", String(64), nullable=False),
    Column("api", String(16), nullable=False),  # openai | anthropic
    Column("model", String(256), nullable=False),  # as the client named it
    Column("payload", Text, nullable=False),  # JSON source row: messages, max_tokens, temperature, stop
    Column("decision", String(16), nullable=False),  # deferred (asked to) | shaved (deferred under load)
    Column("state", String(16), nullable=False),
    Column("callback_url", Text),
    Column("accepted_at", Float, nullable=False),
    Column("deadline_at", Float, nullable=False),  # accepted_at + the max wait the client allowed
    Column("expected_at", Float, nullable=False),  # what the 202 promised
    Column("flush_id", Integer),  # the gateway_flushes row (lowtide job) it went into
    Column("route", String(64)),  # the route that answered it
    Column("result", Text),  # JSON: the API's response body, or its error body
    Column("result_status", Integer),  # the HTTP status that body goes with
    Column("input_tokens", Integer),
    Column("output_tokens", Integer),
    Column("saved_picousd", BigInteger),  # real-time price of its tokens minus what it cost; NULL: unknown
    Column("finished_at", Float),
    Column("delivery", String(16), nullable=False),
    Column("delivery_attempts", Integer, nullable=False),
    Column("next_delivery_at", Float),
    Column("delivered_at", Float),
    Column("delivery_error", Text),
    Index("ix_gateway_requests_state", "state", "api", "model", "accepted_at"),
    Index("ix_gateway_requests_flush", "flush_id", "state"),
    Index("ix_gateway_requests_delivery", "delivery", "next_delivery_at"),
    Index("ix_gateway_requests_tenant", "tenant", "accepted_at"),
)

# One flush: the deferred requests of one (api, model) taken together into one lowtide job.
gateway_flushes = Table(
    "gateway_flushes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_name", String(64), unique=True),  # gateway-<id>; set in the same transaction
    Column("api", String(16), nullable=False),
    Column("model", String(256), nullable=False),
    Column("state", String(16), nullable=False),  # loading → running → done
    Column("size", Integer, nullable=False),
    Column("deadline_at", Float, nullable=False),  # the earliest deadline among its requests
    Column("created_at", Float, nullable=False),
    Column("done_at", Float),
    Index("ix_gateway_flushes_state", "state"),
)

GATEWAY_TABLES = [gateway_requests, gateway_flushes]

# Upstream objects by owner: the upstream has one key for every tenant, so this table is
# what keeps tenants apart (migration m006_gateway_objects).
gateway_objects = Table(
    "gateway_objects",
    metadata,
    Column("api", String(16), nullable=False),  # openai | anthropic
    Column("kind", String(16), nullable=False),  # file | batch | message_batch
    Column("object_id", String(256), nullable=False),  # the upstream's id
    Column("tenant", String(64), nullable=False),
    Column("created_at", Float, nullable=False),  # when the gateway first saw it
    PrimaryKeyConstraint("api", "kind", "object_id"),
    Index("ix_gateway_objects_tenant", "tenant", "api", "kind", "created_at"),
)

GATEWAY_OBJECT_TABLES = [gateway_objects]
