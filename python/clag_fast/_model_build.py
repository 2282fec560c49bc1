"""Turn a model's verified source files into ONNX bytes (fp32 fused, or int8).

Called by :func:`clag_fast.modelfiles.model_path` on a cache miss; import cost (onnx,
safetensors, the onnxruntime optimiser and quantiser) is only paid when building.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import warnings
from pathlib import Path

import onnx

from clag_fast import _bert_onnx
from clag_fast.modelfiles import ModelFilesError, manifest, source_file

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
        return "pre-processing before quantization" not in record.getMessage()

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


def int8_graph_bytes(fp32: onnx.ModelProto) -> bytes:
    """Dynamic int8 quantisation of the fp32 graph (ONNX Runtime's quantize_dynamic).

    Recipe chosen by measurement against the fp32 graph on 440 texts (LoCoMo turns + golden):
    per-tensor weights: min cosine 0.63 (unusable); per-channel: 0.983; per-channel with the
    six FFN output projections (1536->384, fed by GELU's long-tailed activations) left fp32:
    0.990. Those stay fp32; the pooling MatMul (activation x activation) does too.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    exclude = [_bert_onnx.POOL_MATMUL + "_node"]
    exclude += [n.name for n in fp32.graph.node
                if n.op_type == "MatMul" and len(n.input) > 1
                and n.input[1].endswith(_bert_onnx.FFN_OUT_SUFFIX)]
    with tempfile.TemporaryDirectory(prefix="clag_fast_q_") as tmp, _quiet():
        out = Path(tmp) / "int8.onnx"
        quantize_dynamic(
            fp32, out,
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Attention"],
            nodes_to_exclude=exclude,
            # shape inference cannot type the outputs of com.microsoft ops; they are float.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return out.read_bytes()


def build_model_bytes(model: str, precision: str) -> bytes:
    """Serialised ONNX model for (model, precision)."""
    if precision == "fp32":
        return fused_graph(model).SerializeToString()
    if precision == "int8":
        # Quantise the cached, checksummed fp32 build rather than fusing a second time.
        from clag_fast.modelfiles import model_path

        return int8_graph_bytes(onnx.load(str(model_path(model, "fp32"))))
    raise ValueError(f"unknown precision {precision!r}")
