"""Measurement helpers shared by the pytest-benchmark suite and the script mode.

Latency is per single query (one vector in, top-k out), wall clock via ``perf_counter_ns``.
Memory is the change of this process's resident set (VmRSS) across a build; for file-backed
indexes that includes the mapped pages they touched.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import dataclass, field

import numpy as np

# Rows collected during a run, printed as tables at the end (pytest) or on exit (script).
RESULTS: list[dict] = []


def threads() -> int:
    """Threads every engine may use (``CLAG_BENCH_THREADS``, default: all cores)."""
    return int(os.environ.get("CLAG_BENCH_THREADS", os.cpu_count() or 1))


def _status_mb(key: str) -> float:
    """A kB field of /proc/self/status (VmRSS, VmHWM, ...) in MiB; no psutil needed."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise OSError(f"{key} not found in /proc/self/status")


def rss_mb() -> float:
    """Resident set size of this process in MiB."""
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (VmHWM)."""
    return _status_mb("VmHWM")


def process_cpu() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used so far, user + system) of every live process, from
    /proc (one read of each process's stat file; processes that exit meanwhile are left out)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out


@dataclass
class Timed:
    """Result of a timed call: seconds, RSS delta in MiB, and what the call returned."""

    seconds: float
    rss_delta_mb: float
    value: object = None


def cpu_times() -> dict[str, float]:
    """The machine's CPU seconds so far, all cores together, by state (/proc/stat): ``busy``,
    ``idle`` and ``steal`` (time the hypervisor ran someone else while this VM wanted the
    core: it shows in no process's CPU, so a run that lost some looks idle)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    return {"busy": (v[0] + v[1] + v[2] + v[5] + v[6]) / tick, "idle": (v[3] + v[4]) / tick, "steal": v[7] / tick,
            "at": time.perf_counter()}


def cores(since: dict[str, float], state: str = "steal") -> float:
    """Cores spent in ``state`` on average since the ``cpu_times()`` reading ``since``."""
    now = cpu_times()
    return (now[state] - since[state]) / (now["at"] - since["at"])


def timed(fn, *args, **kwargs) -> Timed:
    """Run ``fn`` once, measuring wall time and the RSS change it leaves behind."""
    before = rss_mb()
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    seconds = time.perf_counter() - t0
    return Timed(seconds, rss_mb() - before, value)


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of the exact top-k found, over queries (order ignored, -1 never counts)."""
    k = truth.shape[1]
    hits = 0
    for f, t in zip(found, truth):
        hits += len(np.intersect1d(f[f >= 0], t, assume_unique=False))
    return hits / (k * len(truth))


@dataclass
class QueryRun:
    """Per-query latencies (seconds) and the ids each query returned."""

    latencies: np.ndarray
    ids: np.ndarray
    n_queries: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_queries = len(self.latencies)

    def p(self, q: float) -> float:
        """Latency percentile in milliseconds."""
        return float(np.percentile(self.latencies, q) * 1e3)


def time_queries(search, queries: np.ndarray, k: int, warmup: int = 10) -> QueryRun:
    """Call ``search(q) -> ids`` once per query row, timing each call on its own."""
    for q in queries[:warmup]:
        search(q)
    ids = np.full((len(queries), k), -1, dtype=np.int64)
    lat = np.empty(len(queries), dtype=np.float64)
    clock = time.perf_counter_ns
    for i, q in enumerate(queries):
        t0 = clock()
        found = search(q)
        lat[i] = (clock() - t0) * 1e-9
        ids[i, : len(found)] = found[:k]
    return QueryRun(lat, ids)


def machine() -> dict:
    """Where and with what the numbers were measured."""
    info = {"nproc": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        info["cpu"] = "?"
    for mod in ("faiss", "usearch"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = "absent"
    info["threads"] = threads()
    return info


def load_avg() -> str:
    """The 1/5/15-minute load averages, to judge how quiet the shared machine was."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def tables() -> str:
    """Markdown tables of everything in RESULTS, one block per kind of measurement."""
    out: list[str] = []
    search = [r for r in RESULTS if r["kind"] == "search"]
    if search:
        out += ["| dataset | engine | params | recall@10 | p50 ms | p99 ms | queries | vs numpy p50 | load |",
                "|---|---|---|---:|---:|---:|---:|---:|---|"]
        numpy_p50 = {r["dataset"]: r["p50_ms"] for r in search if r["engine"] == "numpy-brute"}
        for r in search:
            base = numpy_p50.get(r["dataset"])
            ratio = f"{base / r['p50_ms']:.0f}x" if base and r["p50_ms"] > 0 else "-"
            out.append(f"| {r['dataset']} | {r['engine']} | {r['params']} | {r['recall']:.3f} | "
                       f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['queries']} | {ratio} | {r['load']} |")
        out.append("")
    build = [r for r in RESULTS if r["kind"] == "build"]
    if build:
        out += ["| dataset | engine | build s | RSS delta MiB | breakdown | load |", "|---|---|---:|---:|---|---|"]
        for r in build:
            parts = ", ".join(f"{k} {v}" for k, v in r["detail"].items())
            out.append(f"| {r['dataset']} | {r['engine']} | {r['build_s']:.2f} | {r['rss_mb']:.0f} | {parts} | {r['load']} |")
        out.append("")
    assign = [r for r in RESULTS if r["kind"] == "assign"]
    if assign:
        out += ["| dataset | soft assignment (K=3) | rows | centres | seconds | rows/s | agrees with numpy | load |",
                "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in assign:
            out.append(f"| {r['dataset']} | {r['engine']} | {r['rows']} | {r['centres']} | {r['seconds']:.2f} | "
                       f"{r['rows_per_s']:,.0f} | {_fmt(r.get('agree'), '.4f')} | {r['load']} |")
        out.append("")
    opened = [r for r in RESULTS if r["kind"] == "open"]
    if opened:
        out += ["| dataset | open store: rows | median s | max s | RSS delta MiB | process RSS MiB | first query ms | runs |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in opened:
            out.append(f"| {r['dataset']} | {r['rows']} | {r['open_s']:.4f} | {r['open_s_max']:.4f} | "
                       f"{r['rss_delta_mb']:.1f} | {r['rss_mb']:.1f} | {r['first_query_ms']:.2f} | {r['runs']} |")
        out.append("")
    return "\n".join(out)
