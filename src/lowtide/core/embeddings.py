"""What lowtide knows about embedding models and vectors (docs/embeddings.md).

One place for the limits a packed request must respect (inputs per request, tokens per
input and per request), the vector length of the models whose length is published, and
the two wire forms of a vector: a list of floats, or `encoding_format: base64` (the bytes
of little-endian float32 values, as OpenAI sends them).

A model that is not listed here has no known vector length (any length is taken, but
every vector of a job must have the length its `dimensions` asks for, where it asks) and
the OpenAI limits below.
"""

from __future__ import annotations

import base64
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any

# OpenAI's /v1/embeddings: at most 2,048 inputs per request, each at most 8,192 tokens, and
# at most 300,000 tokens over all inputs of one request (platform.openai.com/docs/api-reference/embeddings).
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 8192
MAX_REQUEST_TOKENS = 300_000


@dataclass(frozen=True, slots=True)
class EmbeddingModel:
    dimensions: int  # the vector length when a request sets no `dimensions`
    # Whether the model takes `dimensions` (a shorter vector), and up to what.
    takes_dimensions: bool
    max_input_tokens: int = MAX_INPUT_TOKENS


MODELS: dict[str, EmbeddingModel] = {
    "text-embedding-3-small": EmbeddingModel(1536, True),
    "text-embedding-3-large": EmbeddingModel(3072, True),
    "text-embedding-ada-002": EmbeddingModel(1536, False),
    # The local route's embedded model (routes/local_embed): 256 tokens with [CLS] and [SEP].
    "all-minilm-l6-v2": EmbeddingModel(384, False, 256),
}


def model_facts(model: str) -> EmbeddingModel | None:
    return MODELS.get(model.strip().lower().removeprefix("openai/"))


def check_dimensions(model: str, dimensions: Any) -> str | None:
    """What is wrong with `params.dimensions` for `model`, or None."""
    if dimensions is None:
        return None
    if type(dimensions) is not int or dimensions < 1:
        return f"params.dimensions must be a whole number of at least 1, got {dimensions!r}"
    facts = model_facts(model)
    if facts is None:
        return None  # the provider knows; a wrong-length answer fails its row
    if not facts.takes_dimensions:
        return f"params.dimensions: {model} does not take `dimensions` (its vectors have {facts.dimensions}); remove it, or use text-embedding-3-small/-large"
    if dimensions > facts.dimensions:
        return f"params.dimensions: {model} makes vectors of at most {facts.dimensions} numbers, not {dimensions}; ask for {facts.dimensions} or fewer"
    return None


def expected_length(body: dict[str, Any]) -> int | None:
    """The vector length a request body must get back, where it is known."""
    dims = body.get("dimensions")
    if type(dims) is int:
        return dims
    facts = model_facts(str(body.get("model", "")))
    return facts.dimensions if facts else None


def decode(embedding: Any) -> list[float]:
    """A vector as the provider sent it (a list of numbers, or base64 float32 LE) as floats.
    ValueError for anything else."""
    if isinstance(embedding, list):
        try:  # checked in C: every item a number
            array("f", embedding)
        except (TypeError, OverflowError):
            raise ValueError("the vector holds something other than numbers") from None
        return embedding
    if isinstance(embedding, str):
        raw = base64.b64decode(embedding, validate=True)
        if len(raw) % 4:
            raise ValueError(f"base64 vector of {len(raw)} bytes is not a whole number of float32 values")
        values = array("f", raw)
        if sys.byteorder != "little":
            values.byteswap()
        return values.tolist()
    raise ValueError(f"a vector is a list of numbers or base64 text, not {type(embedding).__name__}")


def encode_base64(vector: list[float]) -> str:
    """`encoding_format: base64`: little-endian float32 bytes, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def vector_of(response: Any) -> list[float] | None:
    """A stored embedding answer's vector (its first item): None where there is none."""
    if not isinstance(response, dict):
        return None
    data = response.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    try:
        return decode(data[0].get("embedding"))
    except ValueError:
        return None


def inputs_of(body: dict[str, Any]) -> list[Any]:
    """A body's `input` as a list of inputs (text, or token arrays)."""
    given = body.get("input")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list) and given and all(isinstance(t, int) for t in given):
        return [given]  # one input as token ids
    return list(given) if isinstance(given, list) else []


ECHO_DIMENSIONS = 16  # echo's vector length for a model with none known and no `dimensions`


def echo_vector(given: Any, dimensions: int) -> list[float]:
    """`echo`'s vector for one input: a deterministic unit vector. The input's UTF-8 bytes
    (a token array: its JSON text) are hashed with BLAKE2b-512, salted with the block number
    (16 bytes, little-endian) for each further 32 numbers; each little-endian uint16 `u` of
    the digests gives `u / 32768 - 1`; the first `dimensions` of them, divided by their norm."""
    import hashlib
    import math

    data = given.encode("utf-8", "surrogatepass") if isinstance(given, str) else repr(given).encode()
    out: list[float] = []
    block = 0
    while len(out) < dimensions:
        digest = hashlib.blake2b(data, digest_size=64, salt=block.to_bytes(16, "little")).digest()
        out.extend(u / 32768.0 - 1.0 for u in struct.unpack("<32H", digest))
        block += 1
    del out[dimensions:]
    norm = math.sqrt(sum(x * x for x in out)) or 1.0
    return [x / norm for x in out]
