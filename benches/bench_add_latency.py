"""Latency of single ``add(text)`` calls with the SLM in use: background worker (the default)
against SLM work inside ``add()`` (``SLMConfig(background=False)``), in one run.

Each variant gets a fresh store opened the way a user opens one, ``MemoryStore.open(d)``:
the managed SmolLM2 llama.cpp server, the default config, the real ONNX MiniLM embedder.
The store is first filled with ``--prefill`` LoCoMo turns (``add_many``, then ``flush()``,
so the cold-start clustering and its SLM profiles are done and not timed); then ``--n``
further turns are added one by one with ``add(text)`` (embedding included) and each call is
timed; finally the ``flush()`` that waits for the queued SLM work is timed. A vector-only
store (``slm=False``) is measured too, as the floor the SLM variants cannot beat.

Target: p99 <= 50 ms for the default. The first run builds the ONNX model and converts
the GGUF (a few minutes); later runs find them cached.

    python benches/bench_add_latency.py [--n 300] [--prefill 150] [--data PATH]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from clag_fast import MemoryStore, SLMConfig, StoreConfig

# LoCoMo's locomo10.json (github.com/snap-research/locomo, data/): $CLAG_LOCOMO, else beside the checkout.
LOCOMO = Path(os.environ.get("CLAG_LOCOMO") or Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")


def locomo_turns(path: Path, n: int) -> list[str]:
    """The first ``n`` dialogue turns of LoCoMo, conversation after conversation."""
    data = json.loads(path.read_text())
    turns: list[str] = []
    for sample in data:
        conv = sample["conversation"]
        sessions = sorted((k for k, v in conv.items() if k.startswith("session_") and isinstance(v, list)),
                          key=lambda k: int(k.split("_")[1]))
        for key in sessions:
            turns += [f"{t['speaker']}: {t['text']}" for t in conv[key]]
            if len(turns) >= n:
                return turns[:n]
    if len(turns) < n:
        raise SystemExit(f"{path} holds {len(turns)} turns, {n} needed")
    return turns


def progress(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_variant(name: str, prefill: list[str], timed: list[str], **open_kw) -> dict:
    with tempfile.TemporaryDirectory(prefix="clag-add-") as d:
        t0 = time.perf_counter()
        store = MemoryStore.open(Path(d) / "s", **open_kw)
        try:
            store.add_many(prefill)
            progress(f"prefilled {len(prefill)}; flushing (cold start + profiles)")
            store.flush()  # cold start + its SLM profiles: not part of the timed adds
            setup_s = time.perf_counter() - t0
            progress(f"setup {setup_s:.1f} s; timing {len(timed)} adds")
            lat = np.empty(len(timed))
            for i, text in enumerate(timed):
                t = time.perf_counter()
                store.add(text)
                lat[i] = time.perf_counter() - t
                if (i + 1) % 50 == 0:
                    progress(f"{i + 1} adds, last 50: max {lat[i - 49:i + 1].max() * 1000:.0f} ms, "
                             f"pending {store.stats()['slm_pending']}")
            pending = store.stats()["slm_pending"]
            progress(f"adds done; flushing (pending {pending})")
            t = time.perf_counter()
            store.flush()
            flush_s = time.perf_counter() - t
            st = store.stats()
        finally:
            t = time.perf_counter()
            store.close()
            close_s = time.perf_counter() - t
    ms = lat * 1000.0
    return {
        "variant": name,
        "p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)), "max": float(ms.max()), "mean": float(ms.mean()),
        "flush_s": flush_s, "close_s": close_s, "setup_s": setup_s,
        "pending_before_flush": pending, "slm_calls": st["slm_usage"].get("calls", 0),
        "memories": st["memories"], "clusters": st["clusters"], "slm": st["slm"],
        "slow_adds": int((ms > 50.0).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="timed single adds")
    ap.add_argument("--prefill", type=int, default=150, help="memories in the store before timing")
    ap.add_argument("--data", type=Path, default=LOCOMO)
    ap.add_argument("--skip-vector-only", action="store_true")
    args = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack on stderr

    turns = locomo_turns(args.data, args.prefill + args.n)
    prefill, timed = turns[: args.prefill], turns[args.prefill:]

    # Build / load the ONNX model and the served GGUF before anything is timed.
    from clag_fast.embed.embedder import Embedder
    from clag_fast.slm.server import serving_gguf_path

    Embedder().encode(["warm up"])
    serving_gguf_path()

    variants = [("default (background)", {}),
                ("background=False", {"config": StoreConfig(slm=SLMConfig(background=False))})]
    if not args.skip_vector_only:
        variants.append(("vector-only (slm=False)", {"slm": False}))
    rows = []
    for name, kw in variants:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows.append(run_variant(name, prefill, timed, **kw))

    print(f"\nadd(text) latency, {args.n} single adds of LoCoMo turns into a store of {args.prefill}, "
          f"ONNX MiniLM embedding included")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    cols = [r["variant"] for r in rows]
    width = max(len(c) for c in cols) + 2
    print(f"{'':<24}" + "".join(f"{c:>{width}}" for c in cols))
    for key, label, fmt in [("p50", "p50 ms", "{:.1f}"), ("p90", "p90 ms", "{:.1f}"), ("p99", "p99 ms", "{:.1f}"),
                            ("max", "max ms", "{:.1f}"), ("mean", "mean ms", "{:.1f}"),
                            ("slow_adds", "adds > 50 ms", "{}"),
                            ("flush_s", "flush() after, s", "{:.2f}"), ("close_s", "close() after, s", "{:.2f}"),
                            ("slm_calls", "SLM calls (total)", "{}"), ("clusters", "clusters at end", "{}")]:
        print(f"{label:<24}" + "".join(f"{fmt.format(r[key]):>{width}}" for r in rows))
    for r in rows:
        print(f"{r['variant']}: pending before flush {r['pending_before_flush']}; slm: {r['slm']}")
    default = rows[0]
    verdict = "meets" if default["p99"] <= 50.0 else "MISSES"
    print(f"\ndefault p99 {default['p99']:.1f} ms {verdict} the 50 ms target")


if __name__ == "__main__":
    main()
