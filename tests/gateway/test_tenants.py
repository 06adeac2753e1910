"""Tenants: keys stored only as hashes, each tenant sees only its own requests (another
tenant's id is a 404), per-tenant quotas."""

from __future__ import annotations

from pathlib import Path

import httpx

from .conftest import KEYS, SECRET, UPSTREAM_KEY

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "tenant data"}]}
DEFER = {"X-Lowtide-Defer": "1h"}


def test_another_tenants_id_is_a_404_and_lists_hold_only_ones_own(gateway):
    with gateway() as g, g.client("acme") as acme, g.client("globex") as globex:
        mine = acme.post("/v1/chat/completions", json=CHAT, headers=DEFER).json()["id"]
        theirs = globex.post("/v1/chat/completions", json=CHAT, headers=DEFER).json()["id"]
        g.wait_done(mine, "acme")
        assert acme.get(f"/v1/deferred/{mine}").status_code == 200
        for other in (acme.get(f"/v1/deferred/{theirs}"), globex.get(f"/v1/deferred/{mine}")):
            assert other.status_code == 404
        unknown = acme.get("/v1/deferred/dfr_doesnotexist")
        assert unknown.status_code == 404 and unknown.json() == {  # the same answer as for an id that is not there
            "error": {**unknown.json()["error"], "message": "No deferred request found with id 'dfr_doesnotexist'."}}
        assert [d["id"] for d in acme.get("/v1/deferred").json()["data"]] == [mine]
        assert [d["id"] for d in globex.get("/v1/deferred").json()["data"]] == [theirs]


def test_a_missing_or_unknown_key_is_refused_in_each_apis_shape(gateway, upstream):
    with gateway() as g, httpx.Client(base_url=g.url) as c:
        openai_style = c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer wrong"})
        anthropic_style = c.post("/v1/messages", json=CHAT, headers={"x-api-key": "wrong"})
        none = c.get("/v1/deferred/dfr_x")
    assert openai_style.status_code == 401 and openai_style.json()["error"]["code"] == "invalid_api_key"
    assert anthropic_style.status_code == 401 and anthropic_style.json()["error"]["type"] == "authentication_error"
    assert none.status_code == 401
    assert upstream.calls == []


def test_keys_and_secrets_never_reach_the_store(gateway, tmp_path, receiver):
    with gateway() as g, g.client() as c:
        gid = c.post("/v1/chat/completions", json=CHAT, headers={**DEFER, "X-Lowtide-Callback": f"{receiver.url}/hook"}).json()["id"]
        c.post("/v1/chat/completions", json=CHAT)
        g.wait_done(gid)
    files = [p for p in Path(tmp_path).rglob("*") if p.is_file() and p.name.startswith("lowtide.db")]
    files += list((tmp_path / "gateway-data").rglob("*.jsonl"))
    assert files
    for path in files:
        data = path.read_bytes()
        for secret in (*KEYS.values(), UPSTREAM_KEY, SECRET):
            assert secret.encode() not in data, f"{secret} found in {path.name}"


def test_quota_of_requests_per_minute(gateway, upstream, clock, tmp_path):
    tenants = [{"name": "acme", "key_sha256": __import__("hashlib").sha256(KEYS["acme"].encode()).hexdigest(),
                "quotas": {"rpm": 2}}]
    with gateway(clock=clock, tenants=tenants) as g, g.client() as c:
        assert [c.post("/v1/chat/completions", json=CHAT).status_code for _ in range(2)] == [200, 200]
        over = c.post("/v1/chat/completions", json=CHAT, headers=DEFER)
        assert over.status_code == 429 and "quota" in over.json()["error"]["message"]
        assert int(over.headers["retry-after"]) >= 1
        clock.advance(60)
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_quota_of_pending_deferred_requests(gateway, tmp_path):
    import hashlib

    tenants = [{"name": "acme", "key_sha256": hashlib.sha256(KEYS["acme"].encode()).hexdigest(), "quotas": {"max_pending": 1}}]
    collector = {"flush_age": 3600, "flush_size": 1000}  # nothing finishes while we look
    with gateway(tenants=tenants, collector=collector) as g, g.client() as c:
        assert c.post("/v1/chat/completions", json=CHAT, headers=DEFER).status_code == 202
        second = c.post("/v1/chat/completions", json=CHAT, headers=DEFER)
        assert second.status_code == 429 and "still waiting" in second.json()["error"]["message"]
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # real time is not held back
