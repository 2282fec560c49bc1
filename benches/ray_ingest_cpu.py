"""Where a Ray Data bulk ingest's CPU goes: every process's CPU time from /proc, beside one
process embedding the same texts before and after (the machine's speed drifts).

    python benches/ray_ingest_cpu.py --texts 30000 [--lean]

Prints the ingest rate, the CPU of each process that used any (with when it appeared after
``ingest()`` was called), a cumulative trace every 10 s for the busiest, and the ratio to the
single process's embedding rate. ``--lean`` starts Ray with metrics collection and event
statistics off. Results: BENCHMARKS.md, sixteenth session.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service import sentence  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def snapshot() -> dict[int, tuple[float, str]]:
    """pid -> (user + system CPU seconds, command line) for every process readable now."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
            cmd = open(f"/proc/{p}/cmdline").read().replace("\0", " ").strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[int(p)] = ((int(fields[11]) + int(fields[12])) / HZ, cmd or stat[stat.find("(") + 1:stat.rfind(")")])
    return out


def embed_alone(texts: list[str]) -> tuple[float, float]:
    """(texts/s, ms of CPU per text) of one process's Embedder on 2 threads, model warm."""
    from clag_fast.embed.embedder import Embedder

    e = Embedder(threads=2, device="cpu")
    e.encode(texts[:64])
    c0, t0 = time.process_time(), time.perf_counter()
    e.encode(texts)
    t1, c1 = time.perf_counter(), time.process_time()
    return len(texts) / (t1 - t0), (c1 - c0) / len(texts) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=30000)
    ap.add_argument("--lean", action="store_true", help="Ray metrics collection and event stats off")
    args = ap.parse_args()
    import ray

    from clag_fast.distributed import ingest

    rng = np.random.default_rng(3)
    texts = [f"{sentence(rng)} (note {i})" for i in range(args.texts)]
    tmp = Path(tempfile.mkdtemp(prefix="ray-ingest-cpu-"))
    src = tmp / "bulk.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    try:
        before = embed_alone(texts)
        print(f"one process: {before[0]:.0f} texts/s, {before[1]:.2f} ms CPU/text", flush=True)
        extra = {"_system_config": {"enable_metrics_collection": False, "event_stats": False}} if args.lean else {}
        ray.init(num_cpus=2, include_dashboard=False, namespace="clag_fast", log_to_driver=False, **extra)
        time.sleep(2)  # the cluster's own start is not the ingest's
        start = snapshot()
        last, first_seen, trace, stop = dict(start), {}, [], threading.Event()

        def sample() -> None:
            k = 0
            while not stop.is_set():
                for p, v in snapshot().items():
                    last[p] = v
                    if p not in start:
                        first_seen.setdefault(p, time.perf_counter())
                if k % 20 == 0:
                    trace.append((time.perf_counter(), dict(last)))
                k += 1
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        report = ingest(str(src), tmp / "root", shards=4, namespace="bulk", embedders=1, embed_threads=2)
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        last.update(snapshot())
        used = sorted(((cpu - start.get(p, (0.0, ""))[0], p, cmd) for p, (cpu, cmd) in last.items()
                       if cpu - start.get(p, (0.0, ""))[0] > 0.05), reverse=True)
        total = sum(u[0] for u in used)
        print(f"Ray Data ingest: {report.rate:.0f} texts/s, {wall:.1f} s, every process {total:.1f} s of CPU "
              f"({total / wall:.2f} cores)")
        for cpu, p, cmd in used[:16]:
            print(f"  {cpu:7.1f} s  appeared at +{first_seen.get(p, t0) - t0:5.1f} s  {cmd[:70]}")
        top = used[:8]
        print("  cumulative CPU every 10 s: " + ", ".join(c.split()[0][:28] for _, _, c in top))
        for t, snap in trace:
            print(f"    +{t - t0:5.1f} s " + " ".join(f"{snap.get(p, (0.0, ''))[0] - start.get(p, (0.0, ''))[0]:6.1f}"
                                              for _, p, _ in top))
        ray.shutdown()
        after = embed_alone(texts)
        print(f"one process again: {after[0]:.0f} texts/s, {after[1]:.2f} ms CPU/text; "
              f"ratio {report.rate / ((before[0] + after[0]) / 2):.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
