"""Safety: callback URLs refused for loopback, link-local and private addresses (host names
resolving there too, and every IPv6 form that embeds such an IPv4 address) unless allowed;
an allowlist; a request size limit; nothing secret or prompt-like in the logs; status URLs
from `public_url`, never from a request's Host."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest

from lowtide.server.gateway.config import Callbacks
from lowtide.server.gateway.safety import CallbackRefused, check_callback

from .conftest import KEYS, SECRET, UPSTREAM_KEY, wait_until

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "PROMPT-SHOULD-NOT-BE-LOGGED"}]}


def _with_callback(c, url):
    return c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": url})


def test_loopback_private_and_link_local_callbacks_are_refused_by_default(gateway, receiver):
    with gateway(callbacks={"allow_loopback": False}) as g, g.client() as c:
        for url in (f"{receiver.url}/hook", "http://localhost:9/hook", "http://10.1.2.3/hook", "http://192.168.0.7/hook",
                    "http://169.254.169.254/latest/meta-data", "http://[::1]:9/hook", "http://[fe80::1]/x",
                    "http://0.0.0.0/x", "http://100.64.0.1/x", "http://[::ffff:127.0.0.1]/x"):
            r = _with_callback(c, url)
            assert r.status_code == 400, url
            assert "X-Lowtide-Callback" in r.json()["error"]["message"]
        assert c.get("/v1/deferred").json()["data"] == []  # nothing was stored
    assert receiver.deliveries == []


def test_loopback_is_allowed_only_when_the_config_says_so(gateway, receiver):
    with gateway(callbacks={"allow_loopback": True}) as g, g.client() as c:
        assert _with_callback(c, f"{receiver.url}/hook").status_code == 202
        assert _with_callback(c, "http://10.1.2.3/hook").status_code == 400  # private is still refused
        wait_until(lambda: receiver.deliveries, what="the webhook")


def test_allowlist_scheme_and_credentials(gateway, receiver):
    with gateway(callbacks={"allow_loopback": True, "allowlist": ["hooks.example.com"]}) as g, g.client() as c:
        assert "allowlist" in _with_callback(c, f"{receiver.url}/hook").json()["error"]["message"]
        assert "scheme" in _with_callback(c, "ftp://hooks.example.com/x").json()["error"]["message"]
        assert "credentials" in _with_callback(c, "https://u:p@hooks.example.com/x").json()["error"]["message"]


@pytest.mark.parametrize("address, refused", [("10.0.0.8", True), ("172.20.1.1", True), ("127.0.0.1", True),
                                              ("169.254.169.254", True), ("fd00::1", True), ("93.184.216.34", False)])
def test_a_host_name_is_checked_by_every_address_it_resolves_to(monkeypatch, address, refused):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    def resolve(host, port, *args, **kwargs):  # the DNS answer for a name we own (no network in tests)
        assert host == "hooks.internal.example"
        public = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))
        return [public, (family, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    check = check_callback("https://hooks.internal.example/cb", Callbacks())
    if refused:
        with pytest.raises(CallbackRefused, match="resolves to"):
            asyncio.run(check)
    else:
        asyncio.run(check)


def test_a_host_outside_ascii_is_refused_for_the_two_names_it_has(monkeypatch):
    """`faß.evil.test` is `fass.evil.test` to the resolver the check asked (IDNA 2003) and
    `xn--fa-hia.evil.test` to httpx, which connects (IDNA 2008): a zone answering a public
    address for one and loopback for the other passed the check, and the POST landed on
    loopback. A name outside ASCII is refused; its xn-- form is judged as any name."""
    zone = {"fass.evil.test": "93.184.216.34", "xn--fa-hia.evil.test": "127.0.0.1"}

    def resolve(host, port, *args, **kwargs):  # the attacker's zone (no network in tests)
        name = host if host.isascii() else host.encode("idna").decode()
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (zone[name], port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(CallbackRefused, match=r"host faß.evil.test is not ASCII; write an internationalized name in its ASCII form"):
        asyncio.run(check_callback("https://faß.evil.test/cb", Callbacks()))
    with pytest.raises(CallbackRefused, match="resolves to a loopback address"):
        asyncio.run(check_callback("https://xn--fa-hia.evil.test/cb", Callbacks()))


def test_a_url_no_attempt_can_send_to_is_a_final_refusal():
    """A callback URL httpx cannot build a request for (one stored before hosts outside
    ASCII were refused) is refused for good: the attempt raised httpx.InvalidURL, which
    the delivery loops took for a store error, so the delivery stayed pending for ever,
    its attempts uncounted."""
    from lowtide.engine.webhook import post_once, webhook_client

    async def attempt():
        client = webhook_client(1, 5.0)
        try:
            return await post_once(client, "http://locªlhost:9/hook", b"{}", {}, 5.0, Callbacks(allow_loopback=True))
        finally:
            await client.aclose()

    with pytest.raises(CallbackRefused, match="callback URL: Invalid IDNA hostname"):
        asyncio.run(attempt())


def test_a_body_over_the_size_limit_is_refused_in_each_apis_shape(gateway, upstream):
    big = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 5000}]}
    with gateway(max_body_bytes=4096) as g, g.client() as c:
        openai_style = c.post("/v1/chat/completions", json=big)
        anthropic_style = c.post("/v1/messages", json=big)
        chunked = c.post("/v1/chat/completions", content=iter([b"{" + b" " * 3000, b" " * 3000 + b"}"]))
        fine = c.post("/v1/chat/completions", json=CHAT)
    assert openai_style.status_code == 413 and "4096" in openai_style.json()["error"]["message"]
    assert anthropic_style.status_code == 413 and anthropic_style.json()["error"]["type"] == "request_too_large"
    assert chunked.status_code == 413
    assert fine.status_code == 200 and len(upstream.calls) == 1


def test_no_key_secret_or_prompt_in_the_logs(gateway, receiver, caplog):
    caplog.set_level(logging.DEBUG, logger="lowtide")
    caplog.set_level(logging.INFO)
    with gateway() as g, g.client() as c:
        gid = _with_callback(c, f"{receiver.url}/hook?token=CALLBACK-TOKEN").json()["id"]
        c.post("/v1/chat/completions", json=CHAT)
        c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer WRONG-KEY-XYZ"})
        g.wait_done(gid)
        wait_until(lambda: receiver.deliveries, what="the webhook")
    assert "gateway" in caplog.text  # it did log (flushes, warnings) ...
    for secret in (*KEYS.values(), UPSTREAM_KEY, SECRET, "WRONG-KEY-XYZ", "PROMPT-SHOULD-NOT-BE-LOGGED", "CALLBACK-TOKEN"):
        assert secret not in caplog.text  # ... but none of these


# Every way an IPv6 address can carry an IPv4 one, and plain forms a resolver turns into one.
EMBEDDED = [
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::", "link-local"),  # 6to4 of 169.254.169.254 (cloud metadata)
    ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
    ("2002:c0a8:101::", "private"),  # 6to4 of 192.168.1.1
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo (server 65.54.227.120, client 127.0.0.1)
    ("2001:0:7f00:1::1", "loopback"),  # Teredo, server 127.0.0.1
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:a9fe:a9fe", "link-local"),  # IPv4-mapped, hex
    ("::127.0.0.1", "loopback"),  # IPv4-compatible
    ("::ffff:0:127.0.0.1", "loopback"),  # IPv4-translated
    ("64:ff9b::7f00:1", "loopback"),  # NAT64 well-known prefix
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of the metadata address
    ("64:ff9b:1:7f00:0:100::", "loopback"),  # NAT64 local-use prefix, /48 embedding of 127.0.0.1
    ("64:ff9b:1::a9fe:a9fe", "reserved"),  # NAT64 local-use prefix, /96 embedding
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
]
PUBLIC = ["2002:5db8:d822::1", "::ffff:93.184.216.34", "2606:4700:4700::1111", "93.184.216.34"]


@pytest.mark.parametrize("address, why", EMBEDDED)
def test_every_ipv6_embedding_of_an_inner_address_is_refused(address, why):
    with pytest.raises(CallbackRefused, match="resolves to") as err:
        asyncio.run(check_callback(f"https://[{address}]/hook", Callbacks()))
    assert why in str(err.value) or "reserved" in str(err.value)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_in_any_form_are_accepted(address):
    host = f"[{address}]" if ":" in address else address
    asyncio.run(check_callback(f"https://{host}/hook", Callbacks()))


@pytest.mark.parametrize("address", ["2002:7f00:1::", "::ffff:7f00:1", "64:ff9b::7f00:1"])
def test_a_name_resolving_to_an_embedded_loopback_is_refused(monkeypatch, address):
    def resolve(host, port, *args, **kwargs):  # the DNS answer for a name we own (no network in tests)
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(CallbackRefused, match="loopback|reserved"):
        asyncio.run(check_callback("https://hooks.example.com/cb", Callbacks()))


def test_6to4_callbacks_are_refused_by_the_gateway(gateway, receiver):
    with gateway(callbacks={"allow_loopback": False}) as g, g.client() as c:
        for url in ("http://[2002:7f00:1::]/hook", "http://[2002:a9fe:a9fe::]/latest/meta-data"):
            r = _with_callback(c, url)
            assert r.status_code == 400 and "X-Lowtide-Callback" in r.json()["error"]["message"], url
        assert c.get("/v1/deferred").json()["data"] == []


def test_the_host_header_never_becomes_a_status_url(gateway, receiver):
    with gateway() as g, g.client(headers={"host": "attacker.example:8443"}) as evil, g.client("globex") as globex:
        first = _with_callback(evil, f"{receiver.url}/hook")  # the first caller names its own host
        later = globex.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h"})
        for r in (first, later):
            assert r.status_code == 202
            assert r.headers["location"] == r.json()["status_url"] == f"/v1/deferred/{r.json()['id']}"
        assert globex.get("/v1/deferred").json()["data"][0]["status_url"].startswith("/v1/deferred/")
        wait_until(lambda: receiver.deliveries, what="the webhook")
    assert "attacker" not in json.dumps(receiver.deliveries[0]["body"])


def test_status_urls_come_from_public_url(gateway):
    with gateway(public_url="https://gw.example.com/") as g, g.client(headers={"host": "attacker.example"}) as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"X-Lowtide-Defer": "1h"})
    assert r.headers["location"] == r.json()["status_url"] == f"https://gw.example.com/v1/deferred/{r.json()['id']}"


@pytest.mark.parametrize("path, api", [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")])
def test_a_body_with_nan_is_refused_not_stored_as_null(gateway, upstream, path, api):
    """NaN is not JSON: deferred, it was stored and sent on as `temperature: null` (a body
    changed); forwarded, the upstream had it. Now a 400 naming the field, in the API's shape."""
    body = json.dumps({**CHAT, "max_tokens": 5}).replace('"model"', '"temperature": NaN, "model"')
    with gateway() as g, g.client() as c:
        deferred = c.post(path, content=body, headers={"X-Lowtide-Defer": "1h", "content-type": "application/json"})
        realtime = c.post(path, content=body, headers={"content-type": "application/json"})
    for answer in (deferred, realtime):
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert "'temperature'" in message and "NaN" in message
    assert upstream.calls == []
