"""The service under load: 16 concurrent clients, 30% add(text) / 70% search(text), against a
single in-process loop doing the same operations through ``MemoryStore``, in one run.

Both start from copies of the same store (``--seed`` memories, real ONNX MiniLM embedder,
vector-only organisation: ``--llm off``). The operation list is generated once with a fixed
seed; the loop runs it in order, the clients take the next operation from a shared queue.
Reported: throughput of both and their ratio, p50/p99 latency, errors; and the service's
start time on the existing store (until /healthz answers, and until it says the embedding
model is loaded).

Targets (issue #15): ratio >= 1.5, p99 <= 10x p50, zero errors, start < 3 s.

    python benches/bench_service.py [--ops 1200] [--clients 16] [--seed 1000]
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

SUBJECTS = ["The user", "Their partner", "The team lead", "Our client", "The landlord", "My sister"]
VERBS = ["likes", "avoids", "booked", "cancelled", "asked about", "recommended", "forgot", "paid for"]
OBJECTS = ["sushi in Kyoto", "the JR pass", "a window seat", "the quarterly report", "vegan ramen",
           "the museum tickets", "a hotel near the station", "the dentist appointment", "hiking boots",
           "the rental car", "green tea", "the budget spreadsheet", "a birthday gift", "the Wi-Fi router"]
WHEN = ["on Monday", "last week", "in May", "before the trip", "after the call", "every morning", "yesterday"]
QUESTIONS = ["What does {s} like?", "Who booked {o}?", "When was {o} {v}?", "What did {s} forget?",
             "Is {o} paid for?", "What happened {w}?"]


def sentence(rng: np.random.Generator) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(WHEN)}."


def question(rng: np.random.Generator) -> str:
    return str(rng.choice(QUESTIONS)).format(s=rng.choice(SUBJECTS).lower(), o=rng.choice(OBJECTS),
                                             v=rng.choice(VERBS), w=rng.choice(WHEN))


def make_ops(n: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    return [("add", sentence(rng)) if rng.random() < 0.3 else ("search", question(rng)) for _ in range(n)]


def seed_store(path: Path, n: int) -> None:
    from clag_fast import MemoryStore, StoreConfig

    rng = np.random.default_rng(1)
    texts = [sentence(rng) for _ in range(n)]
    with MemoryStore.open(path, config=StoreConfig(slm="off"), llm=False) as store:
        for i in range(0, n, 256):
            store.add_many(texts[i:i + 256], namespaces="bench")
        store.organize()


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) * 1000 if xs else float("nan")


def run_in_process(path: Path, ops: list[tuple[str, str]]) -> dict:
    from clag_fast import MemoryStore, StoreConfig

    lat, errors = [], 0
    with MemoryStore.open(path, config=StoreConfig(slm="off"), llm=False) as store:
        store.search("warm up", k=1, namespace="bench")  # load the model outside the timing
        t0 = time.perf_counter()
        for op, text in ops:
            t = time.perf_counter()
            try:
                if op == "add":
                    store.add(text, namespace="bench")
                else:
                    store.search(text, k=5, namespace="bench")
            except Exception:
                errors += 1
            lat.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "ops_s": len(ops) / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "errors": errors}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, path: Path) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(path),
                                      "--port", str(self.port), "--llm", "off"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        health = None
        while time.perf_counter() - t0 < 120:
            try:
                health = httpx.get(self.url + "/healthz", timeout=2).json()
                break
            except httpx.TransportError:
                time.sleep(0.01)
        self.start_s = time.perf_counter() - t0
        self.health_at_start = health
        while health is not None and health["embedder"] != "ready" and time.perf_counter() - t0 < 120:
            time.sleep(0.02)
            health = httpx.get(self.url + "/healthz", timeout=2).json()
        self.models_s = time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def run_service(path: Path, ops: list[tuple[str, str]], clients: int) -> dict:
    import httpx

    service = Service(path)
    work: queue.Queue = queue.Queue()
    for op in ops:
        work.put(op)
    lat: list[float] = []
    by_op: dict[str, list[float]] = {"add": [], "search": []}
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=service.url, timeout=120) as http:
            while True:
                try:
                    op, text = work.get_nowait()
                except queue.Empty:
                    return
                t = time.perf_counter()
                try:
                    if op == "add":
                        r = http.post("/v1/memories", json={"text": text, "namespace": "bench"})
                    else:
                        r = http.post("/v1/search", json={"query": text, "k": 5, "namespace": "bench"})
                    ok = r.status_code == 200
                    detail = r.text[:200]
                except httpx.HTTPError as e:
                    ok, detail = False, repr(e)
                with lock:
                    lat.append(time.perf_counter() - t)
                    by_op[op].append(lat[-1])
                    if not ok:
                        errors.append(detail)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stats = httpx.get(service.url + "/v1/stats").json()["service"]
    service.stop()
    # start-up on the now existing (and grown) store
    again = Service(path)
    start = {"start_s": again.start_s, "models_loaded_s": again.models_s, "healthz_at_start": again.health_at_start}
    again.stop()
    return {"wall_s": wall, "ops_s": len(ops) / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "errors": len(errors), "error_examples": errors[:3], "batches": stats,
            "by_op": {op: (pct(v, 50), pct(v, 99)) for op, v in by_op.items()}, **start}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=1200)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seed", type=int, default=1000, help="memories in the store before the run")
    args = p.parse_args(argv)
    ops = make_ops(args.ops)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        base = Path(tmp) / "seed"
        t0 = time.perf_counter()
        seed_store(base, args.seed)
        print(f"seeded {args.seed} memories in {time.perf_counter() - t0:.1f} s; {args.ops} ops "
              f"({sum(o == 'add' for o, _ in ops)} adds), {args.clients} clients; {os.cpu_count()} CPUs", flush=True)
        shutil.copytree(base, Path(tmp) / "local")
        shutil.copytree(base, Path(tmp) / "served")
        local = run_in_process(Path(tmp) / "local", ops)
        print(f"in-process loop : {local['ops_s']:7.1f} ops/s  p50 {local['p50_ms']:6.1f} ms  "
              f"p99 {local['p99_ms']:6.1f} ms  errors {local['errors']}  ({local['wall_s']:.1f} s)", flush=True)
        served = run_service(Path(tmp) / "served", ops, args.clients)
        print(f"service, {args.clients} clients: {served['ops_s']:7.1f} ops/s  p50 {served['p50_ms']:6.1f} ms  "
              f"p99 {served['p99_ms']:6.1f} ms  errors {served['errors']}  ({served['wall_s']:.1f} s)")
        print(f"ratio service/loop: {served['ops_s'] / local['ops_s']:.2f}x   p99/p50: "
              f"{served['p99_ms'] / served['p50_ms']:.1f}")
        print(f"batches: {served['batches']}")
        print("service p50/p99 by operation (ms): " + ", ".join(
            f"{op} {a:.1f}/{b:.1f}" for op, (a, b) in served["by_op"].items()))
        print(f"start on the existing store: /healthz after {served['start_s']:.2f} s "
              f"(embedder {served['healthz_at_start']['embedder']!r}), model loaded after "
              f"{served['models_loaded_s']:.2f} s")
        if served["error_examples"]:
            print("errors:", served["error_examples"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
