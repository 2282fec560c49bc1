"""Build an fp32 ONNX graph of a BERT sentence encoder from safetensors weights, without torch.

The graph takes ``input_ids`` and ``attention_mask`` (int64, ``[batch, seq]``) and returns
``sentence_embedding`` (float32, ``[batch, hidden]``): the encoder output mean-pooled over the
attention mask and L2-normalised, exactly as sentence-transformers computes it.

The node pattern deliberately mirrors what ``torch.onnx.export`` of HF ``BertModel`` emits
(MatMul+Add projections, Reshape/Transpose heads, Div by sqrt(d), an additive -10000 mask,
erf GELU), because that is the pattern ONNX Runtime's transformer optimiser knows how to fuse
into ``Attention`` / ``SkipLayerNormalization`` / ``BiasGelu`` kernels.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: opset 17 has LayerNormalization as a standard op (one kernel instead of seven nodes).
OPSET = 17
#: Output name of the pooling MatMul (its node is ``POOL_MATMUL + "_node"``); it stays fp32
#: in the int8 graph too (the int8 recipe only touches the weight projections).
POOL_MATMUL = "mean_pool_sum"
#: Name suffixes of the dense projection weights outside attention: attention output
#: (384 -> 384), FFN input (384 -> 1536) and FFN output (1536 -> 384). int8 quantises these
#: with per-token activation scales (see ``_model_build.int8_graph_bytes``).
AO_SUFFIX = ".ao.weight_t"
FFN_IN_SUFFIX = ".ffn_in.weight_t"
FFN_OUT_SUFFIX = ".ffn_out.weight_t"
#: Q/K/V projections: only present as MatMuls where the optimiser did not fuse attention.
QKV_SUFFIXES = (".q.weight_t", ".k.weight_t", ".v.weight_t")
DENSE_SUFFIXES = (AO_SUFFIX, FFN_IN_SUFFIX, FFN_OUT_SUFFIX) + QKV_SUFFIXES


class _Graph:
    """Small helper that names nodes and initialisers uniquely."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs) -> str:
        self._n += 1
        out = name or f"{op_type.lower()}_{self._n}"
        node_name = f"{name}_node" if name else f"{op_type}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=node_name, **attrs))
        return out


def _linear(g: _Graph, x: str, w: np.ndarray, b: np.ndarray, name: str) -> str:
    # torch Linear stores (out, in); MatMul wants (in, out).
    wt = g.const(f"{name}.weight_t", w.T.astype(np.float32))
    bb = g.const(f"{name}.bias", b.astype(np.float32))
    return g.op("Add", [g.op("MatMul", [x, wt]), bb])


def _layer_norm(g: _Graph, x: str, w: np.ndarray, b: np.ndarray, name: str, eps: float) -> str:
    ww = g.const(f"{name}.weight", w.astype(np.float32))
    bb = g.const(f"{name}.bias", b.astype(np.float32))
    return g.op("LayerNormalization", [x, ww, bb], axis=-1, epsilon=eps)


def build_bert_graph(
    weights: Mapping[str, np.ndarray],
    *,
    num_heads: int,
    hidden: int,
    num_layers: int,
    layer_norm_eps: float = 1e-12,
    max_positions: int = 512,
) -> onnx.ModelProto:
    """Return the ONNX model for a BERT encoder + mean pooling + L2 normalisation.

    ``weights`` maps HF ``BertModel`` parameter names (``embeddings.word_embeddings.weight``,
    ``encoder.layer.{i}.attention.self.query.weight``, ...) to numpy arrays. Token type ids
    are always 0 for single-sentence encoding, so ``token_type_embeddings[0]`` is folded into
    the position table (one Gather and one Add fewer per call).
    """
    if hidden % num_heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of num_heads {num_heads}")
    g = _Graph()
    ids, mask = "input_ids", "attention_mask"
    x = _embeddings(g, weights, ids, max_positions, layer_norm_eps)
    layer = _LayerConsts(g, mask, num_heads, hidden)
    for i in range(num_layers):
        x = _encoder_layer(g, weights, f"encoder.layer.{i}.", x, layer, layer_norm_eps)
    _pool_and_normalise(g, x, mask)

    graph = helper.make_graph(
        g.nodes,
        "minilm_sentence_encoder",
        inputs=[
            helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "seq"]),
        ],
        outputs=[helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="clag_fast")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


def _embeddings(g: "_Graph", w: Mapping[str, np.ndarray], ids: str, max_positions: int, eps: float) -> str:
    """Word + position (+ token type 0) embeddings, layer-normalised."""
    word = g.const("word_embeddings", w["embeddings.word_embeddings.weight"].astype(np.float32))
    pos_table = w["embeddings.position_embeddings.weight"][:max_positions].astype(np.float32)
    pos_table = pos_table + w["embeddings.token_type_embeddings.weight"][0].astype(np.float32)
    pos = g.const("position_embeddings", pos_table)

    # Positions 0..seq-1: slice the first `seq` rows of the table (a 1-D Slice; no Range,
    # which onnxruntime 1.32's optimiser rewrites into an invalid scalar Slice).
    seq = g.op("Slice", [g.op("Shape", [ids]), g.const("c_1", np.array([1], np.int64)),
                         g.const("c_2", np.array([2], np.int64))])
    pos_rows = g.op("Slice", [pos, g.const("c_0", np.array([0], np.int64)), seq,
                              g.const("c_axis0", np.array([0], np.int64))])
    emb = g.op("Add", [g.op("Gather", [word, ids], axis=0), pos_rows])
    return _layer_norm(g, emb, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                       "embeddings.LayerNorm", eps)


class _LayerConsts:
    """What every encoder layer shares: the attention mask as an additive bias, the head
    split/merge shapes and the scalar constants."""

    def __init__(self, g: "_Graph", mask: str, num_heads: int, hidden: int) -> None:
        head = hidden // num_heads
        # Additive attention mask, the HF 4.x export pattern: (1 - mask[:, None, None, :]) * -10000.
        # Node for node what the optimiser's FusionAttention matches: Unsqueeze, Unsqueeze, Cast, Sub, Mul.
        mask4 = g.op("Unsqueeze", [g.op("Unsqueeze", [mask, g.const("c_ax1", np.array([1], np.int64))]),
                                   g.const("c_ax2", np.array([2], np.int64))])
        mask4 = g.op("Cast", [mask4], to=TensorProto.FLOAT)
        self.mask_bias = g.op("Mul", [g.op("Sub", [g.const("c_one_f", np.array(1.0, np.float32)), mask4]),
                                      g.const("c_neg", np.array(-10000.0, np.float32))])
        self.split_shape = g.const("c_split_shape", np.array([0, 0, num_heads, head], np.int64))
        self.merge_shape = g.const("c_merge_shape", np.array([0, 0, hidden], np.int64))
        self.scale = g.const("c_sqrt_head", np.array(math.sqrt(head), np.float32))
        self.sqrt2 = g.const("c_sqrt2", np.array(math.sqrt(2.0), np.float32))
        self.one = g.const("c_one_gelu", np.array(1.0, np.float32))
        self.half = g.const("c_half", np.array(0.5, np.float32))


def _encoder_layer(g: "_Graph", w: Mapping[str, np.ndarray], p: str, x: str, c: _LayerConsts, eps: float) -> str:
    """One BERT layer: self-attention, add & norm, feed-forward (exact GELU), add & norm."""
    q = _linear(g, x, w[p + "attention.self.query.weight"], w[p + "attention.self.query.bias"], p + "q")
    k = _linear(g, x, w[p + "attention.self.key.weight"], w[p + "attention.self.key.bias"], p + "k")
    v = _linear(g, x, w[p + "attention.self.value.weight"], w[p + "attention.self.value.bias"], p + "v")
    qh = g.op("Transpose", [g.op("Reshape", [q, c.split_shape])], perm=[0, 2, 1, 3])
    kh = g.op("Transpose", [g.op("Reshape", [k, c.split_shape])], perm=[0, 2, 3, 1])
    vh = g.op("Transpose", [g.op("Reshape", [v, c.split_shape])], perm=[0, 2, 1, 3])
    scores = g.op("Add", [g.op("Div", [g.op("MatMul", [qh, kh]), c.scale]), c.mask_bias])
    probs = g.op("Softmax", [scores], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, c.merge_shape])
    attn = _linear(g, ctx, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"], p + "ao")
    x = _layer_norm(g, g.op("Add", [attn, x]), w[p + "attention.output.LayerNorm.weight"],
                    w[p + "attention.output.LayerNorm.bias"], p + "ln1", eps)
    h = _linear(g, x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"], p + "ffn_in")
    # Exact (erf) GELU as in BERT: 0.5 * h * (1 + erf(h / sqrt(2))).
    gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [g.op("Erf", [g.op("Div", [h, c.sqrt2])]), c.one])]), c.half])
    out = _linear(g, gelu, w[p + "output.dense.weight"], w[p + "output.dense.bias"], p + "ffn_out")
    return _layer_norm(g, g.op("Add", [out, x]), w[p + "output.LayerNorm.weight"],
                       w[p + "output.LayerNorm.bias"], p + "ln2", eps)


def _pool_and_normalise(g: "_Graph", x: str, mask: str) -> None:
    """Mean pooling over the real tokens, then L2 normalisation, as the output
    ``sentence_embedding``."""
    maskf = g.op("Cast", [mask], to=TensorProto.FLOAT)
    # Mean pooling as one batched MatMul: [B,1,S] @ [B,S,H] -> [B,1,H]; no [B,S,H] temporary
    # for mask * hidden, then divide by the token count (clamped like sentence-transformers).
    pooled = g.op("MatMul", [g.op("Unsqueeze", [maskf, g.const("c_axis1", np.array([1], np.int64))]), x],
                  name=POOL_MATMUL)
    pooled = g.op("Squeeze", [pooled, g.const("c_axis1b", np.array([1], np.int64))])
    count = g.op("ReduceSum", [maskf, g.const("c_axis1c", np.array([1], np.int64))], keepdims=1)
    count = g.op("Max", [count, g.const("c_eps_count", np.array(1e-9, np.float32))])
    mean = g.op("Div", [pooled, count])
    # F.normalize(p=2, eps=1e-12): x / max(||x||, eps).
    # (ReduceL2 still takes axes as an attribute in opset 17; ReduceSum takes an input.)
    norm = g.op("ReduceL2", [mean], axes=[1], keepdims=1)
    norm = g.op("Max", [norm, g.const("c_eps_norm", np.array(1e-12, np.float32))])
    g.op("Div", [mean, norm], name="sentence_embedding")
