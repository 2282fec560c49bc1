"""SLM organiser cost: SLM calls per stored memory and ingest wall time with SmolLM2.

Ingests one LoCoMo conversation (default: conversation 2, 663 turns) into a fresh
MemoryStore the way an agent does, one ``add()`` per turn, with the managed
SmolLM2-135M-Instruct server (llama-cpp-python, ManagedServer's defaults), then ``flush()``.
With ``--background`` the store organises in its worker thread (``SLMConfig(background=True)``, the
store's default; without it this bench keeps the SLM work inline, which times the SLM's own
cost):
``adds_s`` is then the time until the last ``add()`` returned and ``wall_s`` the time until
``flush()`` had drained the worker's queue (the conversation ingested *and* organised). The same run
with ``slm=False`` (vector-only organisation) is the baseline. Reports calls and tokens per
memory, the share of routes decided by the SLM versus vectors, ``add()`` latency and the
wall time. The server's start (and warm-up) is timed separately: it happens once per
process, not per conversation.

    .venv/bin/python benches/bench_slm.py [--conv 2] [--turns 0] [--skip-vector] [--background]
        [--capture calls.jsonl] [--server-python /path/to/other/venv/bin/python]

``--capture`` writes every SLM call (messages, schema, max_tokens, answer, latency) as JSON
lines, so ``benches/replay_slm.py`` can replay the same prompts against other server builds
or settings without re-running the store.

Prints a JSON report (and a Markdown summary) on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from clag_fast.slm.client import LLMClient, LLMError

# LoCoMo's locomo10.json (github.com/snap-research/locomo, data/): $CLAG_LOCOMO, else beside the checkout.
LOCOMO = Path(os.environ.get("CLAG_LOCOMO") or Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")


def load_conversation(conv: int, turns: int) -> list[str]:
    """The turns of one LoCoMo conversation as "Speaker: text", sessions in order."""
    if not LOCOMO.is_file():
        raise FileNotFoundError(f"{LOCOMO} is missing (LoCoMo, benchmarks only)")
    c = json.loads(LOCOMO.read_text())[conv]["conversation"]
    texts: list[str] = []
    i = 1
    while f"session_{i}" in c:
        texts += [f"{t['speaker']}: {t['text']}" for t in c[f"session_{i}"]]
        i += 1
    return texts[:turns] if turns else texts


def ingest(texts: list[str], slm, embedder, background: bool = False) -> dict:
    from clag_fast import MemoryStore, SLMConfig, StoreConfig

    with tempfile.TemporaryDirectory() as d:
        store = MemoryStore.open(Path(d) / "store", slm=slm, embedder=embedder,
                                 config=StoreConfig(slm=SLMConfig(background=background)))
        lat = []
        t0 = time.perf_counter()
        for text in texts:
            t = time.perf_counter()
            store.add(text)
            lat.append(time.perf_counter() - t)
        t_flush = time.perf_counter()
        adds = t_flush - t0
        store.flush()
        wall = time.perf_counter() - t0
        st = store.stats()
        org = store._slm.connection.decisions.stats() if hasattr(store, "_slm") else {}
        store.close()
    n = len(texts)
    usage = st["slm_usage"]
    lat_sorted = sorted(lat)
    return {
        "memories": n,
        "background": background,
        "adds_s": round(adds, 2),
        "wall_s": round(wall, 2),
        "flush_s": round(time.perf_counter() - t_flush, 2),
        "add_ms_p50": round(1000 * statistics.median(lat), 2),
        "add_ms_p99": round(1000 * lat_sorted[int(0.99 * (n - 1))], 2),
        "add_ms_max": round(1000 * lat_sorted[-1], 2),
        "slm_calls": usage.get("calls", 0),
        "slm_errors": usage.get("errors", 0),
        "slm_calls_per_memory": round(usage.get("calls", 0) / n, 4),
        "prompt_tokens_per_memory": round(usage.get("prompt_tokens", 0) / n, 1),
        "completion_tokens_per_memory": round(usage.get("completion_tokens", 0) / n, 1),
        "slm_latency_s_total": round(usage.get("latency_s", 0.0), 2),
        "slm_latency_s_per_call": round(usage["latency_s"] / usage["calls"], 2) if usage.get("calls") else None,
        "routing": st["routing"],
        "organizations": st["organizations"],
        "clusters": st["clusters"],
        "organizer": org,
    }


def server_build(python: str) -> str:
    """llama-cpp-python's version and llama.cpp's CPU features in the serving interpreter."""
    proc = subprocess.run(
        [python, "-c", "import importlib.metadata as m, llama_cpp; print(m.version('llama-cpp-python'), "
                       "llama_cpp.llama_print_system_info().decode().strip())"],
        capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else f"unknown ({proc.stderr.strip()[-200:]})"


class RecordingClient(LLMClient):
    """An LLMClient that appends each chat_json call to a JSON-lines file."""

    def __init__(self, url: str, path: Path, **kw):
        super().__init__(url, **kw)
        self._out = open(path, "w")
        self._out_lock = threading.Lock()  # background mode calls from the worker thread

    def chat_json(self, messages, schema, max_tokens=256):
        t0 = time.perf_counter()
        rec = {"messages": messages, "schema": schema, "max_tokens": max_tokens}
        try:
            rec["answer"] = value = super().chat_json(messages, schema, max_tokens)
            return value
        except LLMError as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            rec["latency_s"] = round(time.perf_counter() - t0, 3)
            with self._out_lock:
                self._out.write(json.dumps(rec) + "\n")
                self._out.flush()

    def close(self) -> None:
        self._out.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conv", type=int, default=2)
    p.add_argument("--turns", type=int, default=0, help="0 = the whole conversation")
    p.add_argument("--skip-vector", action="store_true", help="skip the slm=False baseline")
    p.add_argument("--background", action="store_true", help="SLMConfig(background=True) (the store default; off here by default)")
    p.add_argument("--capture", type=Path, help="write the SLM calls to this JSON-lines file")
    p.add_argument("--server-python", help="interpreter whose llama-cpp-python build serves (default: this one)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from clag_fast import Embedder
    from clag_fast.slm.server import ManagedServer

    texts = load_conversation(args.conv, args.turns)
    embedder = Embedder(device="cpu")
    embedder.encode(texts[:4])  # load the model outside the timed part
    report: dict = {
        "machine": {
            "nproc": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip(),
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
            "python": platform.python_version(),
            "server_python": args.server_python or sys.executable,
            "llama_cpp_python": server_build(args.server_python or sys.executable),
            "uptime_before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        },
        "conversation": args.conv,
    }
    if not args.skip_vector:
        report["vector_only"] = ingest(texts, False, embedder, args.background)
    with ManagedServer(python=args.server_python) as srv:
        report["server"] = {"start_s": round(srv.start_time_s, 2), "warmup_s": round(srv.warmup_s or 0, 2),
                            "model": srv.served_model.name, "n_threads": srv.n_threads,
                            "n_threads_batch": srv.n_threads_batch, "flash_attn": srv.flash_attn}
        client = (RecordingClient(srv.url, args.capture, timeout=120.0) if args.capture
                  else LLMClient(srv.url, timeout=120.0))
        try:
            report["slm"] = ingest(texts, client, embedder, args.background)
        finally:
            if args.capture:
                client.close()
        report["slm"]["schema_mode"] = client.schema_mode
    report["machine"]["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
