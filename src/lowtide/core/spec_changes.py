"""What differs between a job's stored spec and a new one (docs/jobs.md "Changing a job").

- rendering: changes every request's payload (model, params, template, …);
- sending: changes the route or lane requests go to (route, fallback, a decided chain);
- applied: changes no request (budget, deadline, retry, transport options …), applied as is.

Apart from these, `moves`: a route whose connection options (CONNECTION_OPTIONS: which
provider account, server or folder its batches live at) differ. Such a change alters no
request, but a batch already sent stays where it was sent and is polled with the options
the spec has now: the loader refuses it while a batch of the job is in flight on that route.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from lowtide.core.spec import JobSpec

RENDERING_KEYS = ("model", "endpoint", "params", "param_columns", "template", "choices", "response_schema", "source.id_column",
                  "truncate")
SENDING_KEYS = ("route", "fallback", "fallback.route", "fallback.model", "auto.chain")
# Route options that change what is sent or how it is billed, not only how it travels.
PAYLOAD_OPTIONS = ("service_tier", "cache_prefix")
# Route options that say where a route's batches live: the server (base_url; azure-batch's
# resource, endpoint; openai-compatible-batch's provider, profile, which gives both URL and
# key), the account (the key's variable), echo-batch's folder (dir). A route option of that
# kind joins here (tests/engine/test_connection_change.py checks every batch route's options are sorted).
# vertex-batch's key is an access token's variable (or anonymous) and its batches live in a project
# and location; bedrock-batch's in a region, at an endpoint, under a profile's account.
CONNECTION_OPTIONS = ("base_url", "api_key_env", "dir", "endpoint", "profile", "access_token_env", "anonymous", "project",
                      "location", "region", "endpoint_url")  # fmt: skip
_VARIABLE = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")  # as routes/_provider.not_a_variable


@dataclass(frozen=True, slots=True)
class Move:
    """One connection option of one route changed (`key` as the spec writes it)."""

    route: str
    key: str
    old: Any
    new: Any

    @property
    def line(self) -> str:
        return f"{self.key} {_show(self.old, self.key)} → {_show(self.new, self.key)}"


@dataclass(slots=True)
class SpecChanges:
    """What differs between a job's stored spec and a new one, as "key: old → new" lines."""

    rendering: list[str] = field(default_factory=list)  # changes every request's payload
    sending: list[str] = field(default_factory=list)  # changes the route or lane requests go to
    applied: list[str] = field(default_factory=list)  # changes no request
    moves: list[Move] = field(default_factory=list)  # connection options changed, per route

    @property
    def altering(self) -> list[str]:
        return self.rendering + self.sending


def spec_changes(old: JobSpec, new: JobSpec) -> SpecChanges:
    changes = SpecChanges(moves=connection_moves(old, new))
    before, after = _flat(old), _flat(new)
    # A fallback given where there was none moves no request: none is on its lane yet, no
    # batch is sent there, and the load puts every row to its route as it renders them. Taking
    # one away, or changing its route or model, moves the requests on that lane; so does one
    # given beside another change of lanes (a decided auto job's chain, which a fallback ends).
    fallback_added = old.fallback is None and new.fallback is not None
    added: list[str] = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        line = f"{key} {_show(a, key)} → {_show(b, key)}"
        if any(key == k or key.startswith(k + ".") for k in RENDERING_KEYS):
            changes.rendering.append(line)
        elif fallback_added and key.partition(".")[0] == "fallback":
            added.append(line)
        elif key in SENDING_KEYS or key.rsplit(".", 1)[-1] in PAYLOAD_OPTIONS:
            changes.sending.append(line)
        else:
            changes.applied.append(line)
    if changes.sending:
        changes.sending.extend(added)
    else:
        changes.applied = sorted(changes.applied + added)
    return changes


def connection_moves(old: JobSpec, new: JobSpec) -> list[Move]:
    """The connection options that differ, route by route: batches are polled by their
    route's name with the options of the lane on that route now (engine/context.py), so a
    route compares with itself wherever it sits (main, fallback, a chain's tier). A route
    the new spec no longer has is a sending change, not a move."""
    now = _by_route(new)
    moves = []
    for route, (_, was) in _by_route(old).items():
        if route not in now:
            continue
        where, options = now[route]
        for option in CONNECTION_OPTIONS:
            if was.get(option) != options.get(option):
                moves.append(Move(route, f"{where}.{option}", was.get(option), options.get(option)))
    return moves


def _by_route(spec: JobSpec) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each route's options and the spec key they sit under. A route in two tiers of a chain
    is a direct one (no batches to strand): its first tier stands for it."""
    if spec.chain:
        lanes = [("route_options" if i == 0 else f"auto.chain[{i}].route_options", t.route, t.route_options) for i, t in enumerate(spec.chain)]
    else:
        lanes = [("route_options", spec.route, spec.route_options)]
        if spec.fallback is not None:
            lanes.append(("fallback.route_options", spec.fallback.route, spec.fallback.route_options))
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for where, route, options in lanes:
        out.setdefault(route, (where, options))
    return out


def _flat(spec: JobSpec) -> dict[str, Any]:
    """The spec as dotted keys: a section's keys apart, route options one by one."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and prefix != "response_schema":
            for key, v in value.items():
                walk(f"{prefix}.{key}" if prefix else key, v)
        else:
            out[prefix] = value

    data = spec.model_dump(mode="json")
    walk("", data)
    out["fallback"] = "set" if data["fallback"] is not None else None  # added or removed
    return out


def _show(value: Any, key: str = "") -> str:
    """A value as a change line shows it: never a pasted key, nor a URL's password; a place
    whole (two long URLs or paths cut short may look the same)."""
    if value is None:
        return "(none)"
    option = key.rsplit(".", 1)[-1]
    if option == "api_key_env" and not (isinstance(value, str) and _VARIABLE.fullmatch(value)):
        return "(not a variable name, perhaps a key itself: not shown)"
    if option == "base_url" and isinstance(value, str):
        value = _without_password(value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if option in CONNECTION_OPTIONS or len(text) <= 60 else text[:57] + "..."


def _without_password(url: str) -> str:
    """A URL as shown: a user:password in it is not."""
    try:
        parts = urlsplit(url)
        if parts.password is None and parts.username is None:
            return url
        host = parts.hostname or ""
        return urlunsplit(parts._replace(netloc=f"***@{host}" + (f":{parts.port}" if parts.port else "")))
    except ValueError:  # not a URL the parser takes: shown only up to where credentials could start
        return url.split("@", 1)[-1]
