"""Embedding: all-MiniLM-L6-v2 through ONNX Runtime.

  embedder    Embedder (tokenise, run, pool, normalise), precision and thread choices
  sources     the manifest, source package lookup, sha256 checks of the source files
  modelfiles  the build cache of the ONNX graphs (builds on a miss)
  build       building the fp32 / int8 ONNX graphs from the safetensors weights
  bert_onnx   the BERT graph written op by op
  cpu         what the CPU offers int8 (VNNI or not: the weights' codes)
"""

from clag_fast.embed.embedder import Embedder, resolve_precision, usable_cpus

__all__ = ["Embedder", "resolve_precision", "usable_cpus"]
