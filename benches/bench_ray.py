"""The sharded store on Ray against the single process, in one run (BENCHMARKS.md, Ray).

1. Service: 16 clients, 30% add / 70% search (k=5, in one of 32 namespaces), through the Ray
   Serve front door over 4 shard owners vs the single-process ``clag-fast serve``, both from the
   same seeded memories. Vectors are given (bring-your-own-vector stores), so the numbers are
   the store and the distribution overhead, not the embedder. Target: ratio >= 0.7, 0 errors.
   ``--modes``: the front door's replicas answering HTTP themselves (``direct``, the default)
   and/or through Serve's HTTP proxy (``proxy``); Serve restarts between them. Besides ops/s,
   the server side's CPU per operation (the serve process; every Ray process), which depends
   less on how the machine's other load shares the cores among the two sides' threads.
   The clients are ``bench_service``'s: lean asyncio keep-alive connections by default
   (``--client httpx``: threads with httpx, whose own CPU then competes with the service).
2. Restart: SIGKILL a shard owner; seconds until it answers again (target <= 10 s).
3. Bulk ingest: texts from a JSONL file embedded with the ONNX MiniLM embedder on Ray Data's
   actor pool and written to the shards vs, in this process on the same cores,
   ``Embedder.encode`` alone (the target's baseline) and encode + ``add_many`` into one store.
   Target: ratio >= 0.9. The Ray rate is end to end: ``ingest()`` from its call to its return
   (the cluster already up: reading, the embedding actor's start and model load, every write);
   the single process's embedding rate leaves its model load out (also shown with it), and is
   measured before and after the Ray run (the ratio is against the mean: this VM's speed
   drifts). Then (``--kill-at``) a second ingest whose driver process is SIGKILLed
   once that fraction is stored, and the same ingest again: it must end with exactly
   ``--texts`` memories, each key once.

    python benches/bench_ray.py [--ops 1500] [--clients 16] [--texts 3000] [--client lean|httpx]
                                [--modes direct,proxy] [--kill-at 0.5] [--skip-ingest | --skip-service]
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

from bench_service import DRIVERS, free_port, question, sentence  # noqa: E402
from measure import cores, cpu_times, process_cpu  # noqa: E402

DIM = 384
NAMESPACES = [f"tenant-{i}" for i in range(32)]


def make_ops(n: int, seed: int = 7, texts: bool = False) -> list[tuple[str, str, object]]:
    """(kind, namespace, vector) per operation; with ``texts`` a sentence to add or a question
    to search instead of the vector (the owners embed)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[str, str, object]] = []
    for i in range(n):
        v = rng.normal(size=DIM).astype(np.float32)
        v /= np.linalg.norm(v)
        op = "add" if rng.random() < 0.3 else "search"
        ns = str(rng.choice(NAMESPACES))
        out.append((op, ns, (sentence(rng) if op == "add" else question(rng)) if texts else v.tolist()))
    return out


def seed_items(n: int, texts: bool = False) -> list[dict]:
    rng = np.random.default_rng(1)
    v = rng.normal(size=(n, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    items = [{"text": sentence(rng), "vector": v[i].tolist(), "namespace": NAMESPACES[i % len(NAMESPACES)]}
             for i in range(n)]
    if texts:
        for item in items:
            del item["vector"]
    return items


def request(op: tuple[str, str, object]) -> tuple[str, dict, str]:
    kind, ns, payload = op
    if isinstance(payload, str):
        if kind == "add":
            return "/v1/memories", {"text": payload, "namespace": ns}, "ids"
        return "/v1/search", {"query": payload, "k": 5, "namespace": ns}, "hits"
    if kind == "add":
        return "/v1/memories", {"text": f"added to {ns}", "vector": payload, "namespace": ns}, "ids"
    return "/v1/search", {"vector": payload, "k": 5, "namespace": ns}, "hits"


def tree_cpu_s(root: int, include_root: bool = True) -> float:
    """CPU seconds (user + system) used so far by the live processes under ``root`` (from /proc)."""
    procs = process_cpu()
    total = procs[root][1] if include_root and root in procs else 0.0
    for pid, (p, cpu) in procs.items():
        while p and p != root:
            p = procs[p][0] if p in procs else 0
        if p == root and pid != root:
            total += cpu
    return total


def embed_alone(texts: list[str], cpus: int) -> tuple[float, float, float, np.ndarray]:
    """One process embedding ``texts`` on ``cpus`` threads: (seconds with the model load,
    seconds embedding, CPU seconds embedding, vectors). The Ray figure includes its embedding
    actor's model load, so the single process's is timed too."""
    from clag_fast.embed.embedder import Embedder

    t0 = time.perf_counter()
    emb = Embedder(threads=cpus, device="cpu")
    emb.encode(texts[:64])  # the sessions' first calls, as the actor's first batch has them
    t1, c1 = time.perf_counter(), time.process_time()
    vectors = emb.encode(texts)
    t2, c2 = time.perf_counter(), time.process_time()
    return t2 - t0, t2 - t1, c2 - c1, vectors


def drive(url: str, ops: list, clients: int, driver: str = "lean", server_cpu=None) -> dict:
    """``clients`` concurrent clients (``bench_service.DRIVERS``: lean asyncio connections by
    default, or httpx threads) running ``ops``. ``server_cpu``: returns the server side's CPU
    seconds so far (reported per operation: on a shared machine the ops/s ratio also depends
    on how many threads each side has runnable, its CPU per operation does not)."""
    before = server_cpu() if server_cpu else 0.0
    r = DRIVERS[driver](url, ops, clients, request)
    if server_cpu:
        r["cpu_ms_op"] = 1000 * (server_cpu() - before) / len(ops)
    r["first_errors"] = r.pop("error_examples")
    return r


def seed(url: str, items: list[dict]) -> None:
    import httpx

    for i in range(0, len(items), 500):
        r = httpx.post(f"{url}/v1/memories", json={"items": items[i:i + 500]}, timeout=120)
        r.raise_for_status()


def run_single(path: Path, items: list[dict], ops: list, clients: int, driver: str, texts: bool = False) -> dict:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    embedder = [] if texts else ["--no-embedder", "--dim", str(DIM)]
    proc = subprocess.Popen([sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(path), "--port", str(port),
                             "--slm", "off", *embedder], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        seed(url, items)
        return drive(url, ops, clients, driver, lambda: tree_cpu_s(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def run_ray(root: Path, items: list[dict], ops: list, clients: int, driver: str, direct: bool,
            texts: bool = False) -> tuple[dict, float]:
    from clag_fast.distributed import ShardedStore, frontdoor
    from clag_fast.server import ServeConfig

    config = ServeConfig(store=root, port=free_port(), embedder=texts, dim=None if texts else DIM)
    url = frontdoor.run(config, shards=4, direct=direct)
    seed(url, items)
    # the Ray cluster's processes (all started by this process's ray.init), not the clients
    result = drive(url, ops, clients, driver, lambda: tree_cpu_s(os.getpid(), include_root=False))
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

    serve.shutdown()  # the next front door may run Serve in the other mode
    store.shutdown()
    return result, restart_s


INGEST_SCRIPT = """
import sys
import ray
sys.path.insert(0, {python!r})
from clag_fast.distributed import ingest
ray.init(address={address!r}, namespace="clag_fast", log_to_driver=False)
ingest({src!r}, {root!r}, shards=4, namespace="bulk", embedders=1, embed_threads={cpus})
"""


def run_ingest(root: Path, n: int, cpus: int, kill_at: float | None, again: bool = True) -> dict:
    """Embedding rate of one process vs the Ray Data ingest (read -> embed -> write) (with
    ``again``, the single process once more after the Ray run), then,
    with ``kill_at``, an ingest driver SIGKILLed once that fraction of the rows is stored and
    a second run resuming it: the store must end with exactly ``n`` memories."""
    import inspect
    import json

    import ray

    from clag_fast import MemoryStore, StoreConfig
    from clag_fast.distributed import ShardedStore, ingest
    from clag_fast.distributed.ingest import row_key

    rng = np.random.default_rng(3)
    texts = [f"{sentence(rng)} (note {i})" for i in range(n)]
    src = root.parent / "bulk.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    # The hypervisor's steal (this VM's cores given to others) shows in no process's CPU and
    # changed by a quarter of the machine within minutes: printed with each timed part.
    m0 = cpu_times()
    cold_s, embed_s, _, vectors = embed_alone(texts, cpus)
    steal_before = cores(m0)
    # The same work in one process: those vectors written to one store in the same batches
    # (what the Ray pipeline's owners do), so the two ratios separate the store's own cost
    # from the engine's.
    single_store = MemoryStore.open(root.parent / "bulk-single", config=StoreConfig(dim=DIM, slm="off"), slm=False)
    t0 = time.perf_counter()
    batch = inspect.signature(ingest).parameters["batch_size"].default  # the pipeline's writes
    for i in range(0, n, batch):
        single_store.add_many(texts[i:i + batch], embeddings=vectors[i:i + batch], namespaces="bulk",
                              keys=[row_key("bulk", t) for t in texts[i:i + batch]])
    write_s = time.perf_counter() - t0
    single_store.close()
    del vectors
    out: dict = {"single_texts_s": n / embed_s, "single_cold_texts_s": n / cold_s,
                 "single_ingest_s": n / (embed_s + write_s)}
    print(f"  single process: embedding {n / embed_s:.0f} texts/s ({n / cold_s:.0f} with the model load; "
          f"steal {steal_before:.2f} cores); embedding + writing {n / (embed_s + write_s):.0f} texts/s", flush=True)
    marks: list[tuple[float, int]] = []
    m0 = cpu_times()
    t0 = time.perf_counter()
    report = ingest(str(src), root, shards=4, namespace="bulk", embedders=1, embed_threads=cpus,
                    progress=lambda k: marks.append((time.perf_counter() - t0, k)))
    steal = cores(m0)
    store = ShardedStore(root)
    out.update(ray_texts_s=report.rate, ray_s=report.seconds, added=report.added, stored=len(store))
    store.shutdown()
    # Ray Data reports a read block's rows (7,500-14,286 here) when its task ends, and the
    # embedding actor runs one block per core at once, so a rate between reports overstates: only
    # when the first block was reported written (start-up included) is shown.
    ta, ka = marks[0]
    print(f"  Ray Data ingest: {report.rate:.0f} texts/s, {len(texts)} rows, {out['stored']} stored; "
          f"first {ka} rows reported written at {ta:.1f} s; steal {steal:.2f} cores", flush=True)
    if again:
        # The machine's speed drifts (other load, a shared VM): the single process again after
        # the Ray run; the ratio is taken against the mean of its two rates.
        m0 = cpu_times()
        cold2_s, embed2_s, _, _ = embed_alone(texts, cpus)
        steal = cores(m0)
        out["single_texts_s_after"] = n / embed2_s
        out["single_cold_texts_s_after"] = n / cold2_s
        print(f"  single process again: embedding {n / embed2_s:.0f} texts/s ({n / cold2_s:.0f} with the model "
              f"load; steal {steal:.2f} cores)", flush=True)
    if kill_at is None:
        return out
    # Killed then resumed: the driver is a separate process on this Ray cluster, so a SIGKILL
    # takes its pipeline (read tasks, embedding and writing actors) down mid-way, as a lost
    # driver node would; the detached shard owners live on with what was written.
    resumed = root.parent / "bulk-resumed"
    script = INGEST_SCRIPT.format(python=str(ROOT / "python"), address=ray.get_runtime_context().gcs_address,
                                  src=str(src), root=str(resumed), cpus=cpus)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, at_kill = time.perf_counter(), 0
    try:
        while proc.poll() is None:
            time.sleep(1.0)
            if (resumed / "cluster.json").exists():
                at_kill = len(ShardedStore(resumed))
                if at_kill >= kill_at * n:
                    proc.send_signal(signal.SIGKILL)
                    break
    finally:
        proc.wait()
    killed_s = time.perf_counter() - t0
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the ingest to kill ended by itself (exit {proc.returncode}) before {kill_at:.0%}")
    print(f"  killed the ingest driver at {at_kill} stored rows ({killed_s:.0f} s)", flush=True)
    again = ingest(str(src), resumed, namespace="bulk", embedders=1, embed_threads=cpus)
    store = ShardedStore(resumed)
    out.update(killed_at=at_kill, killed_s=killed_s, resumed_added=again.added, resumed_skipped=again.skipped,
               resumed_s=again.seconds, resumed_stored=len(store),
               resumed_unique=len({m.key for m in _all(store)}))
    store.shutdown()
    return out


def _all(store) -> list:
    """Every live memory of the bulk namespace (to count distinct keys)."""
    items, cursor = [], None
    while True:
        page = store.memories(namespace="bulk", limit=5000, cursor=cursor)
        items += page.items
        cursor = page.next_cursor
        if cursor is None:
            return items


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
    p.add_argument("--skip-service", action="store_true", help="only the bulk ingest")
    p.add_argument("--payload", choices=("vector", "text"), default="vector",
                   help="vector: 384-d vectors given (default); text: sentences and questions the servers embed")
    p.add_argument("--modes", default="direct",
                   help="front door modes to run, comma-separated: direct (replicas answer HTTP; the default) "
                        "and/or proxy (through Serve's HTTP proxy)")
    p.add_argument("--no-single-again", action="store_true",
                   help="embed in one process only before the Ray ingest, not also after it")
    p.add_argument("--kill-at", type=float, default=0.5,
                   help="kill a second ingest's driver once this fraction is stored, then resume it (0: skip)")
    args = p.parse_args(argv)
    import ray

    load0 = os.getloadavg()[0]
    ray.init(num_cpus=args.cpus, include_dashboard=False, namespace="clag_fast", log_to_driver=False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        texts = args.payload == "text"
        items, ops = seed_items(args.seed, texts), make_ops(args.ops, texts=texts)
        single, ray_runs = None, {}
        if not args.skip_service:
            single = run_single(tmp / "single", items, ops, args.clients, args.client, texts)
            for mode in args.modes.split(","):
                ray_runs[mode] = run_ray(tmp / f"sharded-{mode}", items, ops, args.clients, args.client,
                                         direct=mode == "direct", texts=texts)
        bulk = None if args.skip_ingest else run_ingest(tmp / "bulk", args.texts, args.cpus, args.kill_at or None,
                                                          not args.no_single_again)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cpus, load average {load0:.1f} at the start, {load:.1f} at the end; "
          f"ray {ray.__version__}; {args.client} clients; {args.payload} payloads")
    if single is not None:
        print(f"{'':38} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'CPU ms/op':>10}")
        rows = [("single process (clag-fast serve)", single)]
        rows += [(f"Ray front door, 4 shards, {mode}", r) for mode, (r, _) in ray_runs.items()]
        for name, r in rows:
            print(f"{name:38} {r['ops_s']:8.1f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['errors']:7d} "
                  f"{r['cpu_ms_op']:10.2f}")
            for e in r["first_errors"]:
                print("   ", e)
        for mode, (sharded, restart_s) in ray_runs.items():
            for s, n, rss, disk in sharded["shards"]:
                print(f"  {mode}: shard {s}: {n} memories, owner RSS {rss:.0f} MiB, directory {disk:.1f} MiB")
            print(f"service ratio Ray ({mode}) / single: {sharded['ops_s'] / single['ops_s']:.2f}x (target >= 0.7); "
                  f"shard owner restart after SIGKILL: {restart_s:.1f} s (target <= 10)")
    if bulk is None:
        return 0
    singles = [bulk["single_texts_s"]] + ([bulk["single_texts_s_after"]] if "single_texts_s_after" in bulk else [])
    colds = [bulk["single_cold_texts_s"]] + ([bulk["single_cold_texts_s_after"]]
                                             if "single_cold_texts_s_after" in bulk else [])
    base, cold = sum(singles) / len(singles), sum(colds) / len(colds)
    print(f"bulk ingest of {args.texts} texts: single-process embedding {' / '.join(f'{r:.0f}' for r in singles)} "
          f"texts/s (before / after the Ray run; with its model load {' / '.join(f'{r:.0f}' for r in colds)}), "
          f"Ray Data ingest {bulk['ray_texts_s']:.0f} texts/s ({bulk['added']} added in {bulk['ray_s']:.1f} s, "
          f"start-up and writes included, {bulk['stored']} stored)")
    print(f"  ratio Ray / single embedding: {bulk['ray_texts_s'] / base:.2f}x (target >= 0.9; "
          f"{bulk['ray_texts_s'] / cold:.2f}x against the single process with its model load)")
    print(f"  against one process that embeds and writes to one store ({bulk['single_ingest_s']:.0f} texts/s): "
          f"{bulk['ray_texts_s'] / bulk['single_ingest_s']:.2f}x")
    if "killed_at" in bulk:
        ok = bulk["resumed_stored"] == bulk["resumed_unique"] == args.texts
        print(f"killed then resumed: driver SIGKILLed at {bulk['killed_at']} stored rows ({bulk['killed_s']:.0f} s), "
              f"the re-run added {bulk['resumed_added']} and skipped {bulk['resumed_skipped']} "
              f"({bulk['resumed_s']:.0f} s); stored {bulk['resumed_stored']}, distinct keys "
              f"{bulk['resumed_unique']}: {'exactly' if ok else 'NOT'} {args.texts}")
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
