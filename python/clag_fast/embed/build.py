"""Turn a model's verified source files into ONNX bytes (fp32 fused, or int8).

Called by :func:`clag_fast.embed.modelfiles.model_path` on a cache miss; import cost (onnx,
safetensors, the onnxruntime optimiser and quantiser) is only paid when building. Reads the
verified source files (``embed.sources``) and never the build cache: the int8 build is handed
the cached fp32 model's path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx

from clag_fast.embed import bert_onnx as _bert_onnx
from clag_fast.embed.cpu import int8_weight_codes
from clag_fast.embed.sources import manifest, source_file
from clag_fast.errors import ModelFilesError

log = logging.getLogger(__name__)


def _json(model: str, name: str) -> dict:
    return json.loads(source_file(model, name).read_text("utf-8"))


def plain_graph(model: str) -> onnx.ModelProto:
    """The unfused fp32 graph (standard ONNX ops only) built from the safetensors weights."""
    from safetensors.numpy import load_file

    entry = manifest(model)
    cfg = _json(model, "config.json")
    pool = _json(model, "1_Pooling/config.json")
    st = _json(model, "sentence_bert_config.json")
    # The graph hard-codes mean pooling + L2 norm; refuse a source that says otherwise.
    if not pool.get("pooling_mode_mean_tokens") or entry["pooling"] != "mean":
        raise ModelFilesError(f"model {model!r}: only mean pooling is supported, got {pool}")
    if st.get("max_seq_length") != entry["max_seq_length"]:
        raise ModelFilesError(f"model {model!r}: max_seq_length {st.get('max_seq_length')} in the "
                              f"package, {entry['max_seq_length']} in the manifest")
    weights = load_file(str(source_file(model, "model.safetensors")))
    return _bert_onnx.build_bert_graph(
        weights,
        num_heads=cfg["num_attention_heads"],
        hidden=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        layer_norm_eps=cfg["layer_norm_eps"],
        max_positions=cfg["max_position_embeddings"],
    )


@contextlib.contextmanager
def _quiet():
    """Silence the optimiser's/quantiser's advisory log lines (producer name, pre-processing)."""
    noisy = [logging.getLogger(n) for n in ("onnxruntime.transformers", "onnxruntime.quantization")]
    levels = [lg.level for lg in noisy]
    root = logging.getLogger()

    def drop(record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "pre-processing before quantization" not in msg and "already quantized" not in msg

    for lg in noisy:
        lg.setLevel(logging.ERROR)
    root.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeFilter(drop)
        for lg, lv in zip(noisy, levels):
            lg.setLevel(lv)


def fused_graph(model: str) -> onnx.ModelProto:
    """The fp32 graph after onnxruntime's transformer optimiser (Attention and BiasGelu).

    SkipLayerNormalization is deliberately not fused: onnxruntime 1.32's CPU kernel for it
    measured ~10x slower than the standard Add + LayerNormalization it replaces (1 thread,
    batches of 32 LoCoMo turns: 3.5 ms against 0.3 ms per call, 14% of the whole run), so the
    graph keeps Add + LayerNormalization and the session disables ORT's own SkipLayerNorm
    fusion (see ``embed.SESSION_DISABLED_OPTIMIZERS``). Same vectors (cosine 1.0000). If the
    optimiser is unavailable or fails to fuse every attention layer, the unfused graph is
    returned (correct, a little slower).
    """
    plain = plain_graph(model)
    cfg = _json(model, "config.json")
    try:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions("bert")
        options.enable_skip_layer_norm = False
        options.enable_bias_skip_layer_norm = False
        with _quiet():
            opt = optimize_model(plain, model_type="bert", num_heads=cfg["num_attention_heads"],
                                 hidden_size=cfg["hidden_size"], opt_level=0,
                                 optimization_options=options)
        fused = opt.model
        # The optimiser adds the contrib-op domain only when saving to a file; add it here.
        if not any(o.domain == "com.microsoft" for o in fused.opset_import):
            fused.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    except Exception as exc:  # the optimiser is an optional nicety, never a hard failure
        log.warning("onnxruntime transformer optimiser failed (%s); using the unfused graph", exc)
        return plain
    n_attn = sum(n.op_type == "Attention" for n in fused.graph.node)
    if n_attn != cfg["num_hidden_layers"]:
        log.warning("optimiser fused %d of %d attention layers; using the unfused graph",
                    n_attn, cfg["num_hidden_layers"])
        return plain
    return fused


#: Name of the ``[batch, seq]`` shape of the inputs, computed once per graph by the int8 rewrite.
_BATCH_SEQ = "ptq_batch_seq"


def _int8_columns(w: np.ndarray, weights: str) -> tuple[np.ndarray, np.ndarray]:
    """``w``'s codes with one symmetric int8 scale per output column, and the scales; for
    ``weights="u8"`` the same levels stored as uint8 around 128."""
    w_scale = np.abs(w).max(axis=0) / 127.0
    w_scale[w_scale == 0] = 1.0
    w_q = np.clip(np.rint(w / w_scale), -127, 127).astype(np.int8)
    if weights == "u8":
        w_q = (w_q.astype(np.int16) + 128).astype(np.uint8)
    return w_q, w_scale


def _per_token_int8(model: onnx.ModelProto, suffixes=_bert_onnx.DENSE_SUFFIXES, *,
                    flat: bool = False, weights: str = "s8") -> onnx.ModelProto:
    """Rewrite ``x @ W`` (W a constant named ``*suffix``) into an int8 matmul with per-token scales.

    W gets one symmetric int8 scale per output column; x gets one scale per row (token),
    computed at run time: ``s = max|x_row| / 127``, ``x_q = round(x / s) + 128`` (uint8), then
    ``MatMulIntegerToFloat(x_q, W_q)`` with ``s`` as its per-row A scale. onnxruntime's own
    dynamic quantisation uses one scale for the whole activation tensor, so a few large
    values anywhere in a text coarsen every token; per token, a row's range is its own.
    Measured against the fp32 graph (batch 1): quantising the FFN output projections per
    token keeps the golden set at cosine >= 0.998 where one scale per tensor drops it to
    0.983. Rows are independent, so a text's result does not depend on its batch mates
    through these matmuls.

    ``flat``: the matmuls' inputs are already ``[rows, K]`` and their outputs stay 2-D (the
    stream of ``_flatten_stream``); otherwise each input is reshaped to 2-D and each output
    back to ``[batch, seq, N]``. Each node costs ~0.5-1 us per call whatever its size, which
    at a dozen tokens is a tenth of the call.

    ``weights``: ``"s8"`` stores ``W_q`` as int8; ``"u8"`` as uint8 with zero point 128 (the
    same levels, for CPUs whose uint8 x int8 kernel saturates: ``cpu.int8_weight_codes``).
    """
    if weights not in ("s8", "u8"):
        raise ValueError(f"weights must be 's8' or 'u8', got {weights!r}")
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    added: list[onnx.TensorProto] = []

    def const(name: str, value) -> str:
        added.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    # Once per graph: rows = batch * seq (from input_ids), the per-row uint8 zero points.
    head = [helper.make_node("ReduceProd", [_BATCH_SEQ], ["ptq_rows"], name="ptq_rows", keepdims=1),
            helper.make_node("Expand", [const("ptq_zp", np.array(128, np.uint8)), "ptq_rows"],
                             ["ptq_zp_rows"], name="ptq_zp_rows")]
    if not any(_BATCH_SEQ in n.output for n in graph.node):
        head.insert(0, helper.make_node("Shape", ["input_ids"], [_BATCH_SEQ], name="ptq_shape"))
    out_shapes: dict[int, str] = {}
    body = []
    for node in graph.node:
        if not (node.op_type == "MatMul" and node.input[1] in inits
                and node.input[1].endswith(tuple(suffixes))):
            body.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        k, n = w.shape
        w_q, w_scale = _int8_columns(w, weights)
        p = node.name + "_ptq"
        # No zero point input for int8 weights (symmetric); uint8 ones sit around 128.
        w_zp = [const(p + "_wzp", np.full(n, 128, np.uint8))] if weights == "u8" else []
        x = node.input[0]
        y = node.output[0] if flat else p + "_y"
        if not flat:
            body.append(helper.make_node("Reshape", [x, const(p + "_2d", np.array([-1, k], np.int64))],
                                         [p + "_x"], name=p + "_x"))
            x = p + "_x"
        body += [
            helper.make_node("Abs", [x], [p + "_abs"], name=p + "_abs"),
            helper.make_node("ReduceMax", [p + "_abs"], [p + "_amax"], name=p + "_amax", axes=[1], keepdims=1),
            helper.make_node("Max", [p + "_amax", const(p + "_tiny", np.array(1e-30, np.float32))], [p + "_amax1"], name=p + "_amax1"),
            helper.make_node("Mul", [p + "_amax1", const(p + "_r127", np.array(1 / 127.0, np.float32))], [p + "_s"], name=p + "_s"),
            helper.make_node("Reshape", [p + "_s", const(p + "_flat", np.array([-1], np.int64))], [p + "_s_rows"], name=p + "_s_rows"),
            helper.make_node("QuantizeLinear", [x, p + "_s_rows", "ptq_zp_rows"], [p + "_xq"], name=p + "_xq", axis=0),
            # The per-row scale [rows, 1] goes in as A's scale: no Mul after the matmul.
            helper.make_node("MatMulIntegerToFloat",
                             [p + "_xq", const(p + "_wq", w_q), p + "_s",
                              const(p + "_ws", w_scale.astype(np.float32)), "ptq_zp", *w_zp],
                             [y], name=p + "_mm", domain="com.microsoft"),
        ]
        if not flat:
            if n not in out_shapes:
                out_shapes[n] = f"ptq_out_shape_{n}"
                head.append(helper.make_node("Concat", [_BATCH_SEQ, const(f"ptq_n_{n}", np.array([n], np.int64))],
                                             [out_shapes[n]], name=f"ptq_out_shape_{n}", axis=0))
            body.append(helper.make_node("Reshape", [y, out_shapes[n]], [node.output[0]], name=p + "_out"))
    del graph.node[:]
    graph.node.extend(head + body)
    graph.initializer.extend(added)
    used = {i for nd in graph.node for i in nd.input}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


QKV_SUFFIX = ".qkv.weight_t"


def _unfuse_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """Split every fused ``Attention`` node into its Q/K/V projection and the attention proper,
    and run the encoder on a 2-D ``[batch * seq, hidden]`` stream.

    ``Attention(x, W_qkv, b_qkv, mask_index)`` becomes ``MatMul(x, W_qkv)`` (weight named
    ``*.qkv.weight_t``, so ``_per_token_int8`` quantises it like the other dense matmuls),
    a ``Split`` into Q, K and V, and ``MultiHeadAttention(q, k, v, b_qkv, key_padding_mask)``
    on the int32 ``[batch, seq]`` mask; the attention itself stays fp32 and per sequence.
    Why: quantising the fused node gives ORT's QAttention, which scales the whole call's
    activations with one number, so a text's vector depended on its call mates and int8 had
    to embed one text per call. Per-token Q/K/V keeps every row to itself.

    The stream between the embeddings and the pooling is 2-D (LayerNormalization, BiasGelu
    and the residual Adds do not care), so the dense matmuls need no Reshape around them;
    only the attention sees ``[batch, seq, ...]``: 2 Reshapes per layer instead of 8.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    attn = [n for n in graph.node if n.op_type == "Attention" and n.domain == "com.microsoft"]
    hidden = numpy_helper.to_array(inits[attn[0].input[1]]).shape[0]
    pool = next(n for n in graph.node if n.name == _bert_onnx.POOL_MATMUL + "_node")
    stream_in, stream_out = attn[0].input[0], pool.input[1]

    def const(name: str, value) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    mask2d = "attention_mask_int32"
    head = [helper.make_node("Shape", ["input_ids"], [_BATCH_SEQ], name="ptq_shape"),
            helper.make_node("Concat", [_BATCH_SEQ, const("flat_qkv_n", np.array([3 * hidden], np.int64))],
                             ["flat_qkv_shape"], name="flat_qkv_shape", axis=0),
            helper.make_node("Concat", [_BATCH_SEQ, const("flat_hidden_n", np.array([hidden], np.int64))],
                             ["flat_hidden_shape"], name="flat_hidden_shape", axis=0)]
    if not any(mask2d in n.output for n in graph.node):
        head.append(helper.make_node("Cast", ["attention_mask"], [mask2d], name="mask_int32",
                                     to=onnx.TensorProto.INT32))
    to_2d = const("flat_2d", np.array([-1, hidden], np.int64))
    flat_in, flat_out = stream_in + "_2d", stream_out + "_3d"
    body = []
    for node in graph.node:
        if node is pool:
            body.append(helper.make_node("Reshape", [stream_out, "flat_hidden_shape"], [flat_out], name="flat_out"))
            node.input[1] = flat_out
        elif stream_in in node.input:  # the first layer's attention and residual
            for i, name in enumerate(node.input):
                if name == stream_in:
                    node.input[i] = flat_in
        if node.op_type != "Attention" or node.domain != "com.microsoft":
            body.append(node)
            if stream_in in node.output:
                body.append(helper.make_node("Reshape", [stream_in, to_2d], [flat_in], name="flat_in"))
            continue
        heads = next(a.i for a in node.attribute if a.name == "num_heads")
        p = node.name
        wname = const(p + QKV_SUFFIX, numpy_helper.to_array(inits[node.input[1]]))
        sizes = const(p + "_sizes", np.full(3, hidden, np.int64))
        qkv = [p + "_q", p + "_k", p + "_v"]
        body += [
            helper.make_node("MatMul", [node.input[0], wname], [p + "_qkv"], name=p + "_qkv"),
            helper.make_node("Reshape", [p + "_qkv", "flat_qkv_shape"], [p + "_qkv3"], name=p + "_qkv3"),
            helper.make_node("Split", [p + "_qkv3", sizes], qkv, name=p + "_split", axis=-1),
            helper.make_node("MultiHeadAttention", qkv + [node.input[2], mask2d], [p + "_ctx"],
                             name=p + "_mha", domain="com.microsoft", num_heads=heads),
            helper.make_node("Reshape", [p + "_ctx", to_2d], [node.output[0]], name=p + "_ctx2d"),
        ]
    del graph.node[:]
    graph.node.extend(head + body)
    used = {i for nd in graph.node for i in nd.input}
    keep = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return model


#: Input channels of each Q/K/V projection kept in fp32 (the largest by calibration).
QKV_OUTLIER_CHANNELS = 1


def _qkv_outlier_channels(fp32: onnx.ModelProto, count: int = QKV_OUTLIER_CHANNELS) -> dict[str, list[int]]:
    """For each fused Attention node, the ``count`` input channels with the largest |x|.

    BERT's residual stream carries a few huge channels (MiniLM: channel 99 at 8-30 where the
    median channel peaks at ~1.5, the same for every text), so one per-token scale spends
    most of the int8 range on it and the other channels of Q/K/V's input get a dozen levels.
    Calibrated on random token ids (the channels are the same for any input; deterministic).
    """
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    attn = [n for n in fp32.graph.node if n.op_type == "Attention"]
    probe = onnx.ModelProto()
    probe.CopyFrom(fp32)
    for n in attn:
        probe.graph.output.append(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
    rows = {i.name: i.dims[0] for i in fp32.graph.initializer}
    seq = min(16, rows["position_embeddings"])
    ids = np.random.default_rng(0).integers(0, rows["word_embeddings"], size=(8, seq)).astype(np.int64)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run([n.input[0] for n in attn], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return {n.name: sorted(np.argsort(-np.abs(x).reshape(-1, x.shape[-1]).max(0))[:count].tolist())
            for n, x in zip(attn, outs)}


def _split_outlier_channels(model: onnx.ModelProto, channels: dict[str, list[int]]) -> onnx.ModelProto:
    """``x @ W`` of each Q/K/V projection as ``(x * keep) @ W + x[:, c] @ W[c]``: the outlier
    channels ``c`` in fp32 (a [rows, 1] x [1, 3*hidden] product), the rest per-token int8
    with a scale no longer set by them. Golden set min/mean cosine 0.9903/0.9967 -> 0.9953/
    0.9984; ~4 nodes per layer."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    body = []
    for node in graph.node:
        name = node.name[:-len("_qkv")] if node.name.endswith("_qkv") else None
        if not (node.op_type == "MatMul" and name in channels and node.input[1].endswith(QKV_SUFFIX)):
            body.append(node)
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        c = channels[name]
        keep = np.ones(w.shape[0], np.float32)
        keep[c] = 0
        p = node.name + "_outlier"
        graph.initializer.extend([numpy_helper.from_array(np.array(c, np.int64), p + "_idx"),
                                  numpy_helper.from_array(np.ascontiguousarray(w[c, :]), p + "_w"),
                                  numpy_helper.from_array(keep, p + "_keep")])
        x, out = node.input[0], node.output[0]
        node.input[0], node.output[0] = p + "_rest", p + "_y_rest"
        body += [helper.make_node("Gather", [x, p + "_idx"], [p + "_x"], name=p + "_x", axis=1),
                 helper.make_node("MatMul", [p + "_x", p + "_w"], [p + "_y"], name=p + "_mm"),
                 helper.make_node("Mul", [x, p + "_keep"], [p + "_rest"], name=p + "_rest"),
                 node,
                 helper.make_node("Add", [p + "_y_rest", p + "_y"], [out], name=p + "_add")]
    del graph.node[:]
    graph.node.extend(body)
    return model


def int8_graph_bytes(fp32: onnx.ModelProto, weights: str | None = None) -> bytes:
    """int8 graph: every dense matmul of the encoder in int8 with per-token activation scales,
    the rest (attention scores and context, LayerNorm, GELU, pooling, L2 norm) fp32.

    A fused graph's Attention nodes are first split into their Q/K/V projection and a fp32
    ``MultiHeadAttention`` on a 2-D stream (``_unfuse_attention``), then every dense
    projection (Q/K/V, attention output, FFN in and out) goes through ``_per_token_int8``.
    No op mixes rows of different texts, so a text's vector does not depend on its call
    mates beyond float rounding and int8 embeds a batch in one ONNX call (the weights are
    then read once per call, not once per text). An unfused graph (the optimiser's
    fallback) gets the same per-token matmuls on its own Q/K/V projections.
    """
    model = onnx.ModelProto()
    model.CopyFrom(fp32)
    fused = any(n.op_type == "Attention" for n in model.graph.node)
    if fused:
        outliers = _qkv_outlier_channels(model)
        model = _unfuse_attention(model)
        model = _split_outlier_channels(model, outliers)
    weights = weights or int8_weight_codes()
    model = _per_token_int8(model, suffixes=_bert_onnx.DENSE_SUFFIXES + (QKV_SUFFIX,), flat=fused, weights=weights)
    return model.SerializeToString()


def build_model_bytes(model: str, precision: str, fp32_model: Path | None = None) -> bytes:
    """Serialised ONNX model for (model, precision). int8 quantises the fp32 model at
    ``fp32_model`` (the cached, checksummed build), fusing none afresh."""
    if precision == "fp32":
        return fused_graph(model).SerializeToString()
    if precision == "int8":
        if fp32_model is None:
            raise ValueError("the int8 build quantises an fp32 model: pass fp32_model")
        return int8_graph_bytes(onnx.load(str(fp32_model)))
    raise ValueError(f"unknown precision {precision!r}")
