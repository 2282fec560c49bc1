"""The sharded store on Ray against the single process, in one run (issue #17).

1. Service: 16 clients, 30% add / 70% search (k=5, in one of 32 namespaces), through the Ray
   Serve front door over 4 shard owners vs the single-process ``clag-fast serve``, both from the
   same seeded memories. Vectors are given (bring-your-own-vector stores), so the numbers are
   the store and the distribution overhead, not the embedder. Target: ratio >= 0.7, 0 errors.
   The clients are ``bench_service``'s: lean asyncio keep-alive connections by default
   (``--client httpx``: threads with httpx, whose own CPU then competes with the service).
2. Restart: SIGKILL a shard owner; seconds until it answers again (target <= 10 s).
3. Bulk ingest: texts embedded with the ONNX MiniLM embedder on Ray Data's actor pool and
   written to the shards vs ``Embedder.encode`` in this process on the same cores (embedding
   only: the single process writes nothing). Target: ratio >= 0.9.

    python benches/bench_ray.py [--ops 1500] [--clients 16] [--texts 3000] [--client lean|httpx]
                                [--skip-ingest]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benches"))

from bench_service import DRIVERS, free_port, sentence  # noqa: E402

DIM = 384
NAMESPACES = [f"tenant-{i}" for i in range(32)]


def make_ops(n: int, seed: int = 7) -> list[tuple[str, str, list[float]]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = rng.normal(size=DIM).astype(np.float32)
        v /= np.linalg.norm(v)
        op = "add" if rng.random() < 0.3 else "search"
        out.append((op, str(rng.choice(NAMESPACES)), v.tolist()))
    return out


def seed_items(n: int) -> list[dict]:
    rng = np.random.default_rng(1)
    v = rng.normal(size=(n, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return [{"text": sentence(rng), "vector": v[i].tolist(), "namespace": NAMESPACES[i % len(NAMESPACES)]}
            for i in range(n)]


def vector_request(op: tuple[str, str, list[float]]) -> tuple[str, dict, str]:
    kind, ns, vec = op
    if kind == "add":
        return "/v1/memories", {"text": f"added to {ns}", "vector": vec, "namespace": ns}, "ids"
    return "/v1/search", {"vector": vec, "k": 5, "namespace": ns}, "hits"


def drive(url: str, ops: list, clients: int, driver: str = "lean") -> dict:
    """``clients`` concurrent clients (``bench_service.DRIVERS``: lean asyncio connections by
    default, or httpx threads) running ``ops``."""
    r = DRIVERS[driver](url, ops, clients, vector_request)
    r["first_errors"] = r.pop("error_examples")
    return r


def seed(url: str, items: list[dict]) -> None:
    import httpx

    for i in range(0, len(items), 500):
        r = httpx.post(f"{url}/v1/memories", json={"items": items[i:i + 500]}, timeout=120)
        r.raise_for_status()


def run_single(path: Path, items: list[dict], ops: list, clients: int, driver: str) -> dict:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.Popen([sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(path), "--port", str(port),
                             "--llm", "off", "--no-embedder", "--dim", str(DIM)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        seed(url, items)
        return drive(url, ops, clients, driver)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def run_ray(root: Path, items: list[dict], ops: list, clients: int, driver: str) -> tuple[dict, float]:
    from clag_fast.distributed import ShardedStore, frontdoor
    from clag_fast.server import ServeConfig

    url = frontdoor.run(ServeConfig(store=root, port=free_port(), embedder=False, dim=DIM), shards=4)
    seed(url, items)
    result = drive(url, ops, clients, driver)
    store = ShardedStore(root)
    shard = store.shard_of(NAMESPACES[0])
    import ray

    store.flush()
    sizes = []
    for s in store.existing_shards():
        opid = ray.get(store.owner(s).pid.remote())
        rss = int(next(line.split()[1] for line in open(f"/proc/{opid}/status") if line.startswith("VmRSS")))
        disk = sum(f.stat().st_size for f in store.layout.shard_dir(s).rglob("*") if f.is_file())
        sizes.append((s, ray.get(store.owner(s).count.remote()), rss / 1024, disk / 2**20))
    result["shards"] = sizes
    pid = ray.get(store.owner(shard).pid.remote())
    os.kill(pid, signal.SIGKILL)
    t0 = time.perf_counter()
    while True:
        try:
            if ray.get(store.owner(shard).ping.remote(), timeout=30) == shard:
                break
        except Exception:
            time.sleep(0.05)
    restart_s = time.perf_counter() - t0
    from ray import serve

    serve.delete("clag_fast")
    store.shutdown()
    return result, restart_s


def run_ingest(root: Path, n: int, cpus: int) -> dict:
    import ray.data

    from clag_fast.distributed import ingest
    from clag_fast.embed.embedder import Embedder

    rng = np.random.default_rng(3)
    texts = [f"{sentence(rng)} (note {i})" for i in range(n)]
    emb = Embedder(threads=cpus, device="cpu")
    emb.encode(texts[:64])  # load and warm the sessions outside the timing
    t0 = time.perf_counter()
    emb.encode(texts)
    single = n / (time.perf_counter() - t0)
    del emb
    ds = ray.data.from_items([{"text": t} for t in texts], override_num_blocks=max(4, n // 500))
    report = ingest(ds, root, shards=4, namespace="bulk", batch_size=256, embedders=cpus, embed_threads=1)
    return {"single_texts_s": single, "ray_texts_s": report.rate, "ray_s": report.seconds, "added": report.added}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=1500)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seed", type=int, default=2000, help="memories in each store before the run")
    p.add_argument("--texts", type=int, default=3000, help="texts for the bulk ingest")
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--client", choices=sorted(DRIVERS), default="lean",
                   help="lean: asyncio keep-alive connections (default); httpx: threads with httpx.Client")
    p.add_argument("--skip-ingest", action="store_true", help="only the service comparison and the restart")
    args = p.parse_args(argv)
    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, namespace="clag_fast", log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        items, ops = seed_items(args.seed), make_ops(args.ops)
        single = run_single(tmp / "single", items, ops, args.clients, args.client)
        sharded, restart_s = run_ray(tmp / "sharded", items, ops, args.clients, args.client)
        bulk = None if args.skip_ingest else run_ingest(tmp / "bulk", args.texts, args.cpus)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cpus, load average {load:.1f}; ray {ray.__version__}; {args.client} clients")
    print(f"{'':34} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for name, r in (("single process (clag-fast serve)", single), ("Ray front door, 4 shards", sharded)):
        print(f"{name:34} {r['ops_s']:8.1f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['errors']:7d}")
        for e in r["first_errors"]:
            print("   ", e)
    for s, n, rss, disk in sharded["shards"]:
        print(f"  shard {s}: {n} memories, owner RSS {rss:.0f} MiB, directory {disk:.1f} MiB")
    print(f"service ratio Ray / single: {sharded['ops_s'] / single['ops_s']:.2f}x (target >= 0.7)")
    print(f"shard owner restart after SIGKILL: {restart_s:.1f} s (target <= 10)")
    if bulk is None:
        return 0
    print(f"bulk ingest: single-process embedding {bulk['single_texts_s']:.0f} texts/s, Ray Data ingest "
          f"{bulk['ray_texts_s']:.0f} texts/s ({bulk['added']} added in {bulk['ray_s']:.1f} s): "
          f"{bulk['ray_texts_s'] / bulk['single_texts_s']:.2f}x (target >= 0.9)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
