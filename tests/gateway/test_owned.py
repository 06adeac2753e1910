"""The ownership records (owned.py) on both backends: the first owner of an object keeps it
even when two gateways record it at once, pages run newest first with both cursors, a
forgotten object is nobody's, and a store made before the table existed gains it."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from lowtide.server.gateway import owned
from lowtide.store.db import Store
from lowtide.store.gateway_schema import gateway_objects
from lowtide.store.schema import migrations


def test_one_owner_even_when_two_gateways_record_at_once(store):
    other = Store(store.location)  # a second gateway process on the same store
    try:
        barrier = threading.Barrier(2)

        def claim(s: Store, tenant: str) -> None:
            barrier.wait()
            owned.record(s, tenant, "openai", "file", ["file-1"], 1.0)

        threads = [threading.Thread(target=claim, args=(s, t)) for s, t in ((store, "acme"), (other, "globex"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        first = owned.owner(store, "openai", "file", "file-1")
        assert first in ("acme", "globex") and owned.owner(other, "openai", "file", "file-1") == first
        owned.record(store, "globex" if first == "acme" else "acme", "openai", "file", ["file-1"], 2.0)
        assert owned.owner(store, "openai", "file", "file-1") == first  # a later claim changes nothing
    finally:
        other.close()


def test_pages_are_the_tenants_own_newest_first(store):
    for i in range(5):
        owned.record(store, "acme", "openai", "batch", [f"batch_{i}"], float(i))
    owned.record(store, "globex", "openai", "batch", ["batch_g"], 9.0)
    owned.record(store, "acme", "openai", "file", ["file-a"], 9.0)  # another kind
    assert owned.page(store, "acme", "openai", "batch", 3) == ["batch_4", "batch_3", "batch_2"]
    assert owned.page(store, "acme", "openai", "batch", 3, after="batch_2") == ["batch_1", "batch_0"]
    assert owned.page(store, "acme", "openai", "batch", 2, before="batch_1") == ["batch_3", "batch_2"]
    assert owned.page(store, "acme", "openai", "batch", 2, after="batch_g") == ["batch_4", "batch_3"]  # not its cursor
    owned.forget(store, "openai", "batch", "batch_4")
    assert owned.owner(store, "openai", "batch", "batch_4") is None
    assert owned.page(store, "globex", "openai", "batch", 10) == ["batch_g"]


def test_a_store_made_before_the_table_gains_it(tmp_path):
    path = str(tmp_path / "old.db")
    with Store(path) as s, s.begin() as conn:  # as a store last opened before m006
        gateway_objects.drop(conn)
        conn.execute(sa.delete(migrations).where(migrations.c.name == "m006_gateway_objects"))
    with Store(path) as s:
        owned.record(s, "acme", "anthropic", "message_batch", ["msgbatch_1"], 1.0)
        assert owned.owner(s, "anthropic", "message_batch", "msgbatch_1") == "acme"


def test_the_owner_cache_remembers_only_known_owners(store):
    owners = owned.Owners(store)
    assert owners.owner("openai", "batch", "batch_1") is None
    owned.record(store, "acme", "openai", "batch", ["batch_1"], 1.0)  # recorded after it was asked for
    assert owners.cached("openai", "batch", "batch_1") is None and owners.owner("openai", "batch", "batch_1") == "acme"
    assert owners.cached("openai", "batch", "batch_1") == "acme"
    owners.forget("openai", "batch", "batch_1")
    assert owners.cached("openai", "batch", "batch_1") is None and owners.owner("openai", "batch", "batch_1") is None
