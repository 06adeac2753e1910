"""Webhooks against hostile receivers (issue 34 N1/N2): tenant `acme`'s callbacks go to
receivers that answer 600 MB or drip their headers for ever; tenant `globex`'s to one that
answers at once. The gateway runs in this process (the receivers too: they hold ~1 MB), on
the system clock, deferred requests on the `echo` route.

    .venv/bin/python bench/webhooks.py                   # 8 floods of 600 MB, 8 drips, 100 others
    .venv/bin/python bench/webhooks.py --floods 2 --mb 100

Prints the process's peak RSS before the hostile deliveries and after them (target: flat,
within 50 MB), the bytes the flooding receivers got onto the network (target: a few MB, not
floods × mb), and how long globex's results took from landing to delivery (the gateway's
own `completed_at` and `delivered_at`), first with no hostile receiver, then beside acme's
(target: the same; before issue 34's fix, beside a drip: never).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package: its receivers and servers
from tests.gateway.conftest import serving  # noqa: E402
from tests.gateway.hostile import hostile  # noqa: E402

from lowtide.server.gateway import build_gateway_config, create_gateway_app  # noqa: E402
from lowtide.server.gateway.tenants import sha256_hex  # noqa: E402

KEYS = {"acme": "sk-bench-acme", "globex": "sk-bench-globex"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "call me back"}]}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def config(folder: str, timeout: float) -> dict:
    return {
        "data_dir": f"{folder}/data",
        "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},  # never called: everything is deferred
        "batch": {"openai": {"route": "echo"}},
        "collector": {"flush_size": 1000, "flush_age": 0},
        "tenants": [{"name": name, "key_sha256": sha256_hex(key)} for name, key in KEYS.items()],
        "callbacks": {"allow_loopback": True},
        "webhooks": {"secret_env": "BENCH_WEBHOOK_SECRET", "timeout": timeout, "max_attempts": 2, "backoff": 1},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--floods", type=int, default=8, help="acme's callbacks that answer --mb MB")
    parser.add_argument("--mb", type=int, default=600)
    parser.add_argument("--drips", type=int, default=8, help="acme's callbacks that drip their headers")
    parser.add_argument("--others", type=int, default=100, help="globex's callbacks, answered at once")
    parser.add_argument("--timeout", type=float, default=5.0, help="webhooks.timeout (seconds)")
    parser.add_argument("--give-up", type=float, default=120.0, help="stop waiting for deliveries after this long")
    args = parser.parse_args()
    os.environ["BENCH_WEBHOOK_SECRET"] = "whsec-bench"
    import httpx

    with tempfile.TemporaryDirectory() as folder, hostile("flood", flood_bytes=args.mb << 20) as flood, \
            hostile("drip") as drip, hostile("ok") as fine:  # fmt: skip
        app = create_gateway_app(build_gateway_config(config(folder, args.timeout)), db=f"{folder}/lowtide.db")
        with serving(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            def defer(tenant: str, hook: str) -> str:
                r = client.post("/v1/chat/completions", json=CHAT, headers={
                    "authorization": f"Bearer {KEYS[tenant]}", "X-Lowtide-Defer": "1h", "X-Lowtide-Callback": f"{hook}/hook"})  # fmt: skip
                r.raise_for_status()
                return r.json()["id"]

            def status(gid: str, tenant: str) -> dict:
                return client.get(f"/v1/deferred/{gid}", headers={"authorization": f"Bearer {KEYS[tenant]}"}).json()

            def delivery(gid: str, tenant: str) -> dict:
                return status(gid, tenant)["delivery"]

            def deliver_others(give_up: float) -> list[float]:
                """globex's results, landing to delivery (the gateway's own `completed_at` and
                `delivered_at`); those not delivered by `give_up` seconds from now are left out."""
                others = [defer("globex", fine.url) for _ in range(args.others)]
                took: dict[str, float] = {}
                stop = time.monotonic() + give_up
                while len(took) < len(others) and time.monotonic() < stop:
                    for gid in others:
                        if gid not in took and (s := status(gid, "globex"))["delivery"]["state"] == "delivered":
                            took[gid] = s["delivery"]["delivered_at"] - s["completed_at"]
                    time.sleep(0.2)
                return sorted(took.values())

            calm = deliver_others(args.give_up)  # every code path once, and the latency with no hostile receiver
            before = peak_rss_mb()
            hostile_ids = [defer("acme", flood.url) for _ in range(args.floods)] + [defer("acme", drip.url) for _ in range(args.drips)]
            stormy = deliver_others(args.give_up)
            stop = time.monotonic() + args.give_up
            while any(delivery(gid, "acme")["state"] == "pending" for gid in hostile_ids) and time.monotonic() < stop:
                time.sleep(0.2)
            after = peak_rss_mb()
            states = [delivery(gid, "acme")["state"] for gid in hostile_ids]
    print(f"hostile receivers: {args.floods} × {args.mb} MB answers, {args.drips} drips; webhooks.timeout {args.timeout:g} s")
    print(f"peak RSS before   {before:8.1f} MB")
    print(f"peak RSS after    {after:8.1f} MB   (+{after - before:.1f} MB; target ≤ 50)")
    print(f"flood bytes sent  {flood.sent / 2**20:8.1f} MB   of {args.floods * args.mb} MB answered "
          f"({flood.sent / max(1, args.floods * args.mb << 20):.4f})")  # fmt: skip
    for name, took in (("calm", calm), ("beside acme's", stormy)):
        if took:
            print(f"globex, {name:13} {len(took):4d}/{args.others} delivered within {args.give_up:g} s: "
                  f"p50 {statistics.median(took):.3f} s, max {took[-1]:.3f} s")  # fmt: skip
        else:
            print(f"globex, {name:13}    0/{args.others} delivered within {args.give_up:g} s")
    if calm and stormy:
        print(f"p50 beside acme's / calm: {statistics.median(stormy) / statistics.median(calm):.2f} (target ≈ 1; "
              "the machine's load sets both)")  # fmt: skip
    print(f"acme's outcomes   {dict((s, states.count(s)) for s in sorted(set(states)))}  (floods delivered, drips dead)")


if __name__ == "__main__":
    main()
