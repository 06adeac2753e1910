"""Ordered, uniquely named migrations, applied when the store opens (llm's migrations.py).

Append new ones at the end; never edit or reorder an applied one. A store that has a
migration this release does not know was written by a newer lowtide and is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, inspect, select, text

from lowtide.core.errors import StoreError
from lowtide.store import schema

Migration = Callable[[Connection], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_initial(conn: Connection) -> None:
    tables = [schema.jobs, schema.requests, schema.dispatches, schema.attempts, schema.events]
    schema.metadata.create_all(conn, tables=tables)


def up_to_date(conn: Connection) -> bool:
    """Whether every migration this release knows is applied, read without writing (a store
    opened for a look must not queue for SQLite's write lock). A store written by a newer
    lowtide is refused here too."""
    tables = inspect(conn)
    if not (tables.has_table(schema.migrations.name) and tables.has_table(schema.meta.name)):
        return False
    done = set(conn.scalars(select(schema.migrations.c.name)))
    _refuse_newer(done)
    return {name for name, _ in MIGRATIONS} <= done


def _refuse_newer(done: set[str]) -> None:
    unknown = done - {name for name, _ in MIGRATIONS}
    if unknown:
        raise StoreError(
            f"this store was written by a newer lowtide (migrations {', '.join(sorted(unknown))}); "
            "upgrade lowtide, or point LOWTIDE_DB at another store"
        )


def apply_migrations(conn: Connection) -> list[str]:
    """Apply what is missing, in order; return the names applied now."""
    if conn.dialect.name == "postgresql":
        # Processes opening one schema at once (workers started together on a new database)
        # take turns: the next sees the tables the first made instead of failing to make them
        # again. Held until this transaction ends; SQLite's BEGIN IMMEDIATE already does this.
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('lowtide migrations ' || current_schema()))"))
    schema.metadata.create_all(conn, tables=[schema.meta, schema.migrations])
    done = set(conn.scalars(select(schema.migrations.c.name)))
    _refuse_newer(done)
    applied = []
    for name, fn in MIGRATIONS:
        if name not in done:
            fn(conn)
            conn.execute(schema.migrations.insert().values(name=name, applied_at=time.time()))
            applied.append(name)
    return applied


@migration
def m002_serve_batches(conn: Connection) -> None:
    schema.metadata.create_all(conn, tables=[schema.serve_files, schema.serve_batches])


@migration
def m003_fallback_lane(conn: Connection) -> None:
    """Requests get a lane (main route or fallback route); batches remember a deadline cut."""
    add_columns(conn, schema.requests, ["lane", "lane_reason", "lane_base_attempts"])
    add_columns(conn, schema.dispatches, ["cut_at"])


@migration
def m004_cost_ledger(conn: Connection) -> None:
    """Attempts record model, tier, whether billed, cost and real-time equivalent; dispatches
    the budget reservation. Attempts recorded before this keep a NULL (unknown) cost."""
    add_columns(conn, schema.attempts, ["model", "tier", "billed", "cost_picousd", "realtime_picousd"])
    add_columns(conn, schema.dispatches, ["reserved_picousd"])


def add_columns(conn: Connection, table, names: list[str]) -> None:
    """ALTER TABLE … ADD COLUMN for columns declared in schema.py after the table was made."""
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for name in names:
        if name in present:  # a table created by m001 from the current schema has them already
            continue
        column = table.c[name]
        ddl = f"ALTER TABLE {table.name} ADD COLUMN {name} {column.type.compile(conn.dialect)}"
        if column.server_default is not None:
            ddl += f" DEFAULT '{column.server_default.arg}'"
        if not column.nullable:
            ddl += " NOT NULL"
        conn.execute(text(ddl))


@migration
def m005_gateway(conn: Connection) -> None:
    """The peak-shaving gateway's deferred requests and flushes (store/gateway_schema.py)."""
    from lowtide.store.gateway_schema import GATEWAY_TABLES

    schema.metadata.create_all(conn, tables=GATEWAY_TABLES)


@migration
def m006_gateway_objects(conn: Connection) -> None:
    """Which tenant owns each upstream file and batch made through the gateway."""
    from lowtide.store.gateway_schema import GATEWAY_OBJECT_TABLES

    schema.metadata.create_all(conn, tables=GATEWAY_OBJECT_TABLES)


@migration
def m007_dispatch_submit_started(conn: Connection) -> None:
    """Dispatches remember when their create began (`find` adopts by that time, not by when
    the chunk was planned). Dispatches from before keep NULL: `find` falls back to created_at."""
    add_columns(conn, schema.dispatches, ["submit_started_at"])


@migration
def m008_request_fingerprints(conn: Connection) -> None:
    """Requests record the model and a fingerprint of what they were rendered with, and a
    version; earlier versions of re-rendered requests are kept (DESIGN invariant 9)."""
    add_columns(conn, schema.requests, ["model", "fingerprint", "version"])
    schema.metadata.create_all(conn, tables=[schema.request_versions])
    _backfill_rendered(conn)


def _model_of(payload: dict) -> str:
    """The model of a stored payload: its body's (since m009), or its own (before)."""
    body = payload.get("body")
    return str((body if isinstance(body, dict) else payload).get("model", ""))


@migration
def m009_request_responses(conn: Connection) -> None:
    """Requests keep the provider's whole answer body (DESIGN invariant 8); versions too."""
    add_columns(conn, schema.requests, ["response"])
    add_columns(conn, schema.request_versions, ["response"])


@migration
def m010_serve_output_expiry(conn: Connection) -> None:
    """`lowtide serve` batches remember `output_expires_after`: how long their output files live."""
    add_columns(conn, schema.serve_batches, ["output_expires_after"])



@migration
def m011_dash_dispatch_phases(conn: Connection) -> None:
    """Batch dispatches remember each provider phase they were seen in, and when (the
    dashboard's batch timeline). Dispatches from before have none: their timeline shows
    created, submitted and ended only."""
    schema.metadata.create_all(conn, tables=[schema.dispatch_phases])

def _backfill_rendered(conn: Connection, page: int = 5000) -> None:
    """Requests stored before m008: their model from their own payload (what was sent), so
    pricing and planning read it as any other's. Their fingerprint stays NULL: the row
    values it covers were not kept; such a request is compared by its payload."""
    from sqlalchemy import bindparam

    from lowtide.core import fastjson

    r = schema.requests.c
    stmt = schema.requests.update().where(r.id == bindparam("_id")).values(model=bindparam("m"))
    after = 0
    while True:
        rows = conn.execute(select(r.id, r.payload).where(r.model.is_(None), r.id > after).order_by(r.id).limit(page)).all()
        if not rows:
            return
        conn.execute(stmt, [{"_id": rid, "m": _model_of(fastjson.loads(p))} for rid, p in rows])
        after = rows[-1][0]


@migration
def m012_evals(conn: Connection) -> None:
    """Eval specs (core/evals.py): the variants an eval runs as member jobs, kept for `compare`."""
    schema.metadata.create_all(conn, tables=[schema.evals])


@migration
def m013_tiers_dispatch_model(conn: Connection) -> None:
    """Dispatches keep their model and estimated input tokens: enqueued-token limits and
    measured turnarounds per route and model (engine/batches.py, engine/turnaround.py)."""
    add_columns(conn, schema.dispatches, ["model", "input_tokens_est"])


@migration
def m014_dispatch_tier(conn: Connection) -> None:
    """Direct dispatches keep the service tier they asked for: turnarounds per tier
    (engine/turnaround.py). Those from before read as the route's default tier."""
    add_columns(conn, schema.dispatches, ["tier"])


@migration
def m015_requests_lane_index(conn: Connection) -> None:
    """Pending requests are indexed by job and lane: a chain's tick finds which lanes have
    pending requests by one seek each, and a tier claims its due requests in order, without
    reading every pending row of the job (engine/tiers.py, engine/dispatch.py). A partial
    index: a request is in it only while pending, so answers do not update it."""
    index = next(i for i in schema.requests.indexes if i.name == "ix_requests_pending_lane")
    index.create(conn, checkfirst=True)  # a store made by m001 from this schema has it already


@migration
def m016_dispatches_turnaround_index(conn: Connection) -> None:
    """Dispatches are indexed by route, model, kind, tier and state, newest ended last: a
    chain's tick reads a tier's recent turnarounds off it (engine/turnaround.py)."""
    index = next(i for i in schema.dispatches.indexes if i.name == "ix_dispatches_turnaround")
    index.create(conn, checkfirst=True)  # a store made by m001 from this schema has it already


@migration
def m017_plain_answers(conn: Connection) -> None:
    """Requests keep a plain answer's finish_reason beside its response (schema.py), so an
    export of plain answers reads no response. Older rows stay NULL and are read as before."""
    add_columns(conn, schema.requests, ["plain_answer"])


@migration
def m018_dispatch_lost_since(conn: Connection) -> None:
    """Dispatches keep when the provider first said it does not know their batch: a batch
    lost at the provider is given up after a grace instead of being polled for ever."""
    add_columns(conn, schema.dispatches, ["lost_since"])


@migration
def m019_serve_billing(conn: Connection) -> None:
    """`lowtide serve` keeps what it would have charged, per result line (server/billing.py)."""
    schema.metadata.create_all(conn, tables=[schema.serve_billing])


@migration
def m020_repair_sends(conn: Connection) -> None:
    """Which sends carried repair turns (schema.py `repair_sends`): a repair attempt's cost
    is reported apart. Repairs made before this are counted with the other attempts."""
    schema.metadata.create_all(conn, tables=[schema.repair_sends])


@migration
def m021_notifications(conn: Connection) -> None:
    """Job notifications' outbox (schema.py `notifications`, engine/notify.py)."""
    schema.metadata.create_all(conn, tables=[schema.notifications])


@migration
def m022_watermarks(conn: Connection) -> None:
    """Nightly increments' watermarks (schema.py `watermarks`, `source.since`)."""
    schema.metadata.create_all(conn, tables=[schema.watermarks])


@migration
def m023_requests_dispatch_id_index(conn: Connection) -> None:
    """Requests are indexed by dispatch and id (schema.py `ix_requests_dispatch`): a page of a
    batch being written out is one range of the index, not a pass over the table's ids."""
    index = next(i for i in schema.requests.indexes if i.name == "ix_requests_dispatch")
    index.drop(conn, checkfirst=True)
    index.create(conn)


@migration
def m024_lost_batch_watch(conn: Connection) -> None:
    """Dispatches given up as lost remember until when they are still polled for a bill."""
    add_columns(conn, schema.dispatches, ["watch_until"])


@migration
def m025_job_moves(conn: Connection) -> None:
    """Jobs count their state moves (store/transitions.py `move_job`)."""
    add_columns(conn, schema.jobs, ["moves"])


@migration
def m026_payload_heads(conn: Connection) -> None:
    """A job's payloads keep what they share once (schema.py `payload_heads`, store/payloads.py):
    new requests store their own part and `head_id`; older rows stay whole (`head_id` NULL)."""
    schema.metadata.create_all(conn, tables=[schema.payload_heads])
    add_columns(conn, schema.requests, ["head_id"])
    add_columns(conn, schema.request_versions, ["head_id"])
