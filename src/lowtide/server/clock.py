"""The server's clock: real time, optionally running `scale` times faster.

With `--time-scale 3600` a batch's 24 h window passes in 24 real seconds, and every
timestamp the API reports follows this clock. The anchor (a real and a scaled instant) is
kept in the store, so the clock never runs backwards across restarts, even with a new scale.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import select

from lowtide.store.db import Store
from lowtide.store.schema import meta

ANCHOR_KEY = "serve.clock"


class ScaledClock:
    """`now() = virtual0 + (real() - real0) × scale` (a `lowtide.core.clock.Clock`)."""

    def __init__(self, scale: float = 1.0, real0: float | None = None, virtual0: float | None = None,
                 real: Callable[[], float] = time.time):  # fmt: skip
        if scale <= 0:
            raise ValueError("the time scale must be above 0")
        self.scale = scale
        self._real = real
        self.real0 = real() if real0 is None else real0
        self.virtual0 = self.real0 if virtual0 is None else virtual0

    def now(self) -> float:
        return self.virtual0 + (self._real() - self.real0) * self.scale

    def real_seconds(self, scaled: float) -> float:
        """How long `scaled` seconds of this clock take in real time."""
        return scaled / self.scale

    @classmethod
    def open(cls, store: Store, scale: float = 1.0, real: Callable[[], float] = time.time) -> ScaledClock:
        """The clock anchored in `store`; re-anchored (continuing from where the old scale
        has brought it) when the scale changed, and anchored now in a new store."""
        with store.begin() as conn:
            raw = conn.execute(select(meta.c.value).where(meta.c.key == ANCHOR_KEY)).scalar()
            if raw is not None:
                old = json.loads(raw)
                if old["scale"] == scale:
                    return cls(scale, old["real0"], old["virtual0"], real)
                continuing = cls(old["scale"], old["real0"], old["virtual0"], real).now()
                clock = cls(scale, real(), max(continuing, real()), real)
            else:
                clock = cls(scale, real=real)
            value = json.dumps({"scale": scale, "real0": clock.real0, "virtual0": clock.virtual0})
            if raw is None:
                conn.execute(meta.insert().values(key=ANCHOR_KEY, value=value))
            else:
                conn.execute(meta.update().where(meta.c.key == ANCHOR_KEY).values(value=value))
        return clock


class SteppedClock:
    """An injected clock (ServeConfig.clock) with ScaledClock's face, at scale 1: it moves
    only when its owner moves it, and one of its seconds counts as one real second."""

    scale = 1.0

    def __init__(self, clock):
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    def real_seconds(self, scaled: float) -> float:
        return scaled
