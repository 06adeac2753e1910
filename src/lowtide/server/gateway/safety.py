"""Callback URLs: refused unless they point where the gateway may send results (SSRF).

A callback URL must

- use an allowed scheme (`http`, `https` by default) and carry no user:password;
- name a host matching `callbacks.allowlist` (globs such as `*.acme.com`; empty: any host);
- resolve only to public addresses: loopback (127/8, ::1), link-local (169.254/16 — the
  cloud metadata service — fe80::/10), private (10/8, 172.16/12, 192.168/16, fc00::/7),
  carrier-grade NAT (100.64/10), unspecified, multicast and reserved addresses are refused
  unless `allow_loopback` / `allow_link_local` / `allow_private` says otherwise. A host name
  is resolved and *every* address it has is checked.

The check runs when the request is accepted and again before each delivery (a name may
resolve elsewhere by then); delivery never follows redirects. What remains is the window
between that second check and httpx's own resolution (DNS rebinding within milliseconds).
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import socket
from urllib.parse import urlsplit

from lowtide.server.gateway.config import Callbacks

_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class CallbackRefused(ValueError):
    """The callback URL may not be used; the message says why (and never echoes a query)."""


def _address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, rules: Callbacks) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None if rules.allow_loopback else "a loopback address"
    if ip.is_link_local:
        return None if rules.allow_link_local else "a link-local address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "an unspecified, multicast or reserved address"
    if ip.is_private or ip in _CGNAT:
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
    if rules.allowlist and not any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in rules.allowlist):
        raise CallbackRefused(f"callback URL: host {host} is not in the gateway's callback allowlist")
    return host, port or (443 if parts.scheme == "https" else 80)


async def check_callback(url: str, rules: Callbacks) -> None:
    """Raise CallbackRefused unless `url` may receive results (see the module doc)."""
    host, port = check_url_form(url, rules)
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise CallbackRefused(f"callback URL: host {host} does not resolve") from None
        addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    for ip in addresses:
        problem = _address_problem(ip, rules)
        if problem is not None:
            raise CallbackRefused(f"callback URL: host {host} resolves to {problem} ({ip}); callbacks there are not allowed")
