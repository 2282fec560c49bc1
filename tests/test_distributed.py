"""The sharded store on a real local Ray cluster: shard owners, the Serve front door (the
same /v1 API), restarts, and bulk ingest with Ray Data. No mocks: ``ray.init(num_cpus=2)``."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.server import ServeConfig
from service_helpers import free_port

ROOT = Path(__file__).resolve().parents[1]

ray = pytest.importorskip("ray")

from clag_fast.distributed import ShardedStore, ShardMap, ingest  # noqa: E402
from clag_fast.distributed import frontdoor  # noqa: E402

DIM = 16


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, namespace="clag_fast", log_to_driver=False)
    yield
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def port(ray_local):
    return free_port()  # Serve's proxy listens on one port per Ray cluster


@pytest.fixture
def sharded(ray_local, tmp_path):
    store = ShardedStore(tmp_path / "cluster", 4, dim=DIM, embedder=False)
    yield store
    store.shutdown()


def _vecs(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _owner_names() -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("clag-")}


def test_sharded_store_answers_like_one_store(sharded, tmp_path):
    n = 120
    vecs, names = _vecs(n), [f"user-{i % 9}" for i in range(n)]
    texts = [f"memory {i}" for i in range(n)]
    ids = sharded.add_many(texts, vecs, namespaces=names, keys=[f"k{i}" for i in range(n)])
    assert len(set(ids)) == n
    assert len(sharded.existing_shards()) > 1  # nine namespaces spread over the shards
    single = MemoryStore.open(tmp_path / "single", config=StoreConfig(dim=DIM, slm="off"), embedder=False, slm=False)
    single.add_many(texts, vecs, namespaces=names)
    q = _vecs(5, seed=1)
    for ns in (None, "user-3"):
        got = sharded.search_many(q, k=7, namespace=ns, mode="flat")
        want = single.search_many(q, k=7, namespace=ns, mode="flat")
        assert [[h.text for h in hits] for hits in got] == [[h.text for h in hits] for hits in want]
    # ids route back to their shard; keys too
    assert [m.text for m in sharded.get_many(ids[::17])] == texts[::17]
    assert sharded.get(key="k42", namespace=names[42]).memory_id == ids[42]
    # paging across shards lists every memory once
    seen, cursor = [], None
    while True:
        page = sharded.memories(limit=11, cursor=cursor)
        seen += [m.memory_id for m in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)
    assert sharded.namespaces() == sorted(set(names))
    assert sharded.stats()["memories"] == n == len(sharded)
    assert sharded.delete_namespace("user-3") == sum(1 for x in names if x == "user-3")
    assert "user-3" not in sharded.namespaces()
    single.close()


def test_unknown_namespace_read_creates_no_shard(sharded, port):
    root = sharded.layout.root
    before = _owner_names()
    url = frontdoor.run(ServeConfig(store=root, port=port, embedder=False, dim=DIM), shards=4)
    try:
        r = httpx.get(f"{url}/v1/memories/by-key", params={"key": "x", "namespace": "nobody"}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = httpx.post(f"{url}/v1/search", json={"vector": [0.1] * DIM, "namespace": "nobody"}, timeout=30)
        assert r.status_code == 200 and r.json()["hits"] == []
        r = httpx.get(f"{url}/v1/memories", params={"namespace": "nobody"}, timeout=30)
        assert r.status_code == 200 and r.json()["items"] == []
        r = httpx.get(f"{url}/v1/memories/{(3 << 40) | 5}", timeout=30)
        assert r.status_code == 404
        assert not (root / "shards").exists() and _owner_names() == before
        # a write creates exactly the owning shard
        r = httpx.post(f"{url}/v1/memories", json={"text": "hi", "vector": [0.1] * DIM, "namespace": "nobody"},
                       timeout=30)
        assert r.status_code == 200
        assert ShardedStore(root).existing_shards() == [sharded.shard_of("nobody")]
        # the API's checks are the service's own (same app): a wrong width is a 400
        r = httpx.post(f"{url}/v1/memories", json={"text": "x", "vector": [0.1] * 3}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_dimension"
    finally:
        from ray import serve

        serve.delete("clag_fast")


def test_routing_is_stable_across_a_front_door_restart(sharded, port):
    root = sharded.layout.root
    config = ServeConfig(store=root, port=port, embedder=False, dim=DIM)
    names = [f"tenant-{i}" for i in range(12)]
    pinned = "whale"
    sharded.pin(pinned, (sharded.shard_of(pinned) + 1) % 4)
    names.append(pinned)
    from ray import serve

    url = frontdoor.run(config, shards=4)
    items = [{"text": f"fact of {ns}", "vector": _vecs(1, i)[0].tolist(), "namespace": ns, "key": "first"}
             for i, ns in enumerate(names)]
    ids = httpx.post(f"{url}/v1/memories", json={"items": items}, timeout=60).json()["ids"]
    serve.delete("clag_fast")
    url = frontdoor.run(config, shards=4)  # a new replica: a fresh ShardedStore reading cluster.json
    try:
        for ns, mid in zip(names, ids):
            r = httpx.get(f"{url}/v1/memories/by-key", params={"key": "first", "namespace": ns}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["memory_id"] == mid
        assert ShardMap.load(root).shard_of(pinned) != ShardMap(root, 4).shard_of(pinned)
        dirs = sorted(p.name for p in (root / "shards").iterdir())
        assert dirs == [f"{s:04d}" for s in sorted({ShardMap.load(root).shard_of(ns) for ns in names})]
        ns_list = httpx.get(f"{url}/v1/namespaces", timeout=30).json()["namespaces"]
        assert ns_list == sorted(names)
        assert httpx.get(f"{url}/v1/stats", timeout=30).json()["memories"] == len(names)
    finally:
        serve.delete("clag_fast")


def _listener(port: int) -> str:
    """The command line of the process listening on 127.0.0.1:``port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    return f.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return ""


def test_front_door_replica_answers_http_itself(sharded, port):
    """Direct ingress (the default): the API's port is the replica's own socket, so a request
    crosses no proxy process; the Serve controller's mode is fixed by its first front door."""
    root = sharded.layout.root
    config = ServeConfig(store=root, port=port, embedder=False, dim=DIM)
    from ray import serve

    url = frontdoor.run(config, shards=4)
    try:
        assert "ServeReplica" in _listener(port) and "clag_fast_front_door" in _listener(port)
        r = httpx.post(f"{url}/v1/memories", json={"text": "direct", "vector": [0.2] * DIM, "namespace": "d"},
                       timeout=30)
        assert r.status_code == 200, r.text
        with pytest.raises(RuntimeError, match="already runs with direct ingress"):
            frontdoor.run(config, shards=4, direct=False)
    finally:
        serve.delete("clag_fast")
    with pytest.raises(ValueError, match="no room"):
        frontdoor.serve_env(65535, replicas=2)


def test_two_front_doors_racing_get_one_owner(sharded):
    root = sharded.layout.root
    doors = [ShardedStore(root) for _ in range(2)]
    ns = "contested"
    barrier = threading.Barrier(2)
    out: list[list[int]] = [[], []]

    def write(i: int) -> None:
        barrier.wait()
        for j in range(10):
            out[i] += doors[i].add_many([f"door {i} #{j}"], _vecs(1, 100 * i + j), namespaces=[ns])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shard = sharded.shard_of(ns)
    pids = {ray.get(d.owner(shard).pid.remote()) for d in doors}
    assert len(pids) == 1  # one owner process: the loser of the race forwarded to it
    assert sorted(m.memory_id for m in sharded.memories(namespace=ns).items) == sorted(out[0] + out[1])


@pytest.mark.slow
def test_killed_owner_under_load_keeps_every_answered_add(sharded, port):
    root = sharded.layout.root
    ns = "busy"
    shard = sharded.shard_of(ns)
    sharded.add_many(["seed"], _vecs(1), namespaces=[ns])
    pid = ray.get(sharded.owner(shard).pid.remote())
    url = frontdoor.run(ServeConfig(store=root, port=port, embedder=False, dim=DIM), shards=4)
    answered: dict[str, int] = {}
    refused: list[int] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(c: int) -> None:
        j = 0
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                text = f"client {c} add {j}"
                j += 1
                r = http.post(f"{url}/v1/memories", json={"text": text, "vector": _vecs(1, j)[0].tolist(),
                                                           "namespace": ns})
                with lock:
                    if r.status_code == 200:
                        answered[text] = r.json()["ids"][0]
                    else:
                        assert r.status_code == 503, r.text
                        assert r.headers.get("retry-after") == "1"
                        refused.append(r.status_code)

    from ray import serve

    try:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        before_kill = len(answered)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        served_again = None
        while time.monotonic() - killed_at < 60:
            n = len(answered)
            time.sleep(0.2)
            if len(answered) > n and _pid_or_none(sharded, shard) not in (None, pid):
                served_again = time.monotonic() - killed_at
                break
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join()
        assert before_kill > 0 and served_again is not None, "the shard did not serve again after the kill"
        print(f"shard served again {served_again:.1f} s after SIGKILL; {len(refused)} adds answered 503")
        listed, cursor = [], None
        while True:
            page = httpx.get(f"{url}/v1/memories", params={"namespace": ns, "limit": 1000,
                                                         **({"cursor": cursor} if cursor else {})}, timeout=60).json()
            listed += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        counts = Counter(m["text"] for m in listed)
        for text, mid in answered.items():
            assert counts[text] == 1, f"{text!r} answered but stored {counts[text]} times"
        by_text = {m["text"]: m["memory_id"] for m in listed}
        assert all(by_text[t] == mid for t, mid in answered.items())
        assert max(counts.values()) == 1
    finally:
        serve.delete("clag_fast")


def _settled_count(store: ShardedStore) -> int:
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 1.5:
        n = len(store)
        if n != last:
            last, stable_since = n, time.monotonic()
        time.sleep(0.25)
    return last


def _pid_or_none(store: ShardedStore, shard: int) -> int | None:
    try:
        return ray.get(store.owner(shard).pid.remote(), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
        return None  # restarting


def _rows(n: int) -> list[dict]:
    vecs = _vecs(n, seed=7)
    return [{"id": f"row-{i}", "text": f"imported memory {i}", "user": f"u{i % 5}", "vec": vecs[i]} for i in range(n)]


def test_ingest_is_idempotent_and_resumes_after_a_failure(ray_local, tmp_path):
    import ray.data

    root = tmp_path / "ingest"
    n = 600
    rows = _rows(n)
    broken = [dict(r) for r in rows]
    broken[450]["text"] = "  "  # a bad row ends the first run part-way, as a lost worker would
    kwargs = dict(shards=3, dim=DIM, key_column="id", namespace_column="user", vector_column="vec", batch_size=50)
    with pytest.raises(Exception, match="empty 'text'"):
        ingest(ray.data.from_items(broken, override_num_blocks=12), root, **kwargs)
    store = ShardedStore(root)
    try:
        # add_many calls already sent when the run failed may still land after this count
        # (under load, past any settling time), so the resumed run is checked by invariants
        # that hold whenever they land: all it skipped was stored before, nothing is twice
        partial = _settled_count(store)
        assert partial < n
        report = ingest(ray.data.from_items(rows, override_num_blocks=12), root, **kwargs)
        assert len(store) == n
        assert report.rows == n and report.added + report.skipped == n and partial <= report.skipped < n
        again = ingest(ray.data.from_items(rows, override_num_blocks=12), root, **kwargs)
        assert again.added == 0 and len(store) == n
        # every row once, under its key, in its namespace
        m = store.get(key="row-123", namespace="u3")
        assert m.text == "imported memory 123"
        assert sorted(store.namespaces()) == [f"u{i}" for i in range(5)]
    finally:
        store.shutdown()


_KILLED_DRIVER = """
import sys, time
import numpy as np
import ray
from clag_fast.distributed import ingest

def slow_source(batch):
    time.sleep(0.3)  # a slow reader: the run is still going when the test kills it
    return batch

ray.init(address=sys.argv[1], namespace="clag_fast", log_to_driver=False)
n, dim = int(sys.argv[3]), int(sys.argv[4])
vecs = np.random.default_rng(7).normal(size=(n, dim)).astype(np.float32)
vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)  # the test's own rows (_rows): same keys, same vectors
rows = [{"id": f"row-{i}", "text": f"imported memory {i}", "user": f"u{i % 5}", "vec": vecs[i]} for i in range(n)]
ds = ray.data.from_items(rows, override_num_blocks=n // 50).map_batches(slow_source, batch_size=50)
ingest(ds, sys.argv[2], shards=3, dim=dim, key_column="id", namespace_column="user", vector_column="vec",
       batch_size=50)
"""


@pytest.mark.slow
def test_ingest_whose_driver_is_killed_resumes_to_exactly_every_row(ray_local, tmp_path):
    """SIGKILL of the ingest's driver process mid-run (its pipeline dies with it; the detached
    owners keep what they committed, and writes already sent may still land), then the same
    ingest again: every row stored exactly once."""
    import subprocess
    import sys

    import ray.data

    root, n = tmp_path / "killed", 1500
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH"))
                                                      if p))
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER, ray.get_runtime_context().gcs_address, str(root),
                             str(n), str(DIM)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    at_kill = 0
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            if (root / "cluster.json").exists():
                at_kill = len(ShardedStore(root))
                if at_kill >= n // 4:
                    proc.send_signal(signal.SIGKILL)
                    break
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"the driver ended by itself: {err.decode()[-2000:]}"
    store = ShardedStore(root)
    try:
        assert n // 4 <= at_kill < n
        rows = _rows(n)
        report = ingest(ray.data.from_items(rows, override_num_blocks=n // 50), root, dim=DIM, key_column="id",
                        namespace_column="user", vector_column="vec", batch_size=50)
        assert len(store) == n
        assert report.rows == n and report.added + report.skipped == n and report.skipped >= at_kill
        listed = [m for ns in store.namespaces() for m in _listed(store, ns)]
        keys = [m.key for m in listed]
        assert len(keys) == n and len(set(keys)) == n
        assert store.get(key="row-1234", namespace="u4").text == "imported memory 1234"
        # organised: the pass the killed run's writes put off ran at the end of the resumed one
        assert all(m.clusters for m in listed)
        assert [ray.get(store.owner(s).organize_deferred.remote()) for s in store.existing_shards()] == [None] * 3
    finally:
        store.shutdown()


def test_ingest_organises_each_shard_once_at_the_end(ray_local, tmp_path):
    """The owners' writes defer the periodic re-organisations; each shard runs the owed pass
    once before ``ingest`` returns: two organisations per shard (the cold start at the first
    100 memories, then that pass), every row in a cluster, nothing left owed."""
    import ray.data

    root, n = tmp_path / "organised", 1200
    report = ingest(ray.data.from_items(_rows(n), override_num_blocks=12), root, shards=2, dim=DIM, key_column="id",
                    namespace_column="user", vector_column="vec", batch_size=50)
    store = ShardedStore(root)
    try:
        assert report.added == n and len(store) == n
        shards = store.existing_shards()
        assert shards == [0, 1]
        for s in shards:
            owner = store.owner(s)
            assert ray.get(owner.stats.remote())["organizations"] == 2
            assert ray.get(owner.organize_deferred.remote()) is None
        listed = [m for ns in store.namespaces() for m in _listed(store, ns)]
        assert len(listed) == n and all(m.clusters for m in listed)
        assert store.organize_deferred() == {"shards": {"0": None, "1": None}}
        # a bulk write through the store defers as well; a normal one organises when due
        shard = store.shard_of("u0")
        owner = store.owner(shard)
        store.add_many([f"later {i}" for i in range(300)], _vecs(300, seed=9), namespaces=["u0"] * 300,
                       defer_organize=True)
        assert ray.get(owner.stats.remote())["organizations"] == 2
        assert store.organize_deferred()["shards"][str(shard)]["reason"] == "periodic"
        assert ray.get(owner.stats.remote())["organizations"] == 3
        store.add_many([f"after {i}" for i in range(300)], _vecs(300, seed=10), namespaces=["u0"] * 300)
        assert ray.get(owner.stats.remote())["organizations"] == 4
    finally:
        store.shutdown()


def _listed(store: ShardedStore, namespace: str) -> list:
    items, cursor = [], None
    while True:
        page = store.memories(namespace=namespace, limit=500, cursor=cursor)
        items += page.items
        cursor = page.next_cursor
        if cursor is None:
            return items


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_ingest_embeds_texts_from_jsonl_on_an_actor_pool(ray_local, tmp_path, threads):
    """With two cores the actor runs two calls at once: every row still gets its own vector
    (each text is its own nearest memory), none is lost or stored twice."""
    import json

    src = tmp_path / "turns.jsonl"
    texts = [f"the user mentioned topic number {i} during the trip" for i in range(64)]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    root = tmp_path / "embedded"
    report = ingest(str(src), root, shards=2, namespace="trip", batch_size=16, embed_batch=16,
                    embed_threads=threads)
    store = ShardedStore(root)
    try:
        assert report.added == 64 and len(store) == 64
        for i in range(0, 64, 3):
            assert store.search(texts[i], k=1, namespace="trip")[0].text == texts[i]
    finally:
        store.shutdown()


@pytest.mark.slow
def test_cli_ingest_ray_adds_each_row_once(ray_local, tmp_path, capsys):
    import json

    from clag_fast.cli import main

    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"text": f"the user likes dish {i}", "id": f"r{i}", "user": f"u{i % 3}"}) + "\n"
                           for i in range(30)))
    root = tmp_path / "cli-root"
    args = ["ingest", str(src), "--ray", "auto", "--store", str(root), "--key-column", "id",
            "--namespace-column", "user"]
    assert main(args + ["--shards", "2"]) == 0
    assert main(args) == 0  # the stored layout is reused; every key is already there
    out = capsys.readouterr().out
    assert "added 30, 0 already stored" in out and "added 0, 30 already stored" in out
    store = ShardedStore(root)
    try:
        assert len(store) == 30 and store.layout.shards == 2
        assert store.get(key="r4", namespace="u1").text == "the user likes dish 4"
    finally:
        store.shutdown()


def test_add_many_takes_one_namespace_for_the_batch(sharded):
    v = _vecs(4, seed=31)
    ids = sharded.add_many(list("abcd"), v, namespace="u1")
    assert {m.namespace for m in sharded.get_many(ids)} == {"u1"}
    with pytest.raises(ValueError, match="not both"):
        sharded.add_many(["e"], v[:1], namespace="u1", namespaces=["u2"])
