"""Shared pieces of the embedding tests: the documented echo vector, recomputed here from
its definition (docs/embeddings.md) rather than imported, and small sources."""

from __future__ import annotations

import hashlib
import math
import struct
from pathlib import Path

from tests.conftest import write_csv


def echo_reference(text: str, n: int) -> list[float]:
    values: list[float] = []
    block = 0
    while len(values) < n:
        digest = hashlib.blake2b(text.encode(), digest_size=64, salt=block.to_bytes(16, "little")).digest()
        values += [u / 32768 - 1 for u in struct.unpack("<32H", digest)]
        block += 1
    values = values[:n]
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def docs(n: int, start: int = 1) -> list[dict]:
    return [{"doc_id": f"doc-{i}", "text": f"document number {i} about topic {i % 7}"} for i in range(start, start + n)]


def docs_csv(path: Path, n: int, start: int = 1) -> Path:
    return write_csv(path, docs(n, start))


def embed_spec(source: Path, **overrides) -> dict:
    data = {
        "name": "vectors",
        "source": {"path": str(source), "id_column": "doc_id"},
        "template": {"user": "{{ text }}"},
        "model": "text-embedding-3-small",
        "endpoint": "embeddings",
        "route": "echo",
        "params": {"dimensions": 8},
        "retry": {"max_attempts": 2, "backoff_seconds": 1},
    }
    data.update(overrides)
    return data
