"""Callback URLs and their signatures: who may receive what lowtide sends out (SSRF), and
how a receiver knows it came from lowtide. The gateway's webhooks (server/gateway/) and job
notifications (engine/notify.py) both use these rules, so one URL is judged the same way
by both.

A callback URL must

- use an allowed scheme (`http`, `https` by default) and carry no user:password;
- name its host in ASCII (an internationalized name in its xn-- form): a name outside ASCII
  has two ASCII forms (IDNA 2003 and 2008), and the one judged must be the one connected to;
- name a host matching `Callbacks.allowlist` (globs such as `*.acme.com`; empty: any host);
- resolve only to public addresses: loopback (127/8, ::1), link-local (169.254/16 — the
  cloud metadata service — fe80::/10), private (10/8, 172.16/12, 192.168/16, fc00::/7, the
  deprecated site-local fec0::/10), carrier-grade NAT (100.64/10), every other range
  `ipaddress` does not call global, unspecified, multicast and reserved addresses are refused
  unless `allow_loopback` / `allow_link_local` / `allow_private` says otherwise. A host name
  is resolved and *every* address it has is checked; an IPv6 address that carries an IPv4
  one (IPv4-mapped, -compatible or -translated, 6to4, Teredo, NAT64) is judged by that
  IPv4 address too (`embedded_ipv4`).

The check runs when a URL is accepted (a gateway request, a job spec's `notify:`) and again
before each delivery (a name may resolve elsewhere by then); delivery never follows
redirects. What remains is the window between that second check and httpx's own
resolution (DNS rebinding within milliseconds).

Signatures (`sign`, `verify`): `sha256=HEX( HMAC-SHA256(secret, timestamp + "." + raw body) )`,
sent as `X-Lowtide-Signature` beside `X-Lowtide-Timestamp` (Unix seconds).
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import ipaddress
import math
import socket
import time
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field


class Callbacks(BaseModel):
    """Which callback URLs are accepted. A host must match the allowlist (globs; empty: any
    host), and every address it resolves to must be public unless allowed here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowlist: list[str] = Field(default_factory=list)
    allow_private: bool = False  # 10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10, …
    allow_loopback: bool = False  # 127/8, ::1
    allow_link_local: bool = False  # 169.254/16 (cloud metadata), fe80::/10
    schemes: list[Literal["http", "https"]] = Field(default_factory=lambda: ["https", "http"])


_CGNAT = ipaddress.ip_network("100.64.0.0/10")
# Not for hosts, whatever this Python's `ipaddress` says of them (its tables grew over versions).
_NOT_ROUTED = tuple(ipaddress.ip_network(n) for n in (
    "192.0.0.0/24",  # IETF protocol assignments (dummy address, PCP and TURN anycast: no receivers)
    "192.88.99.0/24",  # the deprecated 6to4 relay anycast (RFC 7526)
    "3fff::/20",  # documentation (RFC 9637)
    "5f00::/16",  # SRv6 segment identifiers (RFC 9602)
    "2001:db8::/32",  # documentation
    "100::/64",  # discard-only (RFC 6666)
))  # fmt: skip


class CallbackRefused(ValueError):
    """The callback URL may not be used; the message says why (and never echoes a query)."""


_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
# RFC 6052: where an IPv4 address sits in a NAT64 address, by prefix length (bit ranges,
# MSB = bit 0; bits 64-71 are the zero "u" octet and never carry it).
_RFC6052 = {32: ((32, 63),), 40: ((40, 63), (72, 79)), 48: ((48, 63), (72, 87)),
            56: ((56, 63), (72, 95)), 64: ((72, 103),), 96: ((96, 127),)}  # fmt: skip


def _bits(n: int, first: int, last: int) -> int:
    return (n >> (127 - last)) & ((1 << (last - first + 1)) - 1)


def _nat64(n: int, prefix: int) -> ipaddress.IPv4Address:
    value = 0
    for first, last in _RFC6052[prefix]:
        value = (value << (last - first + 1)) | _bits(n, first, last)
    return ipaddress.IPv4Address(value)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address an IPv6 address carries, by each standard embedding: IPv4-mapped
    (::ffff:0:0/96), IPv4-translated (::ffff:0:0:0/96), IPv4-compatible (::/96), 6to4
    (2002::/16), Teredo (2001::/32: server and client) and NAT64 (64:ff9b::/96, and the
    local-use 64:ff9b:1::/48 at every RFC 6052 prefix length, since its length is not known)."""
    n = int(ip)
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if n >> 32 == 0xFFFF0000 or (n >> 32 == 0 and n > 1):  # ::ffff:0:a.b.c.d, ::a.b.c.d
        found.append(ipaddress.IPv4Address(n & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64_WELL_KNOWN:
        found.append(_nat64(n, 96))
    elif ip in _NAT64_LOCAL:
        found.extend(_nat64(n, prefix) for prefix in (48, 56, 64, 96))
    return found


def _address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, rules: Callbacks) -> str | None:
    """Why `ip` may not receive callbacks ("a loopback address (127.0.0.1)"), or None. An
    IPv6 address that embeds IPv4 addresses is judged by each of them first, then by itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in embedded_ipv4(ip):
            problem = _one_address_problem(inner, rules)
            if problem is not None:
                return f"{problem} ({inner}, embedded in {ip})"
        if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d is that IPv4 address, nothing more
            return None
    problem = _one_address_problem(ip, rules)
    return None if problem is None else f"{problem} ({ip})"


def _one_address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, rules: Callbacks) -> str | None:
    """Every property `ipaddress` knows, and the ranges older Pythons do not flag: an
    address is public only if nothing says otherwise."""
    if ip.is_loopback:
        return None if rules.allow_loopback else "a loopback address"
    if ip.is_link_local:
        return None if rules.allow_link_local else "a link-local address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved or any(ip in net for net in _NOT_ROUTED):
        return "an unspecified, multicast or reserved address"
    site_local = isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local
    if site_local or ip.is_private or ip in _CGNAT or not ip.is_global:
        return None if rules.allow_private else "a private address"
    return None


def check_url_form(url: str, rules: Callbacks) -> tuple[str, int]:
    """Scheme, credentials and allowlist; returns (host, port)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise CallbackRefused("callback URL: not a valid URL") from None
    if parts.scheme not in rules.schemes:
        raise CallbackRefused(f"callback URL: scheme {parts.scheme or '(none)'!r} is not allowed; use {' or '.join(rules.schemes)}")
    if parts.username is not None or parts.password is not None:
        raise CallbackRefused("callback URL: credentials in the URL are not allowed")
    host = (parts.hostname or "").lower()
    if not host:
        raise CallbackRefused("callback URL: no host")
    if not host.isascii():
        # A name outside ASCII has two ASCII forms (IDNA 2003 here, IDNA 2008 in httpx:
        # faß.example is fass.example to one, xn--fa-hia.example to the other): the name
        # judged must be the one connected to.
        raise CallbackRefused(f"callback URL: host {host} is not ASCII; write an internationalized name in its "
                              "ASCII form (xn--…), the one its DNS records are under")  # fmt: skip
    if rules.allowlist and not any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in rules.allowlist):
        raise CallbackRefused(f"callback URL: host {host} is not in the gateway's callback allowlist")
    return host, port or (443 if parts.scheme == "https" else 80)


def _judge(host: str, addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address], rules: Callbacks) -> None:
    for ip in addresses:
        problem = _address_problem(ip, rules)
        if problem is not None:
            raise CallbackRefused(f"callback URL: host {host} resolves to {problem}; callbacks there are not allowed")


def _literal(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address] | None:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        return None


def _addresses(host: str, infos: list) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


async def check_callback(url: str, rules: Callbacks) -> None:
    """Raise CallbackRefused unless `url` may receive results (see the module doc)."""
    host, port = check_url_form(url, rules)
    addresses = _literal(host)
    if addresses is None:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise CallbackRefused(f"callback URL: host {host} does not resolve") from None
        addresses = _addresses(host, infos)
    _judge(host, addresses, rules)


def check_literal(host: str, rules: Callbacks) -> None:
    """If `host` is an address (not a name), judge it now: no resolution needed."""
    addresses = _literal(host)
    if addresses is not None:
        _judge(host, addresses, rules)


def check_callback_now(url: str, rules: Callbacks) -> None:
    """`check_callback` for code that is not async (a spec being loaded): the same rules."""
    host, port = check_url_form(url, rules)
    addresses = _literal(host)
    if addresses is None:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise CallbackRefused(f"callback URL: host {host} does not resolve") from None
        addresses = _addresses(host, infos)
    _judge(host, addresses, rules)


def shown_url(url: str) -> str:
    """A URL as messages and events show it: scheme, host, port and path, never its query
    (it may carry a token) or credentials."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not a valid URL)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}"


# --- signatures ------------------------------------------------------------------------------


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, signature: str | bytes, now: float | None = None,
           tolerance: float = 300.0) -> bool:  # fmt: skip
    """For receivers: the signature matches and the timestamp is within `tolerance` seconds
    of `now` (default: this machine's clock) — a replayed old delivery is refused. Any
    header that is malformed (not ASCII, not a number) is simply False, never an error."""
    now = time.time() if now is None else now
    try:
        stamp = timestamp.encode("ascii") if isinstance(timestamp, str) else bytes(timestamp)
        sent = float(stamp)
        given = signature.encode("utf-8", "surrogateescape") if isinstance(signature, str) else bytes(signature)
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        return False
    if not math.isfinite(sent) or abs(now - sent) > tolerance:
        return False
    expected = ("sha256=" + hmac.new(secret, stamp + b"." + body, hashlib.sha256).hexdigest()).encode("ascii")
    return hmac.compare_digest(expected, given)
