"""The local route on `/v1/embeddings`: the embedded all-MiniLM-L6-v2 (`routes/local_embed`),
no key and no network. A body either runs as it is or is refused by name before anything
runs (DESIGN invariant 8):

| key | what the route does |
|---|---|
| `input` | a text or a list of texts (token ids are another tokenizer's: refused) |
| `model` | the embedding model's name (`all-MiniLM-L6-v2`, or any name with `embedding_model_path`) |
| `dimensions` | only the model's own length (384): the model cannot shorten its vectors |
| `encoding_format` | `float`, or `base64` (little-endian float32, as OpenAI sends it) |

Anything else (`user`, say) is refused. An input over the model's 256 tokens ([CLS] and
[SEP] included) is refused at load, naming its count, unless the job says `truncate: true`:
then the loader cuts it with this model's own tokenizer (`token_counter`). Usage is the
tokens the model ran, specials included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lowtide.core.embeddings import encode_base64
from lowtide.core.endpoints import EMBEDDINGS
from lowtide.core.tokens import TokenCounter
from lowtide.core.types import Outcome, Refusal, Request, Usage

KEYS = frozenset({"input", "model", "dimensions", "encoding_format"})


class LocalEmbeddings:
    """The embedded embedding model behind the local route, loaded on first use."""

    def __init__(self, model_path: Path | None, threads: int):
        self.model_path = model_path
        self.threads = threads

    @property
    def default_name(self) -> str:
        from lowtide.routes.own.local_embed import DEFAULT_MODEL

        return DEFAULT_MODEL

    def takes(self, model: str) -> bool:
        """Whether `model` names this embedding model (any name, with a model folder of one's own)."""
        return self.model_path is not None or model.strip().lower() == self.default_name.lower()

    def model(self) -> Any:
        from lowtide.routes.own.local_embed import embedder

        return embedder(self.model_path, self.threads)

    def token_counter(self) -> TokenCounter:
        model = self.model()
        return TokenCounter(f"{model.model_name} tokenizer (exact, [CLS] and [SEP] included)", True, model.count_tokens)

    def refusal(self, request: Request) -> Refusal | None:
        body = request.body
        for key in body:
            if key not in KEYS:
                return Refusal(key, f"not honoured by the local route's embedding model (it takes {', '.join(sorted(KEYS))})")
        if not self.takes(request.model):
            return Refusal("model", f"the local route embeds with {self.default_name}, not {request.model!r}; set "
                                    f"model: {self.default_name}, or route_options.embedding_model_path to a model folder")  # fmt: skip
        inputs = _inputs(body.get("input"))
        if isinstance(inputs, Refusal):
            return inputs
        model = self.model()
        dims = body.get("dimensions")
        if dims is not None and dims != model.dimensions:
            return Refusal("dimensions", f"{model.model_name} makes vectors of {model.dimensions} numbers only; remove "
                                         f"`dimensions` or set it to {model.dimensions}")  # fmt: skip
        if body.get("encoding_format") not in (None, "float", "base64"):
            return Refusal("encoding_format", "must be float or base64")
        for i, text in enumerate(inputs):
            tokens = model.count_tokens(text)
            if tokens > model.max_tokens:
                where = "input" if isinstance(body["input"], str) else f"input[{i}]"
                return Refusal(where, f"is {tokens} tokens; {model.model_name} takes at most {model.max_tokens} "
                                      "([CLS] and [SEP] included): shorten it, or set `truncate: true` in the spec")  # fmt: skip
        return None

    def outcomes(self, requests: list[Request]) -> list[Outcome]:
        """Every request's vectors, all inputs in one call (the model batches them by length)."""
        out: list[Outcome | None] = [None] * len(requests)
        texts: list[str] = []
        spans: list[tuple[int, int, int]] = []  # (request, first input, number of inputs)
        for k, request in enumerate(requests):
            refused = self.refusal(request)
            if refused is not None:  # the loader refuses these first; a body from elsewhere, here
                out[k] = Outcome.failure(request.custom_id, "invalid_request", refused.message("local"), False)
                continue
            inputs = _inputs(request.body["input"])
            spans.append((k, len(texts), len(inputs)))
            texts += inputs
        model = self.model()
        vectors = model.embed_array(texts) if texts else None
        for k, first, n in spans:
            request = requests[k]
            base64 = request.body.get("encoding_format") == "base64"
            data = []
            tokens = 0
            for i in range(n):
                vector = vectors[first + i].tolist()
                data.append({"object": "embedding", "index": i, "embedding": encode_base64(vector) if base64 else vector})
                tokens += model.count_tokens(texts[first + i])
            response = {"object": "list", "data": data, "model": request.model,
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip
            out[k] = Outcome(request.custom_id, True, usage=Usage(input_tokens=tokens), response=response)
        return [o for o in out if o is not None]


def _inputs(given: Any) -> list[str] | Refusal:
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not given:
        return Refusal("input", "must be a text or a non-empty list of texts")
    for i, text in enumerate(given):
        if not isinstance(text, str):
            return Refusal(f"input[{i}]", "must be text (token ids belong to another tokenizer)")
        if not text.strip():
            return Refusal(f"input[{i}]" if len(given) > 1 else "input", "is empty or only whitespace; an embedding needs text")
    return given


def is_embedding(request: Request) -> bool:
    return request.endpoint == EMBEDDINGS
