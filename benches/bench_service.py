"""The service under load: 16 concurrent clients, 30% add(text) / 70% search(text), against a
single in-process loop doing the same operations through ``MemoryStore``, in one run.

Both start from copies of the same store (``--seed`` memories, real ONNX MiniLM embedder,
vector-only organisation: ``--slm off``). The operation list is generated once with a fixed
seed and cut into ``--blocks`` consecutive slices, which the loop and the service take in
turns (loop then service, service then loop, ...): on a machine shared with other work both
sides then see the same moments of its load, and each side's time is the sum of its slices.
The loop runs a slice in order; the clients take its next operation from a shared queue. A
service slice ends when its last answer came and the service's background work (a
re-organisation in the store's worker) is done, so none of it runs during the loop's slices; a
loop slice likewise ends when its store's background work is done (its ``stats()`` show no
pending jobs, the test the service's ``/v1/stats`` answers), so none of the loop's runs in the
service's slices or goes uncounted.
Reported: throughput of both and their ratio (and per slice), p50/p99 latency, errors; and the
service's start time on the existing store (until /healthz answers, and until it says the
embedding model is loaded).

The clients (``--client``): by default 16 asyncio keep-alive connections in this process,
speaking just enough HTTP/1.1 (``LeanConnection``, ~0.1-0.15 ms of CPU per request), as agent
backends in other processes or languages would; ``httpx``: 16 threads each with an
``httpx.Client`` (~1 ms of CPU per request, taken from the 2 cores the server runs on). The
CPU seconds of the server process, of the clients and of the in-process loop are printed
per operation, with the load average.

The questions come from six templates (at most ~160 distinct texts; 119 in the default 822
searches), so most searches repeat an earlier question: both sides answer a repeat from the
store's retrieval cache when no add came in between, and otherwise take its vector from the
store's cache of recent texts' vectors (``StoreConfig.embed_cache``; ``--embed-cache 0`` turns
it off on both sides). The added sentences rarely repeat (368 distinct of 378).

Targets (BENCHMARKS.md, Service): ratio >= 1.5, p99 <= 10x p50, zero errors, start < 3 s.

    python benches/bench_service.py [--ops 1200] [--clients 16] [--seed 1000] [--client lean|httpx] [--blocks 4]
                                    [--embed-cache N]
"""

from __future__ import annotations

import argparse
import json
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
from typing import Any, Callable

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
    with MemoryStore.open(path, config=StoreConfig(slm="off"), slm=False) as store:
        for i in range(0, n, 256):
            store.add_many(texts[i:i + 256], namespaces="bench")
        store.organize()


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) * 1000 if xs else float("nan")


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, path: Path, extra: list[str] | None = None) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(path),
                                      "--port", str(self.port), "--slm", "off", *(extra or [])], env=env,
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


class LeanConnection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for the bench:
    a JSON POST and its answer (status, Content-Length body). A client as cheap as an agent
    backend's in another process or language would be: the bench measures the service, and on
    2 cores every millisecond a Python HTTP client spends is taken from the server.

    An ``asyncio.Protocol`` that parses each answer from the bytes as they arrive: asyncio's
    streams (a ``readline`` coroutine per header line, then ``readexactly``) cost about twice
    the CPU per request at the bench's rate (~75-150 us against ~35 us when answers come in
    bursts; every answer wakes the client's loop on its own)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._proto: _AnswerReader | None = None
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: ".encode()

    async def post(self, path: str, body: dict) -> tuple[int, bytes]:
        import asyncio

        loop = asyncio.get_running_loop()
        if self._proto is None or self._proto.lost:
            _, self._proto = await loop.create_connection(_AnswerReader, self.host, self.port)
        proto = self._proto
        data = json.dumps(body).encode()
        answer = proto.expect(loop)
        proto.transport.write(b"POST " + path.encode() + b" HTTP/1.1\r\n" + self._head
                              + str(len(data)).encode() + b"\r\n\r\n" + data)
        status, payload, close = await answer
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self._proto is not None:
            self._proto.transport.close()
            self._proto = None


class _AnswerReader:
    """The protocol under ``LeanConnection``: buffers what arrives and completes the waiting
    future with (status, body, close) once the head and Content-Length bytes of body are in."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.lost = False
        self._buf = bytearray()
        self._waiter: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def expect(self, loop: Any) -> Any:
        self._waiter = loop.create_future()
        return self._waiter

    def data_received(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0 or self._waiter is None:
            return
        lines = bytes(self._buf[:end]).split(b"\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            return self._fail(ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}"))
        length, close = None, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        if length is None:
            return self._fail(ConnectionError("answer without Content-Length"))
        if len(self._buf) < end + 4 + length:
            return
        payload = bytes(self._buf[end + 4:end + 4 + length])
        del self._buf[:end + 4 + length]
        waiter, self._waiter = self._waiter, None
        if not waiter.done():
            waiter.set_result((status, payload, close))

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.transport.close()

    def eof_received(self) -> None:
        self.lost = True  # the transport closes itself (returning None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("the service closed the connection"))


def drive_lean(url: str, ops: list, clients: int, request: Callable[[Any], tuple[str, dict, str]]) -> dict:
    """Run ``ops`` from ``clients`` concurrent keep-alive connections (asyncio, this process).
    ``request(op)`` gives (path, JSON body, the key an answer must hold). An answer counts as
    an error unless it is 200 and its JSON holds that key."""
    import asyncio
    from collections import deque
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    work = deque(ops)
    lat: list[float] = []
    by_op: dict[str, list[float]] = {}
    errors: list[str] = []

    async def client() -> None:
        conn = LeanConnection(parts.hostname, parts.port)
        try:
            while work:
                op = work.popleft()
                path, body, expect = request(op)
                t = time.perf_counter()
                try:
                    status, payload = await conn.post(path, body)
                    ok = status == 200 and expect in json.loads(payload)
                    detail = f"{status} {payload[:200]!r}"
                except (OSError, ValueError) as e:
                    conn.close()
                    ok, detail = False, repr(e)
                lat.append(time.perf_counter() - t)
                by_op.setdefault(op[0], []).append(lat[-1])
                if not ok:
                    errors.append(detail)
        finally:
            conn.close()

    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - t0

    cpu0 = time.process_time()
    wall = asyncio.run(main())
    return {"wall_s": wall, "ops_s": len(ops) / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "errors": len(errors), "error_examples": errors[:3], "client_cpu_s": time.process_time() - cpu0,
            "by_op": {op: (pct(v, 50), pct(v, 99)) for op, v in by_op.items()}, "lat": by_op}


def drive_httpx(url: str, ops: list, clients: int, request: Callable[[Any], tuple[str, dict, str]]) -> dict:
    """``drive_lean`` with one httpx.Client per thread, ``clients`` threads in this process
    (the Python client's cost included: these threads share one GIL with nothing else)."""
    import httpx

    work: queue.Queue = queue.Queue()
    for op in ops:
        work.put(op)
    lat: list[float] = []
    by_op: dict[str, list[float]] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while True:
                try:
                    op = work.get_nowait()
                except queue.Empty:
                    return
                path, body, expect = request(op)
                t = time.perf_counter()
                try:
                    r = http.post(path, json=body)
                    ok = r.status_code == 200 and expect in r.json()
                    detail = f"{r.status_code} {r.text[:200]}"
                except (httpx.HTTPError, ValueError) as e:
                    ok, detail = False, repr(e)
                with lock:
                    lat.append(time.perf_counter() - t)
                    by_op.setdefault(op[0], []).append(lat[-1])
                    if not ok:
                        errors.append(detail)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "ops_s": len(ops) / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
            "errors": len(errors), "error_examples": errors[:3], "client_cpu_s": time.process_time() - cpu0,
            "by_op": {op: (pct(v, 50), pct(v, 99)) for op, v in by_op.items()}, "lat": by_op}


DRIVERS = {"lean": drive_lean, "httpx": drive_httpx}


def text_request(op: tuple[str, str]) -> tuple[str, dict, str]:
    kind, text = op
    if kind == "add":
        return "/v1/memories", {"text": text, "namespace": "bench"}, "ids"
    return "/v1/search", {"query": text, "k": 5, "namespace": "bench"}, "hits"


def wait_idle(url: str, http: Any) -> None:
    """Until the service has no background work left (re-organisation in the store's worker)."""
    while http.get(url + "/v1/stats").json()["slm_pending"]["jobs"]:
        time.sleep(0.01)


def run_interleaved(local: Path, served: Path, ops: list[tuple[str, str]], clients: int, driver: str = "lean",
                    blocks: int = 4, embed_cache: int | None = None) -> tuple[dict, dict]:
    """The loop and the service on the same operations, in ``blocks`` consecutive slices
    that take turns (loop then service, then service then loop, ...), so both see the same
    moments of a shared machine's load; each side's time is the sum of its slices. A service
    slice ends when its last answer came and its background work is done (``wait_idle``), so
    no work of one side runs during the other's slice."""
    import httpx

    from clag_fast import MemoryStore, StoreConfig

    # Both sides keep the same cache of recent texts' vectors (the store's embed_cache).
    serve_args = [] if embed_cache is None else ["--embed-cache", str(embed_cache)]
    loop_config = StoreConfig(slm="off") if embed_cache is None else StoreConfig(slm="off", embed_cache=embed_cache)
    service = Service(served, serve_args)
    http = httpx.Client(timeout=300)
    wait_idle(service.url, http)
    loop = {"wall_s": 0.0, "cpu_s": 0.0, "idle_wait_s": 0.0, "lat": [], "errors": 0, "blocks": []}
    srv: dict[str, Any] = {"wall_s": 0.0, "idle_wait_s": 0.0, "server_cpu_s": 0.0, "client_cpu_s": 0.0, "lat": {},
                           "errors": 0, "error_examples": [], "blocks": []}
    bounds = np.linspace(0, len(ops), blocks + 1).round().astype(int)
    with MemoryStore.open(local, config=loop_config, slm=False) as store:
        store.search("warm up", k=1, namespace="bench")  # load the model outside the timing

        def loop_block(part: list[tuple[str, str]]) -> float:
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            for op, text in part:
                t = time.perf_counter()
                try:
                    if op == "add":
                        store.add(text, namespace="bench")
                    else:
                        store.search(text, k=5, namespace="bench")
                except Exception:
                    loop["errors"] += 1
                loop["lat"].append(time.perf_counter() - t)
            t = time.perf_counter()
            while store.stats()["slm_pending"]["jobs"]:  # the same test as wait_idle's
                time.sleep(0.01)
            loop["idle_wait_s"] += time.perf_counter() - t
            wall = time.perf_counter() - t0
            loop["wall_s"] += wall
            loop["cpu_s"] += time.process_time() - cpu0
            return wall

        def service_block(part: list[tuple[str, str]]) -> float:
            cpu0 = _cpu_of(service.proc.pid)
            r = DRIVERS[driver](service.url, part, clients, text_request)
            t = time.perf_counter()
            wait_idle(service.url, http)
            waited = time.perf_counter() - t
            srv["idle_wait_s"] += waited
            srv["server_cpu_s"] += _cpu_of(service.proc.pid) - cpu0
            srv["wall_s"] += r["wall_s"] + waited
            srv["client_cpu_s"] += r["client_cpu_s"]
            srv["errors"] += r["errors"]
            srv["error_examples"] += r["error_examples"][:3 - len(srv["error_examples"])]
            for op, v in r["lat"].items():
                srv["lat"].setdefault(op, []).extend(v)
            return r["wall_s"] + waited

        for b in range(blocks):
            part = ops[bounds[b]:bounds[b + 1]]
            if b % 2 == 0:
                lw, sw = loop_block(part), service_block(part)
            else:
                sw, lw = service_block(part), loop_block(part)
            loop["blocks"].append(len(part) / lw)
            srv["blocks"].append(len(part) / sw)
    stats = http.get(service.url + "/v1/stats").json()["service"]
    http.close()
    service.stop()
    # start-up on the now existing (and grown) store
    again = Service(served, serve_args)
    start = {"start_s": again.start_s, "models_loaded_s": again.models_s, "healthz_at_start": again.health_at_start}
    again.stop()
    every = [x for v in srv["lat"].values() for x in v]
    loop_out = {"wall_s": loop["wall_s"], "ops_s": len(ops) / loop["wall_s"], "p50_ms": pct(loop["lat"], 50),
                "p99_ms": pct(loop["lat"], 99), "errors": loop["errors"], "cpu_s": loop["cpu_s"],
                "idle_wait_s": loop["idle_wait_s"],
                "blocks": loop["blocks"]}
    srv_out = {"wall_s": srv["wall_s"], "ops_s": len(ops) / srv["wall_s"], "p50_ms": pct(every, 50),
               "p99_ms": pct(every, 99), "errors": srv["errors"], "error_examples": srv["error_examples"],
               "server_cpu_s": srv["server_cpu_s"], "client_cpu_s": srv["client_cpu_s"],
               "idle_wait_s": srv["idle_wait_s"], "blocks": srv["blocks"],
               "by_op": {op: (pct(v, 50), pct(v, 99)) for op, v in srv["lat"].items()},
               "batches": stats, **start}
    return loop_out, srv_out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=1200)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seed", type=int, default=1000, help="memories in the store before the run")
    p.add_argument("--client", choices=sorted(DRIVERS), default="lean",
                   help="lean: 16 asyncio keep-alive connections (default); httpx: 16 threads with httpx.Client")
    p.add_argument("--blocks", type=int, default=4,
                   help="slices of the operations the loop and the service take in turns (1: the loop, then the service)")
    p.add_argument("--embed-cache", type=int, default=None, metavar="N",
                   help="StoreConfig.embed_cache of both sides (the loop's store, the service's --embed-cache; "
                        "default: the default)")
    args = p.parse_args(argv)
    ops = make_ops(args.ops)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        base = Path(tmp) / "seed"
        t0 = time.perf_counter()
        seed_store(base, args.seed)
        print(f"seeded {args.seed} memories in {time.perf_counter() - t0:.1f} s; {args.ops} ops "
              f"({sum(o == 'add' for o, _ in ops)} adds), {args.clients} clients; {os.cpu_count()} CPUs", flush=True)
        shutil.copytree(base, Path(tmp) / "local")
        shutil.copytree(base, Path(tmp) / "served")
        local, served = run_interleaved(Path(tmp) / "local", Path(tmp) / "served", ops, args.clients, args.client,
                                        args.blocks, args.embed_cache)
        print(f"in-process loop : {local['ops_s']:7.1f} ops/s  p50 {local['p50_ms']:6.1f} ms  "
              f"p99 {local['p99_ms']:6.1f} ms  errors {local['errors']}  ({local['wall_s']:.1f} s, of which "
              f"{local['idle_wait_s']:.2f} s for background work after the slices' last operations)")
        print(f"service, {args.clients} clients: {served['ops_s']:7.1f} ops/s  p50 {served['p50_ms']:6.1f} ms  "
              f"p99 {served['p99_ms']:6.1f} ms  errors {served['errors']}  ({served['wall_s']:.1f} s, of which "
              f"{served['idle_wait_s']:.2f} s for background work after the slices' last answers)")
        print(f"CPU per operation: server {served['server_cpu_s'] / len(ops) * 1000:.2f} ms, "
              f"{args.client} clients {served['client_cpu_s'] / len(ops) * 1000:.2f} ms; "
              f"in-process loop {local['cpu_s'] / len(ops) * 1000:.2f} ms")
        print(f"ratio service/loop: {served['ops_s'] / local['ops_s']:.2f}x   p99/p50: "
              f"{served['p99_ms'] / served['p50_ms']:.1f}   (load average {os.getloadavg()[0]:.1f} "
              f"after the run, {load0:.1f} before)")
        print("per slice, ops/s loop / service: " + ", ".join(
            f"{a:.0f}/{b:.0f}" for a, b in zip(local["blocks"], served["blocks"])))
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
