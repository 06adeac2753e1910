"""Calibrated choice scoring ("Calibrate Before Use", Zhao et al. 2021), route-level.

A small model has a strong prior over the answers whatever the input: SmolLM2-135M finds
"billing" (tokens "b" + "illing") likeliest for every support ticket, so the raw argmax of
the choices' log-likelihoods answers "billing" to all of them (20 % on five balanced labels).
Zhao et al. subtract the scores the choices get on a content-free input. The route does not
know which part of a prompt is the row's content, so it uses the closest estimate it has:
the mean score of each choice over the other requests of the same group (same messages before
the last one, same choices) that the engine has scored so far, a running mean over the
engine's life. The answer is the choice with the highest score minus that mean.

So a request's answer depends on its neighbours (the requests of its group scored before
it, and those held back with it, below): acceptable for a demo-quality model, and
`calibrate: false` turns it off (raw argmax, each request on its own).

The first requests of a group are held back until `warmup` of them have been scored, or none
of the group is left waiting or running, then answered together, each against the mean of
the others; a group of one request gets its raw argmax (there is nothing to compare with).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lowtide.core.types import Outcome, Usage
from lowtide.routes.own.local.jobs import Job
from lowtide.routes.replies import Reply, reply_body

Key = tuple  # (group tokens, choices)
MAX_KEYS = 1024  # groups remembered; past this the oldest is forgotten


@dataclass(eq=False)
class Scored:
    job: Job
    scores: np.ndarray  # summed log-probability of each choice
    cached: int  # prompt tokens taken from the shared prefix


def answer(item: Scored, calibration: np.ndarray | None) -> Outcome:
    """The outcome of a scored request: its best choice, raw or calibrated."""
    job = item.job
    adjusted = item.scores if calibration is None else item.scores - calibration
    best = int(np.argmax(adjusted))
    usage = Usage(len(job.tokens), item.cached, output_tokens=len(job.candidates[best]))
    text = job.request.choices[best]
    body = reply_body(job.request, "local", [Reply(text, output_tokens=usage.output_tokens)], usage)
    return Outcome(job.request.custom_id, True, text, usage, "choice", response=body)


def deliver(answers: list[tuple[Scored, Outcome]]) -> None:
    for item, outcome in answers:
        if not item.job.ticket.cancelled:
            item.job.ticket.deliver(outcome)


def keys(slots: list, pending: dict) -> set[Key]:
    """The keys of the choice requests still running in `slots` or waiting in `pending`."""
    out = {s.job.key for s in slots if s.job and s.job.candidates is not None}
    for queue in pending.values():
        out.update(j.key for j in queue if j.candidates is not None)
    return out


class Calibrator:
    def __init__(self, enabled: bool, warmup: int):
        self.enabled = enabled
        self.warmup = warmup
        self.sums: dict[Key, list] = {}  # key: [sum of scores, how many]
        self.held: dict[Key, list[Scored]] = {}

    def add(self, item: Scored) -> list[tuple[Scored, Outcome]]:
        """Record a scored request; the requests that can be answered now."""
        if not self.enabled:
            return [(item, answer(item, None))]
        key = item.job.key
        total = self.sums.pop(key, None) or [np.zeros_like(item.scores), 0]
        self.sums[key] = total  # re-inserted: the dict's order is least recently used first
        if len(self.sums) > MAX_KEYS:
            del self.sums[next(iter(self.sums))]
        total[0] = total[0] + item.scores
        total[1] += 1
        self.held.setdefault(key, []).append(item)
        return self.ready(key) if total[1] >= self.warmup else []

    def ready(self, key: Key) -> list[tuple[Scored, Outcome]]:
        """Answer what is held for `key`, each against the mean of the other requests."""
        held = self.held.pop(key, [])
        sums, n = self.sums.get(key) or [0, len(held)]
        out = []
        for item in held:
            if n > 1:
                out.append((item, answer(item, (sums - item.scores) / (n - 1))))
            else:
                out.append((item, answer(item, None)))
        return out

    def flush(self, busy: Callable[[], set[Key]]) -> list[tuple[Scored, Outcome]]:
        """Answer the held groups with nothing left waiting or running (not in `busy()`)."""
        if not self.held:
            return []
        keep = busy()
        out = []
        for key in [k for k in self.held if k not in keep]:
            out += self.ready(key)
        return out
