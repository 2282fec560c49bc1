"""Export and import of a large store: ``MemoryStore.export`` / ``import_`` in JSONL and
Parquet, memories per second each way, and an exact round trip.

The source store: N memories of blob vectors (dim 384, ``bench_ingest.Vectors``), short texts,
metadata on every memory ({"i": i, "even": bool}), a key on every other one, no embedder;
loaded with ``add_many(defer_organize=True)`` in calls of ``--batch``, then
``organize_deferred()``. Then, each timed on its own (wall clock, the whole call):

* export to ``src.jsonl`` and to ``src.parquet``;
* import of each into a fresh store (``embedder=False``; an empty store keeps ids, clusters
  keep their exported ids).

Exactness: each imported store is exported to JSONL again, and every line after the header
(clusters with their profiles, then memories: ids, keys, namespaces, kinds, texts, metadata,
times, counts, strength, base64 vectors bit for bit, soft assignments) must equal the source
export's, compared by SHA-256 of the bytes. The run fails otherwise.

Script mode only: ``python benches/bench_transfer.py [--n 1000000] [--batch 10000]
[--dir DIR] [--keep]``. Files and stores go to a temporary directory under ``--dir``
(default: the system's), removed at the end unless ``--keep``. Native core: the release build.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import measure  # noqa: E402
from bench_ingest import Vectors  # noqa: E402

from clag_fast import MemoryStore, StoreConfig  # noqa: E402

CONFIG = StoreConfig(slm="off")


def build(path: Path, n: int, batch: int) -> float:
    """The source store; returns its load time (add_many calls and the owed organisation)."""
    vecs = Vectors("blobs")
    t = 0.0
    with MemoryStore.open(path, config=CONFIG, embedder=False, slm=False) as s:
        for start in range(0, n, batch):
            m = min(batch, n - start)
            v = vecs.chunk(start, m)
            ids = range(start, start + m)
            texts = [f"memory {i}" for i in ids]
            meta = [{"i": i, "even": i % 2 == 0} for i in ids]
            keys = [f"k{i}" if i % 2 else None for i in ids]
            t0 = time.perf_counter()
            s.add_many(texts, embeddings=v, metadata=meta, keys=keys, namespace=f"ns{start // batch % 4}",
                       defer_organize=True)
            t += time.perf_counter() - t0
        t0 = time.perf_counter()
        s.organize_deferred()
        t += time.perf_counter() - t0
    return t


def timed(fn) -> tuple[float, float, float, float]:
    """(wall seconds, this process's CPU seconds, steal cores, busy cores of the whole
    machine) of ``fn()``. The CPU seconds tell this process's work from the machine's load:
    on a shared machine the wall time also holds the time other processes had the cores."""
    m = measure.cpu_times()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0, measure.cores(m), measure.cores(m, "busy")


def export(store: Path, out: Path) -> None:
    with MemoryStore.open(store, config=CONFIG, embedder=False, slm=False) as s:
        s.export(out)


def import_(store: Path, src: Path) -> None:
    with MemoryStore.open(store, config=CONFIG, embedder=False, slm=False) as s:
        report = s.import_(src)
    if report["imported"] != report["read"]:
        raise SystemExit(f"{src}: imported {report['imported']} of {report['read']}")


def body_digest(path: Path) -> str:
    """SHA-256 of a JSONL export after its header line (which names the store and the time)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.readline()
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--dir", default=None, help="where the stores and files go (a temporary directory inside)")
    p.add_argument("--keep", action="store_true", help="leave the stores and files")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="clag_transfer_", dir=args.dir))
    rows = []
    try:
        src = root / "src"
        load_s = build(src, args.n, args.batch)
        print(f"source: {args.n:,} memories loaded in {load_s:.1f} s (load {measure.load_avg()})", flush=True)
        for fmt in ("jsonl", "parquet"):
            out = root / f"src.{fmt}"
            sec, cpu, steal, busy = timed(lambda: export(src, out))
            rows.append(("export", fmt, sec, cpu, steal, busy))
            print(f"export {fmt}: {args.n / sec:,.0f} memories/s ({sec:.1f} s, {cpu:.1f} CPU s, "
                  f"{out.stat().st_size / 2**20:,.0f} MiB)", flush=True)
        want = body_digest(root / "src.jsonl")
        for fmt in ("jsonl", "parquet"):
            dst = root / f"dst_{fmt}"
            sec, cpu, steal, busy = timed(lambda: import_(dst, root / f"src.{fmt}"))
            rows.append(("import", fmt, sec, cpu, steal, busy))
            print(f"import {fmt}: {args.n / sec:,.0f} memories/s ({sec:.1f} s, {cpu:.1f} CPU s)", flush=True)
            back = root / f"back_{fmt}.jsonl"
            export(dst, back)
            same = body_digest(back) == want
            print(f"  round trip via {fmt}: {'exact' if same else 'DIFFERS'} (re-export of the imported store "
                  "against the source's, every line after the header)", flush=True)
            if not same:
                raise SystemExit(f"round trip via {fmt} differs")
            back.unlink()
            shutil.rmtree(dst)
        info = measure.machine()
        print(f"\n{args.n:,} memories, dim 384, {os.cpu_count()} cores ({info.get('cpu', '?')}), load {measure.load_avg()}")
        print(f"{'way':<7} {'format':<8} {'memories/s':>11} {'seconds':>8} {'CPU s':>6} {'per CPU s':>10} "
              f"{'machine busy':>13} {'steal':>6}")
        for way, fmt, sec, cpu, steal, busy in rows:
            print(f"{way:<7} {fmt:<8} {args.n / sec:>11,.0f} {sec:>8.1f} {cpu:>6.1f} {args.n / cpu:>10,.0f} "
                  f"{busy:>8.2f} cores {steal:>6.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
