"""Model files: the built ONNX graphs and their on-disk cache.

The weights come from a verified source package (``embed.sources``: the manifest, the
package, the sha256 sums). The ONNX graphs are built from them (``embed.build``) on first use
and cached:

* ``$CLAG_FAST_CACHE`` (default ``~/.cache/clag_fast``) holds ``<model>-<precision>-<key>.onnx``
  plus a ``.sha256`` sidecar; ``key`` hashes everything the bytes depend on (source sums,
  builder version, onnx / onnxruntime versions), so an upgrade rebuilds instead of reusing.
* A build is written to a temp file in the cache directory, re-read and checked against the
  sha256 of the bytes produced, then renamed into place (atomic on POSIX): a crash or a
  concurrent build never leaves a half-written model under the final name.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
from pathlib import Path

from clag_fast.embed.cpu import int8_weight_codes
from clag_fast.embed.sources import DEFAULT_MODEL, manifest, sha256_file, source_dir, source_file, tokenizer_path
from clag_fast.errors import ModelFilesError

# The source files' names too: the embedder and models/build.py use them from here.
__all__ = ["BUILDER_VERSION", "PRECISIONS", "DEFAULT_MODEL", "ModelFilesError", "cache_dir", "cached_model_path",
           "model_path", "manifest", "sha256_file", "source_dir", "source_file", "tokenizer_path"]

#: Bump when the graph builder or the quantisation recipe changes: invalidates cached builds.
BUILDER_VERSION = "6"  # 2: no SkipLayerNormalization fusion; 3: per-token int8 matmuls;
# 4: int8 Q/K/V per token too (MultiHeadAttention instead of QAttention); 5: int8 on a 2-D stream;
# 6: the Q/K/V projections' largest input channel in fp32
PRECISIONS = ("fp32", "int8")

# Re-entrant: the int8 build asks for the (cached) fp32 model while holding it.
_build_lock = threading.RLock()


def cache_dir() -> Path:
    """Directory for built models: ``$CLAG_FAST_CACHE`` or ``~/.cache/clag_fast``."""
    env = os.environ.get("CLAG_FAST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "clag_fast"


def _version(package: str) -> str:
    """An installed package's version, from its metadata: ``import onnx`` only to read
    ``onnx.__version__`` took 0.5 s of CPU in every process that loads a model (the Ray
    ingest's embedding actor and shard owners among them, while they start)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # not installed as a distribution
        return str(importlib.import_module(package).__version__)


def _cache_key(model: str, precision: str) -> str:
    entry = manifest(model)
    parts = [BUILDER_VERSION, model, precision, json.dumps(entry, sort_keys=True),
             _version("onnx"), _version("onnxruntime")]
    if precision == "int8":
        # The weights' codes depend on the CPU: a cache shared between machines keeps one
        # build per kind.
        parts.append(int8_weight_codes())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def cached_model_path(model: str = DEFAULT_MODEL, precision: str = "fp32") -> Path:
    """Where the built ONNX file of (model, precision) lives in the cache (may not exist yet)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return cache_dir() / f"{model}-{precision}-{_cache_key(model, precision)}.onnx"


def _verified(path: Path) -> bool:
    side = path.with_name(path.name + ".sha256")
    if not (path.is_file() and side.is_file()):
        return False
    return side.read_text().split()[0] == sha256_file(path)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path``, check its sha256, rename into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache must be readable by all
        if sha256_file(Path(tmp)) != digest:
            raise ModelFilesError(f"short or corrupt write of {tmp} (disk full?)")
        side_tmp = tmp + ".sha256"
        Path(side_tmp).write_text(f"{digest}  {path.name}\n")
        # Model first, sidecar second: a reader that sees the sidecar sees the whole model.
        os.replace(tmp, path)
        os.replace(side_tmp, path.with_name(path.name + ".sha256"))
    finally:
        for leftover in (tmp, tmp + ".sha256"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def model_path(model: str = DEFAULT_MODEL, precision: str = "fp32", *, rebuild: bool = False) -> Path:
    """Path of the verified ONNX file of (model, precision), building it on first use.

    A cached file whose sha256 does not match its sidecar is rebuilt. The build takes a few
    seconds (fp32 ~2 s, int8 ~3 s on a 2-core machine).
    """
    path = cached_model_path(model, precision)
    with _build_lock:  # one build per process; other processes race harmlessly (atomic rename)
        if not rebuild and _verified(path):
            return path
        from clag_fast.embed import build

        # int8 quantises the cached, checksummed fp32 build rather than fusing a second time.
        fp32 = model_path(model, "fp32") if precision == "int8" else None
        _write_atomic(path, build.build_model_bytes(model, precision, fp32_model=fp32))
    return path
