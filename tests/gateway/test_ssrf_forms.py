"""Issue 34 N9: the SSRF guard judges an address by every property `ipaddress` has (and the
ranges older Pythons miss), in every form that can carry it. The table is generated: each
inner address that must be refused, written as itself and in each IPv6 embedding (mapped,
compatible, translated, 6to4, Teredo, NAT64) and in the numeric spellings a resolver takes
(`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`); then IPv6-only ranges, `fec0::/10` among
them. Public addresses in the same forms stay accepted."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from lowtide.server.gateway.config import Callbacks
from lowtide.server.gateway.safety import CallbackRefused, check_callback

REFUSED_V4 = ["127.0.0.1", "127.1.2.3", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "100.64.0.1",
              "0.0.0.0", "0.1.2.3", "192.0.0.8", "192.0.2.1", "198.18.0.1", "198.51.100.7", "203.0.113.9",
              "224.0.0.1", "240.0.0.1", "255.255.255.255", "192.88.99.1"]  # fmt: skip
PUBLIC_V4 = ["93.184.216.34", "8.8.8.8", "1.1.1.1"]
REFUSED_V6 = ["::1", "::", "fe80::1", "febf::1", "fec0::1", "fec0:1:2:3::4", "fed0::1", "feff:ffff::1", "fc00::1", "fd12:3456::1",
              "ff02::1", "ff0e::1", "2001:db8::1", "100::1", "3fff::1", "5f00::1", "2001:10::1", "2001:2::1"]  # fmt: skip
PUBLIC_V6 = ["2606:4700:4700::1111", "2a00:1450:4001:81b::200e"]


def _v6_forms(v4: str) -> dict[str, str]:
    """Each standard IPv6 embedding of `v4`."""
    n = int(ipaddress.IPv4Address(v4))
    server = int(ipaddress.IPv4Address("65.54.227.120"))  # a Teredo server's public address
    hi, lo = n >> 16, n & 0xFFFF
    return {
        "mapped": f"::ffff:{v4}",
        "mapped-hex": f"::ffff:{hi:x}:{lo:x}",
        "compatible": f"::{v4}",
        "translated": f"::ffff:0:{v4}",
        "6to4": f"2002:{hi:x}:{lo:x}::1",
        "teredo": str(ipaddress.IPv6Address((0x20010000 << 96) | (server << 64) | (0x8000 << 48) | (0xFFFF << 32) | (n ^ 0xFFFFFFFF))),
        "nat64": f"64:ff9b::{hi:x}:{lo:x}",
    }


def _numeric(v4: str) -> dict[str, str]:
    """Spellings of `v4` that inet_aton (the resolver) reads as it."""
    a, b, c, d = (int(x) for x in v4.split("."))
    n = int(ipaddress.IPv4Address(v4))
    forms = {"integer": str(n), "hex": f"0x{n:08x}", "octal": f"0{a:o}.{b}.{c}.{d}" if a else f"0.{b}.{c}.{d}"}
    if b == 0 and c == 0:
        forms["short"] = f"{a}.{d}"
    return forms


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


REFUSED = (
    [(v4, "dotted", v4) for v4 in REFUSED_V4]
    + [(v4, form, text) for v4 in REFUSED_V4 for form, text in _v6_forms(v4).items()]
    + [(v4, form, text) for v4 in ("127.0.0.1", "10.0.0.1", "169.254.169.254") for form, text in _numeric(v4).items()]
    + [(v6, "ipv6", v6) for v6 in REFUSED_V6]
    + [("fe80::1", "zone", "fe80::1%25eth0"), ("::ffff:127.0.0.1", "zone", "::ffff:127.0.0.1%25lo")]
)
ACCEPTED = [(v4, "dotted", v4) for v4 in PUBLIC_V4] + [
    # Only these embeddings are public themselves: the others sit in ranges refused whole
    # (::/8 is reserved, 2001::/23 is IETF protocol space).
    (v4, form, text) for v4 in PUBLIC_V4 for form, text in _v6_forms(v4).items() if form in ("mapped", "mapped-hex", "6to4")
] + [(v6, "ipv6", v6) for v6 in PUBLIC_V6]  # fmt: skip


@pytest.mark.parametrize("inner, form, text", REFUSED, ids=[f"{i}-{f}" for i, f, _ in REFUSED])
def test_every_form_of_a_non_public_address_is_refused(inner, form, text):
    with pytest.raises(CallbackRefused, match="resolves to|does not resolve"):
        asyncio.run(check_callback(f"https://{_host(text)}/hook", Callbacks()))


@pytest.mark.parametrize("inner, form, text", ACCEPTED, ids=[f"{i}-{f}" for i, f, _ in ACCEPTED])
def test_public_addresses_in_their_forms_are_accepted(inner, form, text):
    asyncio.run(check_callback(f"https://{_host(text)}/hook", Callbacks()))


def test_site_local_is_private_not_reserved_so_allow_private_lets_it_through():
    """fec0::/10 is a private range (deprecated, RFC 3879): refused by default, allowed only
    where the operator allows private receivers."""
    with pytest.raises(CallbackRefused, match="a private address"):
        asyncio.run(check_callback("https://[fec0::1]/hook", Callbacks()))
    asyncio.run(check_callback("https://[fec0::1]/hook", Callbacks(allow_private=True)))


def test_the_gateway_refuses_a_site_local_callback(gateway):
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
    with gateway(callbacks={"allow_loopback": False}) as g, g.client() as c:
        for url in ("http://[fec0::1]/hook", "http://[feff::1]:8080/hook", "http://2130706433/hook"):
            r = c.post("/v1/chat/completions", json=chat, headers={"X-Lowtide-Defer": "1h", "X-Lowtide-Callback": url})
            assert r.status_code == 400 and "X-Lowtide-Callback" in r.json()["error"]["message"], url
        assert c.get("/v1/deferred").json()["data"] == []
