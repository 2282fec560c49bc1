"""Embedder against sentence-transformers' golden vectors and token ids, plus its contract.

The golden files (tests/data/golden) come from sentence-transformers 6.2.0 on torch CPU:
20 texts with their all-MiniLM-L6-v2 embeddings, and 20 others with their token ids and
embeddings (max_seq_length 256, mean pooling, normalised). The models are built once per
pytest session into $CLAG_FAST_CACHE when it is set (CI can keep it), else into a pytest temp
dir (~5 s fp32 + ~4 s int8 on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"


def _golden(name: str) -> dict:
    path = GOLDEN / name
    if not path.is_file():
        pytest.fail(f"golden file {path} is missing (tests/data/golden: minilm_golden.json, "
                    "minilm_tokens_golden.json)")
    return json.loads(path.read_text("utf-8"))


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    """Point CLAG_FAST_CACHE at a session dir unless the caller already chose one."""
    old = os.environ.get("CLAG_FAST_CACHE")
    if old is None:
        os.environ["CLAG_FAST_CACHE"] = str(tmp_path_factory.mktemp("clag_fast_cache"))
    yield Path(os.environ["CLAG_FAST_CACHE"])
    if old is None:
        os.environ.pop("CLAG_FAST_CACHE", None)


@pytest.fixture(scope="session")
def emb(model_cache):
    from clag_fast.embed.embedder import Embedder

    return Embedder(precision="fp32", threads=2)


@pytest.fixture(scope="session")
def emb8(model_cache):
    from clag_fast.embed.embedder import Embedder

    return Embedder(precision="int8", threads=2)


@pytest.fixture(scope="session")
def golden_items():
    items = _golden("minilm_golden.json")["items"] + _golden("minilm_tokens_golden.json")["items"]
    assert len(items) == 40
    return items


def _cosines(vecs: np.ndarray, items) -> np.ndarray:
    ref = np.array([it["embedding"] for it in items], dtype=np.float64)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    return (vecs.astype(np.float64) * ref).sum(axis=1)


def test_token_ids_identical_to_sentence_transformers(emb):
    items = _golden("minilm_tokens_golden.json")["items"]
    ids = emb.tokenize([it["text"] for it in items])
    for it, got in zip(items, ids):
        assert got == it["input_ids"], f"token ids differ for {it['text'][:60]!r}"


def test_truncation_flag_matches_untruncated_length(emb):
    items = _golden("minilm_tokens_golden.json")["items"]
    _, trunc = emb.encode([it["text"] for it in items], return_truncated=True)
    expected = np.array([it["n_tokens_untruncated"] > 256 for it in items])
    assert expected.any(), "the golden set should contain at least one long text"
    np.testing.assert_array_equal(trunc, expected)


@pytest.mark.parametrize("batch_size", [1, 32])
def test_fp32_matches_golden_every_text(emb, golden_items, batch_size):
    vecs = emb.encode([it["text"] for it in golden_items], batch_size=batch_size)
    cos = _cosines(vecs, golden_items)
    worst = int(cos.argmin())
    assert cos.min() >= 0.9999, f"cosine {cos.min():.6f} for {golden_items[worst]['text'][:60]!r}"


def test_int8_close_to_golden(emb8, golden_items):
    # The bar int8 must clear to be the default on VNNI CPUs (BENCHMARKS.md, Embedding): 0.99 on every text.
    vecs = emb8.encode([it["text"] for it in golden_items])
    cos = _cosines(vecs, golden_items)
    worst = int(cos.argmin())
    assert cos.min() >= 0.99, f"cosine {cos.min():.4f} for {golden_items[worst]['text'][:60]!r}"
    assert cos.mean() >= 0.995
    assert emb8.precision == "int8"


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_precision_auto_is_int8_only_on_a_vnni_cpu(model_cache, monkeypatch):
    from clag_fast.embed import embedder as embed

    monkeypatch.setattr(embed, "_cuda_available", lambda: False)
    for vnni in (True, False):
        monkeypatch.setattr(embed, "_cpu_has_vnni", lambda v=vnni: v)
        assert embed.Embedder(threads=2).precision == ("int8" if vnni else "fp32")
        assert embed.Embedder(precision="fp32", threads=2).precision == "fp32"
    monkeypatch.setattr(embed, "_cpu_has_vnni", lambda: True)
    monkeypatch.setattr(embed, "_cuda_available", lambda: True)
    # CUDA said to be present: fp32 (int8 has no CUDA kernels), even if the session then
    # falls back to the CPU because no device can be initialised.
    assert embed.Embedder(threads=2).precision == "fp32"
    with pytest.raises(ValueError, match="precision"):
        embed.Embedder(precision="bf16")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_spread_calls_match_calls_in_turn(model_cache, precision):
    """encode() spreads its ONNX calls over 1-thread sessions; same vectors as one by one."""
    from clag_fast.embed.embedder import Embedder

    texts = [f"note {i}: " + "the quick brown fox jumps " * (i % 9) for i in range(70)]
    spread = Embedder(precision=precision, threads=2, batch_size=8)
    assert spread._workers == 2
    inturn = Embedder(precision=precision, threads=2, batch_size=8)
    inturn._workers = 1
    a, b = spread.encode(texts), inturn.encode(texts)
    if precision == "int8":
        np.testing.assert_array_equal(a, b)
    else:  # the 1-thread and 2-thread GEMMs may round differently
        assert (a * b).sum(1).min() > 0.99999


def test_int8_vector_does_not_depend_on_batch_mates(emb8):
    # int8 embeds a batch in one call; every activation scale is per token, so a text's
    # vector moves only by the float rounding of the pooling sum (one scale per call moved
    # it by up to 0.02). Loud and long mates next to short texts.
    texts = ["short one", "a much longer sentence about the weekend trip to the museum " * 3,
             "LOUD TEXT!!! 12345 🙂", "ok", "What does the user like?", "Who booked the rental car?",
             "The landlord cancelled the dentist appointment before the trip."] * 2
    assert emb8.batch_size > 1
    together = emb8.encode(texts)
    alone = np.vstack([emb8.encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, rtol=0, atol=1e-6)
    mixed = emb8.encode(texts[3:] + texts[:3], batch_size=3)
    np.testing.assert_allclose(mixed, np.vstack([alone[3:], alone[:3]]), rtol=0, atol=1e-6)


def test_shape_dtype_norm(emb):
    v = emb.encode(["a cat", "Dogs are loyal animals.", "日本語のテキスト", "🙂🙂"])
    assert v.shape == (4, 384) and v.dtype == np.float32 and v.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert emb.dim == 384
    e = emb.encode([])
    assert e.shape == (0, 384) and e.dtype == np.float32
    v2, t = emb.encode(["x y"], return_truncated=True)
    assert v2.shape == (1, 384) and t.dtype == bool and t.shape == (1,) and not t[0]


def test_deterministic_and_order_and_batch_invariant(emb):
    texts = [f"memory number {i} about {'topic ' * (i % 7)}" for i in range(50)]
    a = emb.encode(texts)
    b = emb.encode(texts)
    np.testing.assert_array_equal(a, b)
    rev = emb.encode(texts[::-1], batch_size=7)[::-1]
    # Different padding widths change float summation order only.
    assert (a * rev).sum(1).min() > 0.99999
    one = np.vstack([emb.encode([t], batch_size=1) for t in texts[:5]])
    assert (a[:5] * one).sum(1).min() > 0.99999


def test_thread_safe(emb):
    groups = [[f"thread {g} says hello number {i}" + " more" * (i % 5) for i in range(24)]
              for g in range(4)]
    serial = [emb.encode(g) for g in groups]
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(2):
                results[k] = emb.encode(groups[k])
        except BaseException as exc:  # surface in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(4):
        assert (results[k] * serial[k]).sum(1).min() > 0.99999


@pytest.mark.parametrize(
    "bad, index, words",
    [
        (["ok", ""], 1, "empty"),
        (["ok", "fine", "  \t\n"], 2, "whitespace"),
        ([None], 0, "NoneType"),
        (["ok", 3], 1, "int"),
        (["ok", b"bytes"], 1, "bytes"),
        (["ok", "bad \ud800 surrogate"], 1, "unicode"),
        (["\u200b\u200b"], 0, "no tokens"),
        (["a", "\x00\x01"], 1, "no tokens"),
    ],
)
def test_bad_items_raise_value_error_naming_index(emb, bad, index, words):
    with pytest.raises(ValueError) as err:
        emb.encode(bad)
    msg = str(err.value)
    assert f"texts[{index}]" in msg and words in msg


def test_bare_string_and_bad_arguments(emb, model_cache):
    from clag_fast.embed.embedder import Embedder

    with pytest.raises(TypeError, match="list of str"):
        emb.encode("hello")
    with pytest.raises(ValueError, match="batch_size"):
        emb.encode(["x"], batch_size=0)
    with pytest.raises(ValueError, match="precision"):
        Embedder(precision="fp16")
    with pytest.raises(ValueError, match="device"):
        Embedder(device="tpu")
    with pytest.raises(ValueError, match="threads"):
        Embedder(threads=0)
    with pytest.raises(ValueError, match="unknown model"):
        Embedder(model="bert-huge")


def test_long_text_truncated_like_sentence_transformers(emb):
    long = "word " * 600
    (v, t) = emb.encode([long, "word " * 300], return_truncated=True)
    assert t.tolist() == [True, True]
    # Both are cut to the same first 254 pieces, so the vectors coincide.
    assert float(v[0] @ v[1]) > 0.99999
    assert len(emb.tokenize([long])[0]) == 256


def test_devices(emb, model_cache):
    import onnxruntime as ort

    from clag_fast.embed.embedder import Embedder

    auto = Embedder(device="auto", threads=2)
    cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    assert auto.device == ("cuda" if cuda else "cpu")
    if not cuda:
        with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
            Embedder(device="cuda")
    with pytest.raises(ValueError, match="CPU only"):
        Embedder(precision="int8", device="cuda")
    assert Embedder(precision="int8", device="auto", threads=2).device == "cpu"


def test_sessions_are_shared(emb, model_cache):
    from clag_fast.embed.embedder import Embedder

    other = Embedder(precision="fp32", threads=2)
    assert other._session is emb._session


def test_product_never_imports_torch(model_cache):
    code = ("import sys; from clag_fast.embed.embedder import Embedder; "
            "v = Embedder(threads=1).encode(['no torch here']); "
            "assert v.shape == (1, 384); "
            "bad = [m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    env = dict(os.environ, CLAG_FAST_CACHE=str(model_cache))
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
