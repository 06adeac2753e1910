"""The embedder: WordPiece tokens through an ONNX encoder on ONNX Runtime's CPU provider,
pooled and L2-normalised as the model card says (sentence-transformers' Pooling + Normalize).

Batching is what makes it fast on a small CPU: inputs are sorted by token count and cut into
mini-batches, each padded only to its own longest input, so a thousand short documents cost
a few dozen large matrix products instead of a thousand small ones, and almost no padding.
Padding is masked out of attention and pooling, so a vector does not depend on its batch
(equal to the one-at-a-time vector to float32 rounding, about 1e-7).

The mini-batches of one call run side by side, one per core (`lanes`): a core is busiest on
a whole mini-batch of its own, while one small product split across every core spends much of
its time waiting for the slowest part (on 2 cores: 284-315 documents/s one mini-batch at a
time on both, 347-363 side by side). A call of one mini-batch (a single input) runs on one
core: on 2 cores, one input at a time, 117-119 documents/s against 115-154 on both.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lowtide.core.errors import InputError, RouteError
from lowtide.routes.own.local_embed.files import ModelFiles


class EmbedInputError(InputError):
    """Inputs the model cannot embed as they are (empty, or over its token limit).

    `problems` has one line per input; `indexes` the positions (in the list given to
    `embed`) of those inputs, so a caller can map them back to its rows.
    """

    def __init__(self, message: str, problems: list[str], indexes: list[int]):
        super().__init__(message, problems)
        self.indexes = indexes


def _usable_cpus() -> int:
    # The CPUs this process may run on (a container's share), not the host's count.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Embedder:
    """One loaded model. Thread-safe: ONNX Runtime sessions and tokenizers may be shared."""

    def __init__(
        self,
        files: ModelFiles,
        threads: int | None = None,
        batch_size: int = 16,
        batch_tokens: int = 1024,
        lanes: int | None = None,
    ):
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise RouteError(
                f"the embedded embedding model needs onnxruntime and tokenizers ({exc}); "
                "install them with `pip install 'lowtide[embed]'`"
            ) from exc
        self.model_name = files.name
        self.max_tokens = files.max_tokens
        self.pooling = files.pooling
        self.threads = threads or _usable_cpus()
        self.batch_size = batch_size
        # Mini-batches run `lanes` at a time, each on threads // lanes cores. Callers share the
        # lanes, so a process never has more runs in flight however many threads call `embed`.
        self.lanes = max(1, min(lanes or self.threads, self.threads))
        self._lanes: ThreadPoolExecutor | None = None
        self._lanes_lock = threading.Lock()
        # Padded tokens per mini-batch. Small batches keep each layer's activations in the
        # CPU caches: on 2 cores in 2 lanes, 8-24 documents of ~36 tokens cost 5.2-5.5 ms of
        # CPU per document, 4 cost 5.7 and 32 cost 5.75 (bench/embed_local.py). A single
        # input over the budget still goes, alone.
        self.batch_tokens = max(batch_tokens, files.max_tokens)

        try:
            # Two copies: one counts whole inputs, one cuts them to the limit. The file's own
            # padding and truncation (training-time settings) are switched off in both.
            self._counter = Tokenizer.from_file(str(files.tokenizer))
            self._counter.no_padding()
            self._counter.no_truncation()
            self._cutter = Tokenizer.from_file(str(files.tokenizer))
            self._cutter.no_padding()
            self._cutter.enable_truncation(max_length=files.max_tokens)
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise RouteError(f"cannot load the tokenizer {files.tokenizer}: {exc}") from exc

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads // self.lanes
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # warnings about unused initialisers are noise here
        # Idle threads sleep instead of spinning: on a shared 2-core machine a spinning pool
        # doubled the CPU time per document (8.6 -> 18.4 ms at batch 1) for no gain.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Every mini-batch has its own shape: the arena and memory patterns, made for one
        # fixed shape, would only keep the largest batch's buffers for the process's life.
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        try:
            self._session = ort.InferenceSession(
                str(files.onnx),
                sess_options=options,
                providers=["CPUExecutionProvider"],
                # ORT's fused residual + LayerNorm kernel is slower here than the two ops it
                # replaces: 5.5 -> 4.9 ms of CPU per document batched, 8.1 -> 7.7 one at a time
                # (1 thread); vectors equal to 2e-7.
                disabled_optimizers=["SkipLayerNormFusion"],
            )
        except Exception as exc:  # ORT's own exception types are not importable stably
            raise RouteError(f"cannot load the embedding model {files.onnx}: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._inputs
        if missing:
            raise RouteError(
                f"{files.onnx} does not take {', '.join(sorted(missing))}; the embedded model "
                "runs BERT-style encoders (input_ids, attention_mask, token_type_ids)"
            )
        self.dimensions = int(self._run([[0]])[0].shape[-1])

    def count_tokens(self, text: str) -> int:
        """Tokens the model sees for `text`, [CLS] and [SEP] included (the limit counts them)."""
        return len(self._counter.encode(text).ids)

    def embed(self, texts: Sequence[str], truncate: bool = False) -> list[list[float]]:
        """One L2-normalised vector (float32 values) per text, in the order given."""
        return self.embed_array(texts, truncate).tolist()

    def embed_array(self, texts: Sequence[str], truncate: bool = False) -> np.ndarray:
        """`embed` as a float32 array of shape (len(texts), dimensions), without the lists.

        An empty or whitespace-only text is refused, and so is a text over `max_tokens`
        unless `truncate` is set (then it is cut to its first `max_tokens` tokens): all
        such texts are named in one `EmbedInputError`, and nothing is embedded.
        """
        texts = list(texts)
        strays = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if strays:
            raise TypeError(f"embed takes strings; inputs {strays[:10]} are not")
        encodings = self._cutter.encode_batch(texts)
        self._refuse(texts, [i for i, e in enumerate(encodings) if e.overflowing and not truncate])
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)

        def run(batch: list[int]) -> None:
            out[batch] = self._run([encodings[i].ids for i in batch])

        batches = self._mini_batches([len(e.ids) for e in encodings])
        if len(batches) > 1 and self.lanes > 1:
            # ONNX Runtime lets go of the GIL while it runs; each lane writes its own rows.
            for _ in self._lane_pool().map(run, batches):
                pass
        else:
            for batch in batches:
                run(batch)
        return out

    def _lane_pool(self) -> ThreadPoolExecutor:
        with self._lanes_lock:
            if self._lanes is None:
                self._lanes = ThreadPoolExecutor(self.lanes, thread_name_prefix="lowtide-embed")
            return self._lanes

    def _mini_batches(self, lengths: list[int]) -> list[list[int]]:
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            # Sorted ascending, so this input is the longest so far: it sets the padding.
            if current and (
                len(current) == self.batch_size
                or (len(current) + 1) * lengths[i] > self.batch_tokens
            ):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def _run(self, ids: list[list[int]]) -> np.ndarray:
        width = max(len(row) for row in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for row, tokens in enumerate(ids):
            input_ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(input_ids)
        hidden = self._session.run(None, feeds)[0]
        if hidden.ndim == 3:  # token states: pool them (an export may pool by itself)
            hidden = self._pool(hidden, mask)
        norms = np.linalg.norm(hidden, axis=1, keepdims=True)
        return (hidden / np.maximum(norms, 1e-12)).astype(np.float32)

    def _pool(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.pooling == "cls":
            return hidden[:, 0, :]
        weights = mask[..., None].astype(np.float32)
        # Padded positions are zeroed, not multiplied: x * 0 is NaN when x is inf.
        summed = np.where(weights > 0, hidden, 0.0).sum(axis=1)
        return summed / np.maximum(weights.sum(axis=1), 1.0)

    def _refuse(self, texts: list[str], too_long: list[int]) -> None:
        """One error for every input that cannot be embedded as it is, in input order."""
        problems: dict[int, str] = {
            i: f"input {i}: empty; give it some text or leave it out"
            for i, text in enumerate(texts)
            if not text.strip()
        }
        for i in too_long:
            problems[i] = (
                f"input {i}: {self.count_tokens(texts[i])} tokens, over {self.model_name}'s "
                f"limit of {self.max_tokens}; shorten it or embed with truncate=True"
            )
        if problems:
            bad = sorted(problems)
            lines = [problems[i] for i in bad]
            summary = InputError.from_problems(f"{self.model_name} cannot embed", lines)
            raise EmbedInputError(str(summary), lines, bad)
