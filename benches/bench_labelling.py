"""Labelling inside ``add_many`` on data of several shapes: memories/s and the share of the
add time spent labelling, side by side in one run.

Every shape goes through the same path a bring-your-own-vectors user takes:
``MemoryStore.open(path, slm=False)`` (the default embedder, never asked: the vectors come from
elsewhere), then ``add_many(texts, embeddings=X)`` in calls of ``--batch`` with short texts
("note 17 about topic 3 number 5"), growing to ``--n`` memories. Timed: the ``add_many``
calls (vector routing, SQLite, the first labels of new clusters, the periodic organisations
and their label passes). The label share is ``stats()["timings_s"]["labels"]`` (first labels
and label passes) over that time; ``stats()["label_work"]`` says what the writes earned and
spent (``store.label_budget``). Vectors are generated outside the timed region, one call's
worth at a time. Shapes (dim 384):

* ``blobs``: around 1,000 random centres, cos(row, centre) ~ 0.7 (``bench_ingest.py``'s blobs);
* ``iso``: isotropic unit vectors (no structure: most rows open a cluster of their own);
* ``uneven``: 1,000 centres drawn with Zipf weights (a few topics hold most memories);
* ``few``: 20 centres;
* ``many``: 20,000 centres (most topics get one or two memories).

    python benches/bench_labelling.py [--n 5000] [--batch 100] [--shapes blobs,iso,uneven,few,many]

prints one row per shape and each shape's rate against the blob rate ("vs blobs"), after one
call of ``--batch`` memories in a store of its own, timed apart: a process's first labels read
the word lists once, and that cost would otherwise fall on the first shape. After the
load, the share of clusters still unlabelled (labels the budget left to later writes or an
explicit ``organize()``). Native core: the release build that ``maturin develop --release``
installs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402

from clag_fast import MemoryStore  # noqa: E402

DIM = 384
SHAPES = ("blobs", "iso", "uneven", "few", "many")
CENTRES = {"blobs": 1_000, "uneven": 1_000, "few": 20, "many": 20_000}


class Shape:
    """Deterministic unit vectors of one shape and their topic numbers, generated per call."""

    def __init__(self, name: str, seed: int = 0) -> None:
        if name not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}, got {name!r}")
        self.name, self.seed = name, seed
        rng = np.random.default_rng(seed)
        k = CENTRES.get(name, 1)
        c = rng.standard_normal((k, DIM), dtype=np.float32)
        self.centres = c / np.linalg.norm(c, axis=1, keepdims=True)
        w = 1.0 / np.arange(1, k + 1) ** 1.1 if name == "uneven" else np.ones(k)
        self.weights = w / w.sum()

    def chunk(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng((self.seed, start))
        x = rng.standard_normal((n, DIM), dtype=np.float32)
        if self.name == "iso":
            topic = rng.integers(0, 20, n)
        else:
            topic = rng.choice(len(self.centres), size=n, p=self.weights)
            x *= np.float32(1.0 / np.sqrt(DIM))
            x += self.centres[topic]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x, topic


def load(path: Path, shape: str, n: int, batch: int) -> dict:
    """Grow a store at ``path`` to ``n`` memories of ``shape``; what it cost and labelled."""
    data = Shape(shape)
    store = MemoryStore.open(path, slm=False)
    spent = 0.0
    try:
        for start in range(0, n, batch):
            m = min(batch, n - start)
            x, topic = data.chunk(start, m)
            texts = [f"note {start + i} about topic {t} number {(start + i) % 7}" for i, t in enumerate(topic.tolist())]
            t0 = time.perf_counter()
            store.add_many(texts, embeddings=x)
            spent += time.perf_counter() - t0
        st = store.stats()
        clusters = store.clusters()
        unlabelled = sum(not c.summary for c in clusters)
        return {"shape": shape, "n": n, "rate": n / spent, "seconds": spent, "labels_s": st["timings_s"]["labels"],
                "organize_s": st["timings_s"]["organize"], "passes": st["organizations"], "clusters": len(clusters),
                "unlabelled": unlabelled, "work": st["label_work"]}
    finally:
        store.close()


def table(rows: list[dict], batch: int) -> str:
    blob = next((r["rate"] for r in rows if r["shape"] == "blobs"), None)
    out = [f"add_many(embeddings=...) into a store growing to {rows[0]['n']:,} (calls of {batch:,}, "
           "MemoryStore.open(path, slm=False))", "",
           "| shape | memories/s | vs blobs | labelling share | organisations (s) | clusters | unlabelled | "
           "label work earned / spent |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        vs = f"{r['rate'] / blob:.2f}x" if blob else "-"
        out.append(f"| {r['shape']} | {r['rate']:,.0f} | {vs} | {r['labels_s'] / r['seconds']:.1%} | "
                   f"{r['passes']} ({r['organize_s']:.2f}) | {r['clusters']:,} | "
                   f"{r['unlabelled'] / max(1, r['clusters']):.0%} | "
                   f"{r['work']['earned']:,.0f} / {r['work']['spent']:,.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dir", default=None, help="store parent directory (default: a temp dir)")
    a = ap.parse_args()
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    if not shapes or any(s not in SHAPES for s in shapes):
        ap.error(f"--shapes takes some of {','.join(SHAPES)}, got {a.shapes!r}")
    info = measure.machine()
    print(", ".join(f"{k} {v}" for k, v in info.items()), f"| load before: {measure.load_avg()}", flush=True)
    # A process's first labels read the word lists (BENCHMARKS.md, "Labelling inside add_many"):
    # paid once per process, timed here on its own so it does not fall on whichever shape runs
    # first.
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        first = load(Path(tmp) / "s", "blobs", a.batch, a.batch)
    print(f"  a process's first add_many of {a.batch}: {first['seconds'] * 1e3:.0f} ms, "
          f"labelling {first['labels_s'] * 1e3:.0f} ms (once per process)", flush=True)
    rows = []
    for shape in shapes:
        with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
            rows.append(load(Path(tmp) / "s", shape, a.n, a.batch))
        r = rows[-1]
        print(f"  {shape}: {r['rate']:,.0f}/s, labelling {r['labels_s']:.2f} of {r['seconds']:.2f} s", flush=True)
    print(table(rows, a.batch))
    print(f"load after: {measure.load_avg()}")


def test_labelling_shapes(benchmark, tmp_path):
    """pytest-benchmark: the table at 5,000 memories (``pytest benches/bench_labelling.py
    --benchmark-enable -s``)."""
    counter = iter(range(1000))
    rows = benchmark.pedantic(lambda: [load(tmp_path / f"s{next(counter)}", s, 5_000, 100) for s in SHAPES],
                              rounds=1, iterations=1)
    print(table(rows, 100))
    assert all(r["rate"] > 0 for r in rows)


if __name__ == "__main__":
    main()
