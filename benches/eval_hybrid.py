"""Hybrid (lexical + vector) retrieval: choosing the fusion by cross-validation.

Tune on LoCoMo conversations 1-5, report on conversations 6-10 (held out) and on a second
dataset of another style, built here from the standard library's docstrings. The flat grid
scores every fusion (``store.lexical.fuse``) and weight with the store's own BM25 (native
``Lexical``) and MiniLM vectors; ``--store`` then runs the chosen fusion through
``MemoryStore.search`` (flat and two-stage, recall against the share of memories scanned).

    .venv/bin/python benches/eval_hybrid.py --store --json /tmp/eval_hybrid.json

Datasets:

* LoCoMo (a path to locomo10.json): each turn stored as ``"Speaker: text"`` + photo caption,
  exactly as ``clag_fast.eval.runner`` stores it; questions with resolvable evidence.
* ``stdlib-docs``: a second dataset of a different style, built from the docstrings of the
  Python standard library this interpreter ships (nothing downloaded). Each function, class
  or method docstring with a body of at least 120 characters becomes one memory (the body:
  the docstring without its summary line); the summary line is the question and that body
  is its only evidence. Technical prose, long passages, identifiers: the opposite of chat.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# A fixed module list (importing every stdlib module has side effects: `this`, `antigravity`).
STDLIB_MODULES = (
    "abc argparse array ast asyncio base64 bisect bz2 calendar cmd codecs collections "
    "concurrent.futures configparser contextlib copy csv dataclasses datetime decimal difflib "
    "dis email email.message enum filecmp fileinput fnmatch fractions ftplib functools gettext "
    "glob gzip hashlib heapq hmac html html.parser http.client http.cookiejar http.server "
    "imaplib importlib inspect io ipaddress itertools json json.decoder logging logging.handlers "
    "lzma mailbox mimetypes multiprocessing numbers operator optparse os pathlib pdb pickle "
    "pkgutil platform plistlib poplib pprint profile pstats queue random re reprlib sched "
    "secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 ssl statistics "
    "string struct subprocess sysconfig tarfile tempfile textwrap threading timeit tokenize "
    "trace traceback types typing unittest unittest.mock urllib.parse urllib.request uuid "
    "warnings wave weakref xml.dom.minidom xml.etree.ElementTree xmlrpc.client zipfile zipimport"
).split()

MIN_BODY = 120


@dataclass
class RetrievalSet:
    """One pool of memories and its questions. ``evidence[i]`` holds memory indices."""

    name: str
    texts: list[str]
    questions: list[str]
    evidence: list[set[int]]


def locomo_sets(path: str | Path) -> list[RetrievalSet]:
    from clag_fast.locomo import load_dataset

    out = []
    for s in load_dataset(path):
        texts = [t.memory_text() for t in s.turns]
        pos = {t.dia_id: i for i, t in enumerate(s.turns)}
        qs, ev = [], []
        for q in s.qa:
            rel = {pos[e] for e in q.evidence if e in pos}
            if rel:
                qs.append(q.question)
                ev.append(rel)
        out.append(RetrievalSet(s.sample_id, texts, qs, ev))
    return out


def stdlib_docs_set() -> RetrievalSet:
    seen_docs: set[str] = set()
    seen_q: set[str] = set()
    texts, questions = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in STDLIB_MODULES:
            try:
                mod = importlib.import_module(modname)
            except Exception:
                continue
            objs = []
            for name, obj in sorted(vars(mod).items()):
                if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                    continue
                objs.append(obj)
                if inspect.isclass(obj):
                    objs += [m for n, m in sorted(vars(obj).items()) if not n.startswith("_") and callable(m)]
            for obj in objs:
                doc = inspect.getdoc(obj) if (inspect.isfunction(obj) or inspect.isclass(obj)) else getattr(obj, "__doc__", None)
                if not isinstance(doc, str):
                    continue
                doc = inspect.cleandoc(doc)
                head, _, body = doc.partition("\n")
                head, body = head.strip(), body.strip()
                if len(head) < 15 or len(body) < MIN_BODY or body in seen_docs or head in seen_q:
                    continue
                seen_docs.add(body)
                seen_q.add(head)
                texts.append(body)
                questions.append(head)
    return RetrievalSet("stdlib-docs", texts, questions, [{i} for i in range(len(texts))])


def embed(texts: list[str], cache_dir: Path, batch: int = 128) -> np.ndarray:
    """MiniLM (the store's default embedder, fp32) vectors, cached by a hash of the texts."""
    h = hashlib.sha256(b"minilm-fp32")
    for t in texts:
        h.update(b"\0" + t.encode())
    path = cache_dir / f"emb-{h.hexdigest()[:20]}.npy"
    if path.exists():
        return np.load(path)
    from clag_fast.embed.embedder import Embedder

    emb = Embedder(precision="fp32")
    vecs = np.concatenate([emb.encode(texts[i:i + batch]) for i in range(0, len(texts), batch)])
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.npy")
    np.save(tmp, vecs.astype(np.float32))
    os.replace(tmp, path)
    return vecs


# -- evaluation -----------------------------------------------------------------------------

METHODS = ("minmax", "zscore", "bound", "rrf")
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(1, 10))
POOL = 30  # == store.search.HYBRID_POOL


def _recall(ranked: np.ndarray, rel: set[int], k: int) -> float:
    return len(rel.intersection(ranked[:k].tolist())) / len(rel)


def flat_grid(rs: RetrievalSet, tv: np.ndarray, qv: np.ndarray) -> dict[tuple, np.ndarray]:
    """(method, weight) -> [questions, 2] Recall@10, @5 of flat fusion over the candidates;
    ("vector", 0) and ("bm25", 1) are the single retrievers, ("minmax-all", w) normalises
    over every memory (the brief's prototype)."""
    from clag_fast import _clag_fast as native
    from clag_fast.store.lexical import fuse

    lex = native.Lexical()
    lex.add(list(range(len(rs.texts))), rs.texts)
    cos_all = qv @ tv.T
    out: dict[tuple, list] = {}

    def put(key, ranked, rel):
        out.setdefault(key, []).append((_recall(ranked, rel, 10), _recall(ranked, rel, 5)))

    for qi, (q, rel) in enumerate(zip(rs.questions, rs.evidence)):
        cos = cos_all[qi]
        rows, scores, terms, maxp = lex.score(q)
        bm_all = np.zeros(len(rs.texts), np.float32)
        bm_all[rows] = scores
        vec_rank = np.argsort(-cos, kind="stable")
        put(("vector", 0.0), vec_rank, rel)
        put(("bm25", 1.0), np.argsort(-bm_all, kind="stable"), rel)
        if terms == 0:
            for m in METHODS + ("minmax-all",):
                for w in WEIGHTS:
                    put((m, w), vec_rank, rel)
            continue
        lex_top = rows[np.argsort(-scores, kind="stable")[:POOL]]
        cand = np.union1d(vec_rank[:POOL], lex_top)
        for m in METHODS:
            for w in WEIGHTS:
                f = fuse(cos[cand], bm_all[cand], w, m, maxp)
                put((m, w), cand[np.argsort(-f, kind="stable")], rel)
        for w in WEIGHTS:
            f = fuse(cos, bm_all, w, "minmax")
            put(("minmax-all", w), np.argsort(-f, kind="stable"), rel)
    return {k: np.asarray(v) for k, v in out.items()}


class LookupEmbedder:
    """Hands the store precomputed vectors for known texts (so the eval embeds once)."""

    def __init__(self, texts: list[str], vecs: np.ndarray) -> None:
        self.table = dict(zip(texts, vecs))
        self.dim = vecs.shape[1]

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def store_runs(rs: RetrievalSet, tv: np.ndarray, qv: np.ndarray, weight: float, fusion: str,
               probes: tuple) -> dict[str, np.ndarray]:
    """Through MemoryStore: config name -> [questions, 3] Recall@10, @5, scanned share."""
    import tempfile

    from clag_fast import MemoryStore, StoreConfig

    emb = LookupEmbedder(rs.texts + rs.questions, np.concatenate([tv, qv]))
    cfg = StoreConfig(slm="off", cache_size=0, lexical_weight=weight, lexical_fusion=fusion)
    out: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="clag-hybrid-") as tmp:
        store = MemoryStore.open(tmp, config=cfg, embedder=emb, slm=False)
        try:
            ids = store.add_many(rs.texts, embeddings=tv)
            store.organize()
            pos = {m: i for i, m in enumerate(ids)}
            for q, rel in zip(rs.questions, rs.evidence):
                for lw in (0.0, weight):
                    for mode, np_ in [("flat", None)] + [("two_stage", p) for p in probes]:
                        hits = store.search(q, k=10, mode=mode, n_probe=np_ or None, lexical_weight=lw)
                        ranked = np.asarray([pos[h.memory_id] for h in hits])
                        name = f"{'hybrid' if lw else 'vector'}/{mode}" + (f"@{np_ or 'auto'}" if mode != "flat" else "")
                        out.setdefault(name, []).append(
                            (_recall(ranked, rel, 10), _recall(ranked, rel, 5), hits.scanned / hits.candidates))
        finally:
            store.close()
    return {k: np.asarray(v) for k, v in out.items()}


def _mean(parts: list[dict], key) -> np.ndarray:
    return np.concatenate([p[key] for p in parts]).mean(axis=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locomo", default=os.environ.get("CLAG_LOCOMO") or str(Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json"),
                    help="LoCoMo's locomo10.json (default: $CLAG_LOCOMO)")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "clag-hybrid-cache"))
    ap.add_argument("--probes", default="0,4,8,16", help="two-stage n_probe values (0 = auto)")
    ap.add_argument("--store", action="store_true", help="also run the chosen fusion through MemoryStore")
    ap.add_argument("--fusion", default=None, help="method:weight for --store (default: the CV choice)")
    ap.add_argument("--json", default=None, help="write every number here")
    args = ap.parse_args(argv)
    cache = Path(args.cache)
    sets = locomo_sets(args.locomo)
    docs = stdlib_docs_set()
    emb = {rs.name: (embed(rs.texts, cache), embed(rs.questions, cache)) for rs in sets + [docs]}
    t0 = time.perf_counter()
    grids = {rs.name: flat_grid(rs, *emb[rs.name]) for rs in sets + [docs]}
    halves = {"tune": [grids[s.name] for s in sets[:5]], "held-out": [grids[s.name] for s in sets[5:]],
              "stdlib-docs": [grids[docs.name]]}
    keys = list(grids[docs.name])
    table = {h: {k: _mean(parts, k) for k in keys} for h, parts in halves.items()}
    base = {h: table[h][("vector", 0.0)][0] for h in halves}
    print(f"flat fusion grid ({time.perf_counter() - t0:.0f} s); Recall@10 (Recall@5); "
          f"questions: tune {sum(len(s.questions) for s in sets[:5])}, held-out "
          f"{sum(len(s.questions) for s in sets[5:])}, stdlib-docs {len(docs.questions)} ({len(docs.texts)} memories)")
    print(f"{'fusion':<18}" + "".join(f"{h:>22}" for h in halves))
    for k in keys:
        print(f"{k[0] + ' ' + str(k[1]):<18}" + "".join(
            f"{table[h][k][0]:>14.3f} ({table[h][k][1]:.3f})" for h in halves))
    # The choice: best tune Recall@10 among fusions that lose at most 1 point against vectors
    # on the tune half (the held-out half and the docstrings only report).
    cands = [k for k in keys if k[0] in METHODS]
    best = max(cands, key=lambda k: (round(table["tune"][k][0], 4), -k[1]))
    print(f"\nchosen on the tune half: {best[0]} w={best[1]}: " + ", ".join(
        f"{h} {table[h][best][0]:.3f} ({table[h][best][0] - base[h]:+.3f} vs vector)" for h in halves))
    robust = [k for k in cands if all(table[h][k][0] - base[h] >= -0.01 for h in halves)]
    best_r = max(robust, key=lambda k: (round(table["tune"][k][0], 4), -k[1])) if robust else None
    if best_r is not None:
        print(f"best on tune that loses <= 1 point on every set: {best_r[0]} w={best_r[1]}: " + ", ".join(
            f"{h} {table[h][best_r][0]:.3f} ({table[h][best_r][0] - base[h]:+.3f})" for h in halves))
    result: dict = {"flat": {h: {f"{k[0]}:{k[1]}": table[h][k].tolist() for k in keys} for h in halves},
                    "chosen": list(best), "robust": None if best_r is None else list(best_r)}
    if args.store:
        method, weight = (args.fusion.split(":") if args.fusion else (best_r or best))
        probes = tuple(int(p) for p in args.probes.split(","))
        t0 = time.perf_counter()
        runs = {rs.name: store_runs(rs, *emb[rs.name], float(weight), method, probes) for rs in sets + [docs]}
        sh = {"tune": [runs[s.name] for s in sets[:5]], "held-out": [runs[s.name] for s in sets[5:]],
              "stdlib-docs": [runs[docs.name]]}
        print(f"\nthrough MemoryStore ({method} w={weight}, {time.perf_counter() - t0:.0f} s): "
              "Recall@10 (Recall@5) [scanned share]")
        print(f"{'config':<26}" + "".join(f"{h:>26}" for h in sh))
        result["store"] = {}
        for name in runs[docs.name]:
            vals = {h: _mean(parts, name) for h, parts in sh.items()}
            result["store"][name] = {h: v.tolist() for h, v in vals.items()}
            print(f"{name:<26}" + "".join(f"{v[0]:>11.3f} ({v[1]:.3f}) [{v[2]:.1%}]" for v in vals.values()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
