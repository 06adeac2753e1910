"""A source's chunks are bounded by the text they hold, not only by their row count: 5,000
rows of 40 kB prompts would otherwise be 200 MB held at once, twice (values and payloads)."""

from __future__ import annotations

import json

from lowtide.core.sources import CHUNK_CHARS, open_file


def test_big_rows_come_in_chunks_of_bounded_text(tmp_path):
    path = tmp_path / "big.jsonl"
    row_chars = 2**20  # 1 MB of prompt a row, nested in a body as JSONL bodies are
    with path.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"id": f"r{i}", "body": {"messages": [{"role": "user", "content": "x" * row_chars}]}}) + "\n")
    chunks = list(open_file(path, None).chunks())
    assert sum(len(c) for c in chunks) == 40
    assert max(len(c) for c in chunks) <= CHUNK_CHARS // row_chars + 1, [len(c) for c in chunks]
