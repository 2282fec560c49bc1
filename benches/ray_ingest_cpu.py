"""Where a Ray Data bulk ingest's CPU goes: every process's CPU time from /proc, beside one
process embedding the same texts before and after (the machine's speed drifts).

    python benches/ray_ingest_cpu.py --texts 30000 [--lean]

Prints the ingest rate, the CPU of each process that used any (with when it appeared after
``ingest()`` was called), a cumulative trace every 10 s for the busiest, and the ratio to the
single process's embedding rate. ``--lean`` starts Ray with metrics collection and event
statistics off. The machine's steal (cores the hypervisor gave to others) is printed with
each timed part. Results: BENCHMARKS.md, sixteenth and seventeenth sessions.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ray import embed_alone  # noqa: E402
from bench_service import sentence  # noqa: E402
from measure import cores, cpu_times, process_cpu  # noqa: E402


def name_of(pid: int) -> str:
    """A process's command line (Ray sets ``ray::<Actor>`` there), or its short name."""
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            cmd = f.read().replace("\0", " ").strip()
        if cmd:
            return cmd
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def single(texts: list[str]) -> tuple[float, float, float]:
    """(texts/s, ms of CPU per text, cores stolen by the hypervisor meanwhile) of one process
    embedding ``texts`` on 2 threads, model warm."""
    m0 = cpu_times()
    _, seconds, cpu, _ = embed_alone(texts, 2)
    return len(texts) / seconds, cpu / len(texts) * 1e3, cores(m0)


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
        before = single(texts)
        print(f"one process: {before[0]:.0f} texts/s, {before[1]:.2f} ms CPU/text, steal {before[2]:.2f} cores",
              flush=True)
        extra = {"_system_config": {"enable_metrics_collection": False, "event_stats": False}} if args.lean else {}
        ray.init(num_cpus=2, include_dashboard=False, namespace="clag_fast", log_to_driver=False, **extra)
        time.sleep(2)  # the cluster's own start is not the ingest's
        # CPU of every process before, and as last seen (a process that exits keeps its last
        # reading). Names are read every 10 s, not on every sample: a Ray worker is renamed
        # when it takes a task (ray::IDLE -> ray::<Actor>), so the last name read is kept.
        start = {pid: cpu for pid, (_, cpu) in process_cpu().items()}
        last, names, first_seen, trace, stop = dict(start), {}, {}, [], threading.Event()

        def sample() -> None:
            k = 0
            while not stop.is_set():
                now = time.perf_counter()
                seen = process_cpu()
                for pid, (_, cpu) in seen.items():
                    last[pid] = cpu
                    if pid not in start:
                        first_seen.setdefault(pid, now)
                if k % 20 == 0:
                    names.update((pid, name_of(pid)) for pid in seen)
                    trace.append((now, dict(last)))
                k += 1
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        t0 = time.perf_counter()  # before the sampler's first reading, so every time is >= 0
        sampler.start()
        machine0 = cpu_times()
        report = ingest(str(src), tmp / "root", shards=4, namespace="bulk", embedders=1, embed_threads=2)
        wall = time.perf_counter() - t0
        machine = {k: cores(machine0, k) for k in ("busy", "idle", "steal")}
        stop.set()
        sampler.join()
        final = process_cpu()
        last.update((pid, cpu) for pid, (_, cpu) in final.items())
        names.update((pid, name_of(pid)) for pid in final)
        used = sorted(((cpu - start.get(pid, 0.0), pid) for pid, cpu in last.items()
                       if cpu - start.get(pid, 0.0) > 0.05), reverse=True)
        total = sum(u[0] for u in used)
        print(f"Ray Data ingest: {report.rate:.0f} texts/s, {wall:.1f} s, every process {total:.1f} s of CPU "
              f"({total / wall:.2f} cores; the sampler's own CPU is in this process's)")
        print("  the machine meanwhile: " + ", ".join(f"{k} {v:.2f} cores" for k, v in machine.items()))
        for cpu, pid in used[:16]:
            print(f"  {cpu:7.1f} s  appeared at +{first_seen.get(pid, t0) - t0:5.1f} s  "
                  f"{names.get(pid, '?'):.70}")
        top = used[:8]
        print("  cumulative CPU every 10 s: " + ", ".join(names.get(pid, "?").split()[0][:28] for _, pid in top))
        for t, seen in trace:
            print(f"    +{t - t0:5.1f} s " + " ".join(f"{seen.get(pid, 0.0) - start.get(pid, 0.0):6.1f}"
                                              for _, pid in top))
        ray.shutdown()
        after = single(texts)
        print(f"one process again: {after[0]:.0f} texts/s, {after[1]:.2f} ms CPU/text, steal {after[2]:.2f} cores; "
              f"ratio {report.rate / ((before[0] + after[0]) / 2):.2f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
