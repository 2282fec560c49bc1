"""Cost of the lexical index and of hybrid search at 100k and 1M memories (synthetic texts).

Part 1, the candidates for the lexical index, side by side in one process:
- ``rust``: the native postings (``clag_fast._clag_fast.Lexical``, what the store uses):
  add in batches of 10,000; query = BM25 of every matching row then the top 50 (the
  exhaustive ``score``), and ``rust_maxscore`` = the top 50 by MaxScore (``score_top``,
  what search uses); the open-time rebuild = reading the texts back from SQLite + indexing.
- ``fts5``: an SQLite FTS5 table (unicode61 tokenizer) in the store database, filled in
  transactions of 10,000 (as ``add_many`` would, in the metadata's transaction); query =
  the words quoted and OR'ed, ``ORDER BY bm25(fts) LIMIT 50``.
Part 2, through ``MemoryStore`` (``--store``), each step in a child process: build a store of
n memories (``add_many`` rate with the lexical feed on vs patched off over the first
``--n-rate``, alternate batches into two stores; organise; close), then open it read-only
(time; with ``index/lexical.bin`` and with it moved aside = the rebuild) and search the same
text queries, ``k=10``, modes interleaved query by query in rotating order: vectors only (``lexical_weight=0``)
and hybrid (the default), two-stage and flat. ``--before DIR`` runs the same add-rate and
open/search steps with another build's ``python/`` directory first on ``PYTHONPATH`` (a
worktree of another commit), on the same store, in the same run.

Texts: 8-30 words, half from one of 1,000 topics' own words, half from a Zipf(1.1)
vocabulary of 50,000 words; vectors: unit rows around the topic's centre. Queries: five
words of a stored text plus two common words, the vector of that text plus noise.

    .venv/bin/python benches/bench_hybrid.py --n 100000 --store --before /tmp/clag_before/python
    .venv/bin/python benches/bench_hybrid.py --n 1000000 --store --no-candidates \
        --before /tmp/clag_before/python --queries 200 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from clag_fast import _clag_fast as native

VOCAB = 50_000
TOPICS = 1_000
DIM = 384
BATCH = 10_000
POOL = 50


def _words(n: int) -> list[str]:
    rng = np.random.default_rng(1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, rng.integers(3, 10))) for _ in range(n)]


class Synthetic:
    """Deterministic texts and vectors in chunks (chunk i is the same at any n)."""

    def __init__(self) -> None:
        self.vocab = np.array(_words(VOCAB))
        ranks = np.arange(1, VOCAB + 1)
        p = 1.0 / ranks ** 1.1
        self.p = p / p.sum()
        rng = np.random.default_rng(2)
        c = rng.standard_normal((TOPICS, DIM)).astype(np.float32)
        self.centres = c / np.linalg.norm(c, axis=1, keepdims=True)

    def chunk(self, i: int, n: int) -> tuple[list[str], np.ndarray, np.ndarray]:
        rng = np.random.default_rng(100 + i)
        topics = rng.integers(0, TOPICS, n)
        lens = rng.integers(8, 31, n)
        glob = rng.choice(VOCAB, size=int(lens.sum()), p=self.p)
        own = (topics.repeat(lens) * 37 + rng.integers(0, 40, int(lens.sum()))) % VOCAB
        pick = np.where(rng.random(int(lens.sum())) < 0.5, glob, own)
        words = self.vocab[pick]
        cuts = np.cumsum(lens)[:-1]
        texts = [" ".join(w) for w in np.split(words, cuts)]
        v = self.centres[topics] + 0.08 * rng.standard_normal((n, DIM)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return texts, v.astype(np.float32), topics

    def queries(self, texts: list[str], vecs: np.ndarray, nq: int) -> tuple[list[str], np.ndarray]:
        rng = np.random.default_rng(9)
        idx = rng.choice(len(texts), nq, replace=False)
        qs = []
        for i in idx:
            w = texts[i].split()
            qs.append(" ".join(list(rng.choice(w, min(5, len(w)), replace=False)) + list(self.vocab[[0, 5]])))
        qv = vecs[idx] + 0.05 * rng.standard_normal((nq, DIM)).astype(np.float32)
        return qs, (qv / np.linalg.norm(qv, axis=1, keepdims=True)).astype(np.float32)


def _fts_query(q: str) -> str:
    # Every word quoted: nothing in user text becomes an FTS5 operator.
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in native.tokenize(q))


def candidates(n: int, syn: Synthetic, nq: int) -> dict:
    out: dict = {"n": n}
    lex = native.Lexical()
    tmp = tempfile.mkdtemp(prefix="clag-bench-lex-")
    db = sqlite3.connect(Path(tmp) / "m.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE memories (id INTEGER PRIMARY KEY, text TEXT NOT NULL)")
    db.execute("CREATE VIRTUAL TABLE fts USING fts5(text, content='', tokenize='unicode61')")
    t_rust = t_fts = t_meta = 0.0
    sample_t: list[str] = []
    sample_v = []
    for c in range(0, n, BATCH):
        texts, vecs, _ = syn.chunk(c // BATCH, min(BATCH, n - c))
        ids = list(range(c, c + len(texts)))
        t0 = time.perf_counter()
        db.execute("BEGIN")
        db.executemany("INSERT INTO memories (id, text) VALUES (?, ?)", zip(ids, texts))
        db.execute("COMMIT")
        t1 = time.perf_counter()
        db.execute("BEGIN")
        db.executemany("INSERT INTO fts (rowid, text) VALUES (?, ?)", zip(ids, texts))
        db.execute("COMMIT")
        t2 = time.perf_counter()
        lex.add(ids, texts)
        t3 = time.perf_counter()
        t_meta += t1 - t0
        t_fts += t2 - t1
        t_rust += t3 - t2
        if c == 0:
            sample_t, sample_v = texts, vecs
    out["ingest_per_s"] = {"rust": n / t_rust, "fts5": n / t_fts, "sqlite_row_only": n / t_meta}
    qs, _ = syn.queries(sample_t, sample_v, nq)
    lat: dict[str, list[float]] = {"rust": [], "rust_maxscore": [], "fts5": []}
    none = np.zeros(0, np.int64)
    sql = "SELECT rowid, bm25(fts) FROM fts WHERE fts MATCH ? ORDER BY bm25(fts) LIMIT 50"
    for q in qs:  # interleaved
        t0 = time.perf_counter()
        rows, scores, _, _ = lex.score(q)
        top = rows[np.argpartition(-scores, POOL - 1)[:POOL]] if len(rows) > POOL else rows
        t1 = time.perf_counter()
        lex.score_top(q, None, None, POOL, none)
        t2 = time.perf_counter()
        db.execute(sql, (_fts_query(q),)).fetchall()
        t3 = time.perf_counter()
        lat["rust"].append(t1 - t0)
        lat["rust_maxscore"].append(t2 - t1)
        lat["fts5"].append(t3 - t2)
        del top
    out["query_ms"] = {k: {"p50": 1e3 * float(np.median(v)), "p99": 1e3 * float(np.percentile(v, 99))}
                       for k, v in lat.items()}
    out["matches_per_query"] = float(np.median([len(lex.score(q)[0]) for q in qs[:50]]))
    out["maxscore_scored_per_query"] = float(np.median([lex.score_top(q, None, None, POOL, none)[5] for q in qs[:50]]))
    t0 = time.perf_counter()
    pairs = db.execute("SELECT id, text FROM memories").fetchall()
    t1 = time.perf_counter()
    lex2 = native.Lexical()
    for i in range(0, len(pairs), 50_000):
        ch = pairs[i:i + 50_000]
        lex2.add([r for r, _ in ch], [t for _, t in ch])
    t2 = time.perf_counter()
    out["rust_rebuild_s"] = {"read_texts": t1 - t0, "index": t2 - t1}
    out["rust_terms_postings"] = list(lex.sizes())
    db.close()
    size = sum(p.stat().st_size for p in Path(tmp).iterdir())
    out["db_bytes_with_fts5"] = size
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return out


class TableEmbedder:
    def __init__(self, texts: list[str], vecs: np.ndarray) -> None:
        self.table = dict(zip(texts, vecs))
        self.dim = DIM

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


CFG = dict(slm="off", cache_size=0)


def _open(path, **kw):
    """``MemoryStore.open`` without an SLM, spelled for the build under test: ``--before`` may
    name a build that predates the ``slm=`` spelling."""
    from clag_fast import MemoryStore

    try:
        return MemoryStore.open(path, slm=False, **kw)
    except TypeError as e:
        if "slm" not in str(e):
            raise
        return MemoryStore.open(path, llm=False, **kw)


def build_store(path: Path, n: int, syn: Synthetic, n_rate: int) -> dict:
    """Fill store ``path`` with n memories through ``add_many`` (batches of 10,000); over the
    first ``n_rate`` memories a second store with the lexical feed patched off (the
    vector-only baseline, bench only) gets the same batches, alternating. Then organise."""
    from clag_fast import MemoryStore, StoreConfig

    out: dict = {"n": n}
    cfg = StoreConfig(**CFG)
    a = _open(path, config=cfg, embedder=False)
    b = _open(path.with_name(path.name + "-vec"), config=cfg, embedder=False)
    b._searcher.lexical.add = lambda *args: None  # noqa: SLF001 -- the vector-only baseline
    ta = tb = 0.0
    for c in range(0, n, BATCH):
        texts, vecs, _ = syn.chunk(c // BATCH, min(BATCH, n - c))
        t0 = time.perf_counter()
        a.add_many(texts, embeddings=vecs)
        t1 = time.perf_counter()
        ta += t1 - t0
        if c < n_rate:
            b.add_many(texts, embeddings=vecs)
            tb += time.perf_counter() - t1
            if c + BATCH >= n_rate:
                out["add_many_per_s_first"] = {"n": c + len(texts), "lexical": (c + len(texts)) / ta,
                                               "vector_only": (c + len(texts)) / tb}
                b.close()
    out["add_many_per_s_all"] = n / ta
    t0 = time.perf_counter()
    a.organize()
    out["organize_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    a.close()
    out["close_s"] = time.perf_counter() - t0
    lex = path / "index" / "lexical.bin"
    out["lexical_bin_bytes"] = lex.stat().st_size if lex.exists() else 0
    return out


def measure_store(path: Path, syn: Synthetic, nq: int, rounds: int, rebuild_open: bool) -> dict:
    """Open time, then search p50/p99 per mode, the modes interleaved query by query."""
    from clag_fast import MemoryStore, StoreConfig

    out: dict = {}
    cfg = StoreConfig(**CFG)
    sample = syn.chunk(0, BATCH)
    qs, qv = syn.queries(sample[0], sample[1], nq)
    emb = TableEmbedder(qs, qv)
    lex = path / "index" / "lexical.bin"
    if rebuild_open and lex.exists():
        aside = lex.with_name("lexical.bin.bench-aside")
        lex.rename(aside)
        t0 = time.perf_counter()
        _open(path, config=cfg, embedder=emb, read_only=True).close()
        out["open_s_rebuild"] = time.perf_counter() - t0
        aside.rename(lex)
    t0 = time.perf_counter()
    a = _open(path, config=cfg, embedder=emb, read_only=True)
    out["open_s"] = time.perf_counter() - t0
    modes = (("vector_two_stage", 0.0, "two_stage"), ("hybrid_two_stage", None, "two_stage"),
             ("hybrid_flat", None, "flat"), ("vector_flat", 0.0, "flat"))
    lat: dict[str, list[float]] = {m[0]: [] for m in modes}
    scanned: dict[str, list[float]] = {m[0]: [] for m in modes}
    for r in range(rounds):
        for i, q in enumerate(qs):
            # The order rotates per query: the mode run right after another on the same query
            # finds its rows in cache (running hybrid always second flattered it by ~15%).
            for name, lw, mode in modes[i % 4:] + modes[:i % 4]:
                if "flat" in name and r > 0:
                    continue  # flat is slow and steady: one round
                t0 = time.perf_counter()
                h = a.search(q, k=10, mode=mode, lexical_weight=lw)
                lat[name].append(time.perf_counter() - t0)
                scanned[name].append(h.scanned / h.candidates)
    out["search_ms_p50"] = {k: 1e3 * float(np.median(v)) for k, v in lat.items()}
    out["search_ms_p99"] = {k: 1e3 * float(np.percentile(v, 99)) for k, v in lat.items()}
    out["scanned_share"] = {k: float(np.mean(v)) for k, v in scanned.items()}
    p50 = out["search_ms_p50"]
    out["hybrid_over_vector_two_stage_p50"] = p50["hybrid_two_stage"] / p50["vector_two_stage"]
    a.close()
    return out


def _child(impl: str | None, argv: list[str]) -> dict:
    """Run this script's ``--child`` step with ``impl`` (a python/ directory holding another
    build of clag_fast, e.g. a worktree of another commit) first on the path."""
    import os
    import subprocess

    env = dict(os.environ)
    if impl:
        env["PYTHONPATH"] = impl + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, __file__, *argv], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"child {argv} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def through_store(n: int, nq: int, rounds: int, before: str | None, n_rate: int, keep: str | None,
                  turns: int = 1) -> dict:
    """Build the store with this build (and, with ``before``, a store with that build for its
    add rate over the first ``n_rate``), then open + search the same memories with each build,
    ``turns`` times in turns (before, after, before, ...). With ``before``, the measured store is
    built by that build, and this build measures a copy it opened writable once first: a
    newer schema is one the older build cannot open."""
    import shutil

    out: dict = {"n": n}
    tmp = keep or tempfile.mkdtemp(prefix="clag-bench-hyb-")
    path = Path(tmp) / f"store-{n}"
    common = ["--n", str(n), "--queries", str(nq), "--rounds", str(rounds), "--n-rate", str(n_rate)]
    if not (path / "memories.db").exists():
        out["build"] = _child(before, ["--child", "build", "--path", str(path), *common])
    paths = {"after": path}
    builds = {"after": None} if before is None else {"before": before, "after": None}
    if before is not None:
        bpath = Path(tmp) / f"store-before-{n_rate}"
        out["build_before"] = _child(before, ["--child", "build", "--path", str(bpath), *common, "--n", str(n_rate)])
        paths = {"before": path, "after": Path(tmp) / f"store-{n}-migrated"}
        if not (paths["after"] / "memories.db").exists():
            shutil.copytree(path, paths["after"])
            _child(None, ["--child", "migrate", "--path", str(paths["after"]), *common])
    for turn in range(turns):
        for name, impl in builds.items():
            key = f"measure_{name}" + (f"_{turn}" if turns > 1 else "")
            out[key] = _child(impl, ["--child", "measure", "--path", str(paths[name]), *common,
                                     *(["--rebuild-open"] if name == "after" and turn == 0 else [])])
    if keep is None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", action="store_true", help="also measure through MemoryStore")
    ap.add_argument("--no-candidates", action="store_true")
    ap.add_argument("--before", default=None, help="python/ dir of another build to compare")
    ap.add_argument("--n-rate", type=int, default=100_000, help="memories over which add rates are compared")
    ap.add_argument("--keep", default=None, help="directory for the stores (kept, reused by later runs)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--turns", type=int, default=1, help="measure each build this many times, in turns")
    ap.add_argument("--child", choices=["build", "measure", "migrate"], help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--rebuild-open", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    syn = Synthetic()
    if args.child == "build":
        print(json.dumps(build_store(Path(args.path), args.n, syn, min(args.n_rate, args.n))))
        return 0
    if args.child == "measure":
        print(json.dumps(measure_store(Path(args.path), syn, args.queries, args.rounds, args.rebuild_open)))
        return 0
    if args.child == "migrate":  # one writable open brings a store to this build's schema
        from clag_fast import MemoryStore, StoreConfig

        _open(Path(args.path), config=StoreConfig(**CFG), embedder=False).close()
        print(json.dumps({}))
        return 0
    res: dict = {}
    if not args.no_candidates:
        res["candidates"] = candidates(args.n, syn, args.queries)
        print(json.dumps(res["candidates"], indent=1), flush=True)
    if args.store:
        res["store"] = through_store(args.n, args.queries, args.rounds, args.before, min(args.n_rate, args.n),
                                     args.keep, args.turns)
        print(json.dumps(res["store"], indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
