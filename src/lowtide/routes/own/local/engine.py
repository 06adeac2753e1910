"""A small continuous-batching engine over one llama.cpp context.

One worker thread owns the context. Each iteration of its loop is one `llama_decode` over
every live slot: one new token per generating slot, the tokens of the next choices of a
scoring slot, and a chunk of the prompt of a slot that is prefilling. A request takes a
slot as soon as one frees (iteration-level scheduling), so slots stay full.

The KV cache is unified, so sequences can share cells:

- sequence 0 holds the current shared prefix, decoded once; a slot copies the part its
  prompt starts with (`llama_memory_seq_cp` only tags cells) and decodes the rest;
- sequences 1..slots are the slots;
- the rest are scratch sequences on which a slot scores several choices in one step.

Waiting requests are grouped by the messages before their last one (system prompt, example
turns), and a group runs until none of it waits (or, while other groups wait, for 8 x slots
requests) before the next starts. When a group starts, the shared prefix becomes the
longest token prefix its waiting prompts have in common: the system prompt, and also
whatever fixed text the user template puts before each row.

A request is admitted only when the cells it may hold (its prompt past the shared part plus
its output budget, or its choices) fit beside those already held, so a decode never runs
out of cells.

Sampling is done here, from the logits: a JSON grammar (llama.cpp's grammar sampler, made
when the job takes a slot) first masks every token that cannot continue a valid answer;
then greedy, or temperature with `top_p` (nucleus) from the job's own generator. Logprobs are
the model's own distribution at each step (log-softmax of the raw logits, before the grammar
and the temperature), as OpenAI reports them.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque
from dataclasses import dataclass, field

import llama_cpp as llm
import numpy as np

from lowtide.core.types import Outcome, Request, Usage
from lowtide.routes.own.local.calibrate import Calibrator, Scored, deliver, keys
from lowtide.routes.own.local.jobs import Job, Ticket, answered, failed, finished, prepare
from lowtide.routes.own.local.model import Model
from lowtide.routes.replies import Reply

PREFIX_SEQ = 0
# llama_token_data as numpy sees it, so a grammar masks the logits of all tokens in one call.
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


@dataclass(eq=False)
class Slot:
    seq: int
    job: Job | None = None
    pos: int = 0  # next position in the sequence
    todo: list[int] = field(default_factory=list)  # prompt tokens still to decode
    shared: int = 0  # prompt tokens copied from the shared prefix
    gen: int = 0  # which shared prefix they came from (0: none)
    cached: int = 0  # of those, how many were not decoded for this request
    out: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    waiting: deque[int] = field(default_factory=deque)  # choices still to score
    # After a decode: (batch index of logits, what it is for). Kinds: "next" (sample or start
    # scoring) and ("cand", i, seq, first index) for a choice fed this step.
    reads: list[tuple] = field(default_factory=list)


class Engine:
    def __init__(self, model: Model, slots: int, n_ctx: int, threads: int, seed: int,
                 calibrate: bool = True, n_batch: int = 512):  # fmt: skip
        self.model = model
        self.n_ctx = n_ctx
        self.seed = seed
        self.n_batch = n_batch
        self.window = min(n_ctx, model.n_ctx_train)
        self.slots = [Slot(seq=i + 1) for i in range(slots)]
        self.scratch = list(range(slots + 1, 2 * slots + 1))
        self.calibrator = Calibrator(calibrate, warmup=slots)
        params = llm.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = 2 * slots + 1
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = True
        params.no_perf = True
        self.ctx = llm.llama_init_from_model(model.ptr, params)
        if not self.ctx:
            raise MemoryError(f"llama.cpp could not create a {n_ctx}-token context")
        self.mem = llm.llama_get_memory(self.ctx)
        self.batch = llm.llama_batch_init(n_batch, 0, 1)
        self.candidates = np.zeros(model.n_vocab, dtype=TOKEN_DATA)  # for grammars
        self.candidates["id"] = np.arange(model.n_vocab)
        self.n = 0  # tokens in the batch being built
        self.pending: dict[tuple[int, ...], deque[Job]] = {}  # by group
        self.group: tuple[int, ...] = ()  # the group PREFIX_SEQ was filled for
        self.prefix: list[int] = []  # what PREFIX_SEQ holds
        self.gen = 0  # its generation: every prefix ever held gets a new number
        self.gens: dict[int, list[int]] = {}  # live generations: [cells, holders]
        self.gens_made = 0
        self.streak = 0  # requests admitted since the group last changed
        self.inbox: list[tuple[list[Request], Ticket]] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.why = "the local route was closed"
        self.purge = False
        self.thread = threading.Thread(target=self._run, name="lowtide-local", daemon=True)
        self.thread.start()

    # --- the thread-safe surface -------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self.stopping

    def submit(self, requests: list[Request], ticket: Ticket) -> None:
        with self.cond:
            if not self.stopping:
                self.inbox.append((requests, ticket))
                self.cond.notify()
                return
        for r in requests:  # the loop has stopped: answer at once rather than never
            ticket.deliver(Outcome.failure(r.custom_id, "engine_error", self.why, True))

    def cancel(self, ticket: Ticket) -> None:
        """Drop what is left of `ticket`: its queued requests, and its slots at the next step."""
        with self.cond:
            ticket.cancelled = True
            self.purge = True
            self.cond.notify()

    def close(self) -> None:
        """Stop the loop, fail what is still queued, and free the context and the batch."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join()

    # --- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    while not (self.inbox or self.stopping or self._busy()):
                        self.cond.wait()
                    if self.stopping:
                        break
                    inbox, self.inbox = self.inbox, []
                for requests, ticket in inbox:
                    self._intake(requests, ticket)
                self._step()
        except Exception as exc:  # a bug or a fatal llama.cpp error: fail everything held
            with self.cond:
                self.stopping = True
                self.why = f"the local engine stopped: {exc!r}"
        finally:
            self._fail_all("engine_error", self.why, retryable=True)
            llm.llama_batch_free(self.batch)
            llm.llama_free(self.ctx)

    def _busy(self) -> bool:
        return bool(self.pending) or any(s.job for s in self.slots)

    def _intake(self, requests: list[Request], ticket: Ticket) -> None:
        for request in requests:
            try:
                job = prepare(
                    self.model, request, ticket, self.window, self.seed, self.n_batch // 2
                )
            except Exception as exc:  # one bad request must not stop the others
                job = Outcome.failure(request.custom_id, "invalid_request", repr(exc), False)
            if isinstance(job, Outcome):
                ticket.deliver(job)
            elif job[0].candidates is None and job[0].budget == 0:
                usage = Usage(input_tokens=len(job[0].tokens))
                ticket.deliver(answered(request, [Reply("", "length")] * len(job), usage))
            else:
                self.pending.setdefault(job[0].group, deque()).extend(job)

    def _step(self) -> None:
        self._decode_step()
        deliver(self.calibrator.flush(lambda: keys(self.slots, self.pending)))

    def _decode_step(self) -> None:
        if self.purge:
            self.purge = False
            for key, queue in list(self.pending.items()):
                kept = deque(j for j in queue if not j.ticket.cancelled)
                if kept:
                    self.pending[key] = kept
                else:
                    del self.pending[key]
        for slot in self.slots:
            if slot.job and slot.job.ticket.cancelled:
                self._release(slot)
        self._admit()
        self.n = 0
        for slot in self.slots:
            slot.reads = []
        for slot in self.slots:  # one token for each generating slot
            if slot.job and not slot.todo and slot.out and not slot.waiting:
                slot.reads.append((self._add(slot.out[-1], slot.pos, slot.seq, True), "next"))
                slot.pos += 1
        for slot in self.slots:  # then choices, then prompt chunks, while room is left
            if slot.job and slot.waiting:
                self._feed_choices(slot)
        for slot in self.slots:
            if slot.job and slot.todo and self.n < self.n_batch:
                chunk = slot.todo[: self.n_batch - self.n]
                del slot.todo[: len(chunk)]
                for i, token in enumerate(chunk):
                    last = not slot.todo and i == len(chunk) - 1
                    index = self._add(token, slot.pos, slot.seq, last)
                    slot.pos += 1
                if not slot.todo:
                    slot.reads.append((index, "next"))
        if self.n == 0:
            return
        self.batch.n_tokens = self.n
        rc = llm.llama_decode(self.ctx, self.batch)
        if rc != 0:
            # 1: no room in the KV cache (admission should prevent it); others are errors.
            # The slots' positions no longer match their cells, so every live slot fails.
            for slot in self.slots:
                if slot.job:
                    cid = slot.job.request.custom_id
                    message = f"llama_decode returned {rc}"
                    self._finish(slot, failed(slot.job, Outcome.failure(cid, "engine_error", message, True)))
            return
        for slot in self.slots:
            if slot.job and slot.reads:
                self._read(slot)

    # --- scheduling ----------------------------------------------------------------------

    def _held(self) -> int:
        cells = sum(n for n, _ in self.gens.values())
        return cells + sum(s.job.need(s.shared) for s in self.slots if s.job)

    def _admit(self) -> None:
        for slot in self.slots:
            if slot.job:
                continue
            if not self.pending:
                return
            key = self.group if self.group in self.pending else next(iter(self.pending))
            if key == self.group and len(self.pending) > 1 and self.streak >= 8 * len(self.slots):
                key = next(k for k in self.pending if k != self.group)  # let others have a turn
            job = self.pending[key][0]
            prefix, shared = self.prefix, 0
            if key:
                if key != self.group:  # a new group: share what its prompts have in common
                    prefix = os.path.commonprefix([j.tokens for j in self.pending[key]])
                shared = min(len(os.path.commonprefix([prefix, job.tokens])), len(job.tokens) - 1)
            extra = job.need(shared) + (len(prefix) if prefix is not self.prefix else 0)
            if self._held() + extra > self.n_ctx:
                if any(s.job for s in self.slots):
                    return  # wait for cells to free
                self._set_prefix((), [])  # alone and still no room: run it without sharing
                key, prefix, shared = (), self.prefix, 0
            queue = self.pending[job.group]
            queue.popleft()
            if not queue:
                del self.pending[job.group]
            self._start(slot, job, key, prefix, shared)
            self.streak += 1

    def _start(self, slot: Slot, job: Job, key: tuple, prefix: list[int], shared: int) -> None:
        slot.cached = shared
        if prefix is not self.prefix:
            self._set_prefix(key, prefix)
            slot.cached = 0
        if shared:
            llm.llama_memory_seq_cp(self.mem, PREFIX_SEQ, slot.seq, 0, shared)
            slot.gen = self.gen
            self.gens[self.gen][1] += 1
        slot.job, slot.shared, slot.pos, slot.todo = job, shared, shared, job.tokens[shared:]
        if job.gbnf is not None:
            job.grammar = llm.llama_sampler_init_grammar(self.model.vocab, job.gbnf.encode(), b"root")
        slot.out, slot.scores, slot.reads, slot.waiting = [], [], [], deque()

    def _set_prefix(self, key: tuple[int, ...], tokens: list[int]) -> None:
        """Make PREFIX_SEQ hold `tokens`: copied from a slot that has them, else decoded."""
        if self.gen:
            llm.llama_memory_seq_rm(self.mem, PREFIX_SEQ, -1, -1)
            self._unref(self.gen)
        self.group, self.prefix, self.gen, self.streak = key, tokens, 0, 0
        if not tokens:
            return
        self.gens_made += 1
        self.gen = self.gens_made
        self.gens[self.gen] = [len(tokens), 1]
        n = len(tokens)
        donor = next(
            (s for s in self.slots if s.job and s.pos >= n and s.job.tokens[:n] == tokens), None
        )
        if donor is not None:
            llm.llama_memory_seq_cp(self.mem, donor.seq, PREFIX_SEQ, 0, n)
            return
        for start in range(0, n, self.n_batch):
            self.n = 0
            for pos in range(start, min(start + self.n_batch, n)):
                self._add(tokens[pos], pos, PREFIX_SEQ, False)
            self.batch.n_tokens = self.n
            rc = llm.llama_decode(self.ctx, self.batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} on a shared prefix")

    def _unref(self, gen: int) -> None:
        self.gens[gen][1] -= 1
        if self.gens[gen][1] == 0:
            del self.gens[gen]

    def _add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        i, b = self.n, self.batch
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq
        self.n += 1
        return i

    # --- reading results -------------------------------------------------------------------

    def _logits(self, index: int) -> np.ndarray:
        ptr = llm.llama_get_logits_ith(self.ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def _logprobs(self, index: int) -> np.ndarray:
        x = self._logits(index).astype(np.float64)
        x -= x.max()
        return x - np.log(np.exp(x).sum())

    def _read(self, slot: Slot) -> None:
        job = slot.job
        assert job is not None
        reads, slot.reads = slot.reads, []
        for index, what in reads:
            if what == "next" and job.candidates is not None:
                first = self._logprobs(index)
                slot.scores = [float(first[c[0]]) for c in job.candidates]
                slot.waiting = deque(i for i, c in enumerate(job.candidates) if len(c) > 1)
            elif what == "next":
                self._sample(slot, index)
            else:
                _, i, seq, start = what
                tokens = job.candidates[i]
                for k in range(1, len(tokens)):
                    slot.scores[i] += float(self._logprobs(start + k - 1)[tokens[k]])
                if seq == slot.seq:
                    llm.llama_memory_seq_rm(self.mem, seq, slot.pos, -1)
                else:
                    llm.llama_memory_seq_rm(self.mem, seq, -1, -1)
                    self.scratch.append(seq)
        if slot.job and job.candidates is not None and not slot.waiting and slot.scores:
            scored = Scored(job, np.array(slot.scores), slot.cached)
            self._release(slot)
            deliver(self.calibrator.add(scored))

    def _feed_choices(self, slot: Slot) -> None:
        """Put the next choices of `slot` in the batch: one on its own sequence, the others
        on copies of it (scratch sequences), as many as there is room for."""
        own = True
        while slot.waiting:
            i = slot.waiting[0]
            tokens = slot.job.candidates[i][:-1]
            if self.n + len(tokens) > self.n_batch or not (own or self.scratch):
                return
            seq = slot.seq if own else self.scratch.pop()
            if not own:
                llm.llama_memory_seq_cp(self.mem, slot.seq, seq, -1, -1)
            own = False
            slot.waiting.popleft()
            start = self.n
            for k, token in enumerate(tokens):
                self._add(token, slot.pos + k, seq, True)
            slot.reads.append((start, ("cand", i, seq, start)))

    def _sample(self, slot: Slot, index: int) -> None:
        job = slot.job
        raw = logits = self._logits(index)
        if job.gbnf is not None:
            if not job.grammar:
                message = "llama.cpp could not build the grammar of the request's JSON Schema"
                failure = Outcome.failure(job.request.custom_id, "invalid_request", message, False)
                self._finish(slot, failed(job, failure))
                return
            logits = self._constrain(job.grammar, logits)
        if job.rng is None:
            token = int(np.argmax(logits))
        else:
            x = logits.astype(np.float64) / job.temperature
            p = np.exp(x - x.max())
            p /= p.sum()
            if job.top_p < 1.0:
                p = _nucleus(p, job.top_p)
            token = int(job.rng.choice(len(p), p=p))
        eog = self.model.is_eog(token)
        if not eog:
            slot.out.append(token)
            if job.grammar:
                llm.llama_sampler_accept(job.grammar, token)
            if job.logprobs is not None:
                job.entries.append(self._entry(raw, token, job.logprobs))
        reply = job.ending(self.model, slot.out, eog)
        if reply is not None:
            usage = Usage(len(job.tokens), slot.cached, output_tokens=len(slot.out))
            self._finish(slot, finished(job, reply, usage))

    def _constrain(self, grammar, logits: np.ndarray) -> np.ndarray:
        """`logits` with every token the grammar does not allow next at -inf."""
        cands = self.candidates
        cands["logit"] = logits
        array = llm.llama_token_data_array(
            data=cands.ctypes.data_as(llm.llama_token_data_p), size=len(cands), selected=-1, sorted=False
        )
        llm.llama_sampler_apply(grammar, ctypes.byref(array))
        return cands["logit"].copy()

    def _entry(self, raw: np.ndarray, token: int, top: int) -> dict:
        """One `logprobs.content` entry: the token, its log-probability and the top ones."""
        x = raw.astype(np.float64)
        x -= x.max()
        lp = x - np.log(np.exp(x).sum())

        def one(t: int) -> dict:
            piece = self.model.piece(t)
            return {"token": piece.decode("utf-8", "replace"), "logprob": float(lp[t]), "bytes": list(piece)}

        entry = one(token)
        best = np.argpartition(-lp, top)[:top] if top else []
        entry["top_logprobs"] = [one(int(t)) for t in sorted(best, key=lambda t: -lp[t])]
        return entry

    # --- ending ------------------------------------------------------------------------------

    def _finish(self, slot: Slot, outcome: Outcome | None) -> None:
        ticket = slot.job.ticket
        self._release(slot)
        if outcome is not None and not ticket.cancelled:
            ticket.deliver(outcome)

    def _release(self, slot: Slot) -> None:
        for _, what in slot.reads:
            if what != "next" and what[2] != slot.seq:
                llm.llama_memory_seq_rm(self.mem, what[2], -1, -1)
                self.scratch.append(what[2])
        llm.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
        if slot.job is not None and slot.job.grammar:
            llm.llama_sampler_free(slot.job.grammar)
            slot.job.grammar = None
        if slot.gen:
            self._unref(slot.gen)
        slot.gen, slot.shared = 0, 0
        slot.job, slot.todo, slot.reads, slot.waiting = None, [], [], deque()

    def _fail_all(self, code: str, message: str, retryable: bool) -> None:
        deliver(self.calibrator.flush(set))  # scored already: answer them
        for slot in self.slots:
            if slot.job:
                job = slot.job
                self._release(slot)
                outcome = failed(job, Outcome.failure(job.request.custom_id, code, message, retryable))
                if outcome is not None:
                    job.ticket.deliver(outcome)
        pending, self.pending = self.pending, {}
        for queue in pending.values():
            for job in queue:
                outcome = failed(job, Outcome.failure(job.request.custom_id, code, message, retryable))
                if outcome is not None:
                    job.ticket.deliver(outcome)
        with self.cond:
            inbox, self.inbox = self.inbox, []
        for requests, ticket in inbox:
            for r in requests:
                ticket.deliver(Outcome.failure(r.custom_id, code, message, retryable))


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """`p` cut to its smallest most-likely set whose mass reaches `top_p`, renormalised."""
    order = np.argsort(-p)
    mass = np.cumsum(p[order])
    keep = order[: int(np.searchsorted(mass, top_p)) + 1]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()
