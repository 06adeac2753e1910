"""Garbage-collector settings for processes that move many rows.

A job passes hundreds of thousands of short-lived rows, dicts and outcomes through Python.
CPython's default thresholds (700, 10, 10) start a collection every 700 net allocations of
containers and a full pass over every live object every 100 of those; at this volume that
work is a fifth of the CPU of both `lowtide serve` and the client in bench/batch.py, for
almost no garbage (the rows hold no reference cycles). lowtide's commands raise the
thresholds at start; a program that embeds lowtide for big jobs can call `tune_gc()` too.
Cycles are still collected, in rarer, larger passes.
"""

from __future__ import annotations

import gc

# 200,000: more than the containers a dispatch of 5,000 requests keeps live at once (their
# parsed bodies and answers: ~85,000 for bench/pipeline.py's, with the engine's own beside
# them), so no collection walks them mid-dispatch only to find them alive (bench/pipeline.py:
# 0.97x CPU against 50,000, same peak RSS). Cyclic garbage waits for that many new containers.
THRESHOLDS = (200_000, 20, 100)


def tune_gc() -> None:
    """Collect garbage less often: see the module doc."""
    gc.set_threshold(*THRESHOLDS)
