"""Issue 34 N1, the store's side: the deliveries due are taken at most `per_tenant` of one
tenant's, so a tenant with thousands due (its receivers slow or down) never hides another's
behind them; on SQLite and PostgreSQL."""

from __future__ import annotations

from lowtide.server.gateway import records
from lowtide.server.gateway.records import DeferredState


def _finished(store, tenant: str, n: int, at: float) -> list[str]:
    """`n` of `tenant`'s deferred requests, finished at `at` with a callback: due then."""
    ids = [records.new_deferred_id() for _ in range(n)]
    rows = [records.accepted_row(id=gid, tenant=tenant, api="openai", model="m", payload="{}", decision="deferred",
                                 callback_url="https://hooks.example.com/x", accepted_at=at, deadline_at=at + 3600,
                                 expected_at=at) for gid in ids]  # fmt: skip
    result = {"target": "succeeded", "route": "echo", "result": "{}", "result_status": 200, "input_tokens": 1,
              "output_tokens": 1, "saved_picousd": None, "finished_at": at}  # fmt: skip
    with store.begin() as conn:
        records.insert_accepted(conn, rows)
        records.move(conn, ids, DeferredState.ACCEPTED, DeferredState.QUEUED)
        records.finish(conn, [{**result, "gid": gid} for gid in ids])
    return ids


def test_one_tenants_backlog_does_not_hide_anothers_due_deliveries(store):
    slow = _finished(store, "acme", 50, at=100.0)  # due first, and many
    other = _finished(store, "globex", 3, at=200.0)
    with store.begin() as conn:
        due = records.due_deliveries(conn, 300.0, limit=4, per_tenant=2)
        assert sorted(r.tenant for r in due) == ["acme", "acme", "globex", "globex"]
        # acme's share is taken (its attempts in flight): only globex's come, and not the ones in flight
        rest = records.due_deliveries(conn, 300.0, limit=4, per_tenant=2, skip_tenants=["acme"], skip_ids=other[:1])
        assert sorted(r.id for r in rest) == sorted(other[1:])
        assert records.next_delivery_time(conn, skip_tenants=["acme"]) == 200.0
        assert records.next_delivery_time(conn, skip_tenants=["acme", "globex"]) is None
        assert {r.id for r in records.due_deliveries(conn, 150.0, limit=10, per_tenant=3)} <= set(slow)


def test_an_outcome_is_recorded_only_while_its_claim_holds(store):
    (gid,) = _finished(store, "acme", 1, at=100.0)
    with store.begin() as conn:
        assert records.claim_delivery(conn, gid, 100.0, until=170.0)
        assert records.claim_delivery(conn, gid, 170.0, until=400.0)  # lapsed, taken by another gateway
        moved = records.move_delivery(conn, gid, records.Delivery.PENDING, records.Delivery.DELIVERED, claim=170.0,
                                      delivery_attempts=1, delivered_at=171.0)  # fmt: skip
        assert not moved  # the first attempt's late 2xx changes nothing
        assert records.move_delivery(conn, gid, records.Delivery.PENDING, records.Delivery.DELIVERED, claim=400.0,
                                     delivery_attempts=1, delivered_at=300.0)  # fmt: skip
