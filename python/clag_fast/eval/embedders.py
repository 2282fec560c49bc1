"""The embedders an evaluation uses, and its cache of embedded texts.

Every turn and every question is embedded once per run, in batches (``embed_texts``, cached on
disk when asked), and the vectors are handed to the stores; ``LookupEmbedder`` answers a store
that embeds a question again from those vectors. ``HashingEmbedder`` needs no model files
(tests, offline runs); ``make_embedder`` turns the command line's choice into an embedder.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from clag_fast.eval.metrics import answer_tokens

__all__ = ["HashingEmbedder", "LookupEmbedder", "make_embedder", "embed_texts"]


class HashingEmbedder:
    """Deterministic bag-of-words embedder (feature hashing), for tests and offline runs.

    Each normalised word (and word bigram) is hashed with crc32 into one of ``dim`` buckets
    with a hash-derived sign, then the vector is L2-normalised. Texts that share words get a
    positive cosine, so retrieval is lexical but meaningful; it needs no model files and embeds
    thousands of texts per second. It is not MiniLM: numbers measured with it say nothing about
    the product's retrieval quality.
    """

    def __init__(self, dim: int = 384) -> None:
        if dim < 2:
            raise ValueError(f"HashingEmbedder dim must be >= 2, got {dim}")
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [n, dim], L2-normalised; ValueError naming the index of a non-string item."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"text {i} is {type(text).__name__}, not str")
            words = answer_tokens(text)
            feats = words + [a + " " + b for a, b in zip(words, words[1:])]
            for f in feats:
                h = zlib.crc32(f.encode("utf-8"))
                out[i, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
            # A constant component keeps empty or all-punctuation texts from being zero
            # vectors (the index rejects those); it is small so it barely moves real cosines.
            out[i, 0] += 0.05
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out


class LookupEmbedder:
    """An embedder that returns vectors computed beforehand for known texts.

    The eval embeds every question once, in batches; a store opened with this embedder can
    then be searched with the question *text* (which hybrid search needs for its lexical
    half) without embedding it again. ``fallback`` (an embedder) handles other texts, such as
    the SLM organiser's topic labels; without one an unknown text is a ValueError.
    """

    def __init__(self, texts: Sequence[str], vectors: np.ndarray, fallback: Any = None) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(f"LookupEmbedder needs one vector per text, got {vectors.shape} for {len(texts)} texts")
        self.dim = int(vectors.shape[1])
        self._vecs = {t: vectors[i] for i, t in enumerate(texts)}
        self._fallback = fallback

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [n, dim]: the stored vector of each text (or the fallback's)."""
        missing = [t for t in texts if t not in self._vecs]
        if missing and self._fallback is None:
            raise ValueError(f"LookupEmbedder: no vector for {missing[0]!r}")
        extra = dict(zip(missing, np.asarray(self._fallback.encode(missing), np.float32))) if missing else {}
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            out[i] = self._vecs[t] if t in self._vecs else extra[t]
        return out


def make_embedder(spec: Any, precision: str, threads: int | None) -> tuple[Any, str]:
    """An embedder object and a name for the report (and the embedding cache key)."""
    if spec == "hash":
        return HashingEmbedder(), "hash-384"
    if spec == "minilm":
        from clag_fast.embed.embedder import Embedder

        emb = Embedder(precision=precision, threads=threads)
        return emb, f"minilm-l6-{emb.precision}"  # "auto" resolved: the cache key names what ran
    if hasattr(spec, "encode") and hasattr(spec, "dim"):
        return spec, type(spec).__name__
    raise ValueError(f"embedder must be 'minilm', 'hash' or an object with encode() and dim, got {spec!r}")


def embed_texts(embedder: Any, texts: list[str], name: str, cache_dir: Path | None, batch: int = 256,
                progress: bool = True, desc: str = "embed") -> np.ndarray:
    """Embed ``texts`` in batches (one progress tick per batch), optionally cached on disk.

    The cache key is a sha256 of the embedder name and every text, so a changed dataset or
    model never reuses stale vectors.
    """
    path = None
    if cache_dir is not None:
        h = hashlib.sha256(name.encode())
        for t in texts:
            h.update(b"\0" + t.encode("utf-8"))
        path = cache_dir / f"emb-{h.hexdigest()[:24]}.npy"
        if path.exists():
            vecs = np.load(path)
            if vecs.shape[0] == len(texts):
                return vecs
    from tqdm import tqdm

    parts = []
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, leave=False) as bar:
        for i in range(0, len(texts), batch):
            chunk = texts[i : i + batch]
            parts.append(np.asarray(embedder.encode(chunk), dtype=np.float32))
            bar.update(len(chunk))
    vecs = np.concatenate(parts) if parts else np.zeros((0, embedder.dim), np.float32)
    if path is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vecs)
        os.replace(tmp, path)
    return vecs
