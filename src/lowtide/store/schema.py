"""The store's tables (SQLAlchemy Core). Changing one means adding a migration."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal_column,
    text,
)

metadata = MetaData()

# 'pending' written into a query's text, not bound: a plan made before the values are known
# (PostgreSQL's generic plan of a prepared statement) can use a partial index only where the
# query's own WHERE implies the index's.
PENDING = literal_column("'pending'")

meta = Table(
    "lowtide_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

migrations = Table(
    "lowtide_migrations",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("applied_at", Float, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("spec", Text, nullable=False),  # JobSpec as JSON
    Column("route", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("finished_at", Float),
    Column("error", Text),
    # How many times the job changed state (store/transitions.py `move_job`): a page that
    # keeps a finished job's figures knows by it that nothing moved since (engine/job_figures.py).
    Column("moves", Integer, nullable=False, server_default="0"),
)

# What the payloads of a job's requests share, stored once (m026, store/payloads.py): the
# text before each row's own part (the endpoint, lowtide's asks, the body's fixed keys, whose
# JSON schema or tools can be kilobytes). `chars` and `bytes` (UTF-8) are the whole text's a
# payload adds to its own part: the head's and the closing "}}".
payload_heads = Table(
    "payload_heads",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("digest", String(32), nullable=False),  # BLAKE2b-128 of the text, hex
    Column("text", Text, nullable=False),
    Column("chars", Integer, nullable=False),
    Column("bytes", Integer, nullable=False),
    UniqueConstraint("job_id", "digest", name="uq_payload_heads"),
)

# One row per (job, custom_id). `dispatch_id` is the dispatch the request is in now: a
# result from any other dispatch is stale and is never applied (DESIGN invariant 2).
requests = Table(
    "requests",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("custom_id", String(64), nullable=False),
    Column("source_key", Text, nullable=False),
    Column("source_row", Integer, nullable=False),
    Column("payload", Text, nullable=False),
    Column("repair", Text),  # extra messages for the one retry of an invalid answer
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("not_before", Float, nullable=False, default=0.0),
    Column("dispatch_id", Integer),
    Column("route", String(64)),
    Column("output", Text),
    Column("parsed", Text),  # JSON
    Column("error_code", String(64)),
    Column("error_message", Text),
    Column("input_tokens", Integer),
    Column("cached_input_tokens", Integer),
    Column("cache_write_tokens", Integer),
    Column("output_tokens", Integer),
    Column("reasoning_tokens", Integer),
    Column("updated_at", Float),
    # "main" (the job's route) or "fallback" (the spec's fallback route), and why it moved
    # there; attempts made before the move do not count against the fallback's retries. A
    # `route: auto` job's chain uses "main" for its chosen tier, then "tier1", "tier2", …
    # (engine/tiers.py): no migration, the values fit and old ones keep their meaning.
    Column("lane", String(8), nullable=False, server_default="main"),
    Column("lane_reason", Text),
    Column("lane_base_attempts", Integer, nullable=False, server_default="0"),
    # What the request was rendered with (DESIGN invariant 9): the payload's model, and a
    # fingerprint (BLAKE2b of the payload's fixed part, the templates' text and the values
    # of the source row the template used: engine/loader.py) that tells a changed row or
    # spec from an unchanged one. A NULL fingerprint (stored before m008): compare payloads.
    Column("model", String(256)),
    Column("fingerprint", String(32)),
    # 1, plus one each time `--requeue-changed` made a succeeded request a new version (the
    # old one's answer is kept in `request_versions`).
    Column("version", Integer, nullable=False, server_default="1"),
    # The provider's whole answer body, as JSON (m009): everything it returned is kept.
    Column("response", Text),
    # Where that body is a plain answer (one chat choice of text alone), its finish_reason as
    # JSON (m017, engine/answer_columns.py `plain_record`): the export takes the answer
    # columns from this and reads no response. NULL for any other answer and for answers
    # stored before m017: the export reads those from the response. `prune --keep-results`,
    # as it drops the response of such an answer, writes its answer columns here as a JSON
    # object (engine/kept_answers.py).
    Column("plain_answer", Text),
    # The job's payload head this request's payload is the own part of (m026, store/payloads.py:
    # the whole payload is the head's text, `payload`, then "}}"); NULL: `payload` is whole.
    # (No foreign key: m001 makes this table from this schema, before payload_heads exists.)
    Column("head_id", Integer),
    UniqueConstraint("job_id", "custom_id", name="uq_requests_job_custom_id"),
    # Claims read "due pending requests of a job, earliest first" straight off this index.
    Index("ix_requests_job_state", "job_id", "state", "not_before", "id"),
    # A dispatch's requests in id order, paged by id (engine/dispatch.py `iter_dispatched`):
    # on PostgreSQL an index of dispatch_id alone made each page read the whole table's ids
    # above the last one (1.2 s a page at 10,000,000 requests). SQLite's index of
    # dispatch_id already ends in the rowid, the id.
    Index("ix_requests_dispatch", "dispatch_id", "id"),
    # A lane's due pending requests, earliest first (a chain's tier, a fallback lane); and
    # which lanes have any, by one seek each (engine/tiers.py): no pass over the job's rows.
    # Pending requests only (queries name state = PENDING): a request leaves it once, when
    # it is sent, and later moves (an answer, a failure) do not touch it. `state`, the same
    # in every entry, makes it the planner's choice over ix_requests_job_state for a lane.
    Index(
        "ix_requests_pending_lane", "job_id", "state", "lane", "not_before", "id",
        sqlite_where=text("state = 'pending'"), postgresql_where=text("state = 'pending'"),
    ),
)

# An earlier version of a request, kept when `--requeue-changed` re-rendered a request that
# had succeeded: what it was rendered from and what it answered. Its attempts stay in
# `attempts` (the ledger), under the same request_id.
request_versions = Table(
    "request_versions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("request_id", Integer, ForeignKey("requests.id"), nullable=False),
    Column("job_id", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("payload", Text, nullable=False),
    Column("fingerprint", String(32)),
    Column("state", String(16), nullable=False),
    Column("output", Text),
    Column("parsed", Text),
    Column("response", Text),
    Column("route", String(64)),
    Column("replaced_at", Float, nullable=False),
    Column("head_id", Integer),  # as the request's (m026)
    UniqueConstraint("request_id", "version", name="uq_request_versions"),
)

# A dispatch is one group of requests handed to one route: a provider batch (kind "batch")
# or a group executed directly under a lease (kind "direct").
dispatches = Table(
    "dispatches",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("route", String(64), nullable=False),
    Column("kind", String(8), nullable=False),
    Column("key", String(128), nullable=False, unique=True),  # intent key, attached to the provider batch
    Column("provider_id", String(256)),
    Column("state", String(16), nullable=False),
    Column("phase", String(32)),  # the provider's own word: validating, in_progress, …
    Column("size", Integer, nullable=False),
    Column("owner", String(128)),
    Column("lease_until", Float),
    Column("next_poll_at", Float),
    Column("polls", Integer, nullable=False, default=0),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("submitted_at", Float),
    Column("ended_at", Float),
    Column("error", Text),
    # When a deadline cut-over asked the provider to cancel this batch.
    Column("cut_at", Float),
    # A budgeted job's estimate of this dispatch's cost, reserved before it was sent
    # (picodollars, see `lowtide.store.money`); held while the dispatch is live, less what
    # its attempts have cost so far.
    Column("reserved_picousd", BigInteger),
    # When the worker that won planned → submitting began this create (or the create it
    # retried): the anchor of a route's `find` window, which planning time is not (a chunk
    # may wait many ticks, or many transient errors, between being planned and being sent).
    Column("submit_started_at", Float),
    # The model of its requests (a batch route that takes one model per batch), and their
    # input tokens as estimated when it was planned (core/tokens.py's approximation): what it holds of the
    # provider's per-model enqueued-token limit, and what turnarounds are kept by.
    Column("model", String(256)),
    Column("input_tokens_est", BigInteger),
    # The service tier a direct dispatch asked for (route_options.service_tier, e.g. flex);
    # NULL: the route's default. Turnarounds are kept per tier: flex is slower than real time.
    Column("tier", String(32)),
    # When the provider first answered that it does not know this submitted batch (404 on a
    # poll); cleared by the next poll it answers. Past a grace the batch is given up as lost
    # (engine/fate.py): polled for ever it would hold its requests for ever.
    Column("lost_since", Float),
    # A batch given up as lost (failed, `batch_lost`: its requests went on without it) is
    # still polled until then: what the provider bills for it if it answers after all is
    # booked (engine/batches.py `_watch`). NULL: not watched (never lost, or read since).
    Column("watch_until", Float),
    Index("ix_dispatches_job_state", "job_id", "state"),
    # A route's recent turnarounds (engine/turnaround.py, each tick of a `route: auto` chain):
    # the newest ended dispatches of one route, model, kind and tier, without reading the
    # store's whole history of dispatches.
    Index("ix_dispatches_turnaround", "route", "model", "kind", "tier", "state", "ended_at"),
)

# One try of one request. The ledger is the sum of attempts; `applied` is False for a result
# that arrived after the request had moved on (it is kept, with its cost, but not used).
# Money is in integer picodollars (10^-12 USD, `lowtide.store.money`); a NULL cost is
# unknown (an unknown model or route, a bad price file, or recorded before m004).
attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("request_id", Integer, ForeignKey("requests.id"), nullable=False),
    Column("job_id", Integer, nullable=False),
    Column("dispatch_id", Integer, nullable=False),
    Column("route", String(64), nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("applied", Boolean, nullable=False),
    Column("error_code", String(64)),
    Column("error_message", Text),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("cached_input_tokens", Integer, nullable=False, default=0),
    Column("cache_write_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("reasoning_tokens", Integer, nullable=False, default=0),
    Column("at", Float, nullable=False),
    Column("model", String(256)),  # the model asked for (the job's, or its fallback's)
    Column("tier", String(16)),  # what the route billed at: realtime, flex, batch, self_hosted, free
    Column("billed", Boolean),  # whether the provider bills this attempt (pricing.is_billed)
    Column("cost_picousd", BigInteger),
    Column("realtime_picousd", BigInteger),  # the same tokens at real-time prices
    # Re-ingesting the same results file never records an attempt twice.
    UniqueConstraint("request_id", "dispatch_id", name="uq_attempts_request_dispatch"),
    Index("ix_attempts_job", "job_id"),
)

# Sends that carried an invalid answer's repair turns (engine/fate.py `send`): the attempt
# of that request in that dispatch is a repair attempt, whose cost `lowtide report` and the
# dashboard show apart (m020). An attempt is one (request, dispatch), so this names it.
repair_sends = Table(
    "repair_sends",
    metadata,
    Column("request_id", Integer, primary_key=True),
    Column("dispatch_id", Integer, primary_key=True),
    Column("job_id", Integer, nullable=False),
    Index("ix_repair_sends_job", "job_id"),
)

# Each provider phase a batch dispatch was seen in, when first seen (the dashboard's batch
# timeline); written by the poller when the phase differs from the dispatch's last one.
dispatch_phases = Table(
    "dispatch_phases",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("dispatch_id", Integer, nullable=False),
    Column("phase", String(32), nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_dispatch_phases_dispatch", "dispatch_id", "id"),
)

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_id", Integer),
    Column("at", Float, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Index("ix_events_job", "job_id", "at"),
)

# Job notifications (engine/notify.py): the outbox. A row is written in the transaction of
# the state change it reports (a job finished, ran out of budget, was cut over at its
# deadline), one per receiver URL, and delivered from here by engine/notifier.py. `id` is the
# delivery id, the same on every attempt (receivers dedupe on it); `dedupe_key` makes the
# same event of a job enqueued once. `body` is the JSON sent, byte for byte, on every
# attempt; no secret is stored. `claimed_until`: an attempt in flight, claimed before it is
# sent; one whose claim lapsed (its worker died) is due again.
notifications = Table(
    "notifications",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("job_id", Integer, ForeignKey("jobs.id"), nullable=False),
    Column("event", String(32), nullable=False),
    Column("dedupe_key", String(128), nullable=False),
    Column("url", Text, nullable=False),
    Column("receiver", String(300), nullable=False),  # host:port, the per-receiver bound
    Column("body", Text, nullable=False),
    Column("state", String(16), nullable=False),  # pending | delivered | dead
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_at", Float, nullable=False),
    Column("claimed_until", Float),
    Column("last_error", Text),
    Column("created_at", Float, nullable=False),
    Column("ended_at", Float),
    UniqueConstraint("job_id", "dedupe_key", name="uq_notifications_job_key"),
    Index("ix_notifications_due", "state", "next_at"),
    Index("ix_notifications_job", "job_id", "created_at"),
)

# Nightly increments (`source.since`, docs/data.md): the highest value of the job's `since`
# column that a load has stored rows up to. Written in the load's own transaction, so a load
# that is refused or dies moves nothing; the next load reads only rows past it. `value` is
# JSON: {"kind": ..., "value": ...} (core/sources.py Watermark), so a date stays a date.
watermarks = Table(
    "watermarks",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id"), primary_key=True),
    Column("column", String(200), nullable=False),
    Column("value", Text, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# The Batch API server (`lowtide serve`). A file is uploaded input or produced output; its
# bytes live under the server's data dir at `path`. An API batch runs as lowtide jobs (one
# per model) named after it; `status` uses OpenAI's words for both APIs.
serve_files = Table(
    "serve_files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("purpose", String(32), nullable=False),
    Column("filename", Text, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("path", Text, nullable=False),  # relative to the data dir
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float),
)

serve_batches = Table(
    "serve_batches",
    metadata,
    Column("seq", Integer, primary_key=True),  # creation order: lists are newest first
    Column("id", String(64), nullable=False, unique=True),
    Column("api", String(16), nullable=False),  # openai | anthropic
    Column("status", String(16), nullable=False),
    Column("endpoint", String(64)),
    Column("model", String(256)),
    Column("input_file_id", String(64)),
    Column("completion_window", String(16)),
    Column("metadata", Text),  # JSON
    Column("jobs", Text, nullable=False),  # JSON: [{"name", "model"}], empty until validated
    Column("faults", Text, nullable=False),  # JSON: the fault plan's actions for this batch
    Column("total", Integer, nullable=False),
    Column("rejected", Integer, nullable=False),  # requests refused at the edge (bad params)
    Column("counts", Text),  # JSON: final counts, once ended
    Column("errors", Text),  # JSON: validation errors
    Column("output_file_id", String(64)),
    Column("error_file_id", String(64)),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("in_progress_at", Float),
    Column("finalizing_at", Float),
    Column("completed_at", Float),
    Column("failed_at", Float),
    Column("expired_at", Float),
    Column("cancelling_at", Float),
    Column("cancelled_at", Float),
    Column("output_expires_after", Float),  # seconds an OpenAI batch's output files live (None: 30 days)
    Index("ix_serve_batches_status", "status"),
)

# What `lowtide serve` would have charged (server/billing.py): one row per billable result
# line it wrote for a batch (a succeeded request; a line written twice is billed once), with
# the usage that line reports. `whole` False: the line was written cut (a fault plan's
# corrupt_lines) and no client could read what it was billed for.
serve_billing = Table(
    "serve_billing",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("batch_id", String(64), nullable=False),
    Column("api", String(16), nullable=False),  # openai | anthropic | gemini
    Column("custom_id", Text, nullable=False),  # a Gemini line's key
    Column("model", String(256)),
    Column("input_tokens", Integer, nullable=False),
    Column("cached_input_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    Column("cost_picousd", BigInteger),  # NULL: a model serve has no batch price for
    Column("whole", Boolean, nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_serve_billing_batch", "batch_id"),
)

# An eval (core/evals.py): its spec as given, from which its member jobs (one per variant,
# named EVAL.VARIANT) and its judge stage are derived again by `lowtide compare`.
evals = Table(
    "evals",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("spec", Text, nullable=False),  # JSON
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)
