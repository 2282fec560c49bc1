"""Durability of the service: SIGKILL ``clag-fast serve`` while 8 clients add concurrently,
restart it, and every add that was answered is there, with its text, exactly once."""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest

import clag_fast
from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from service_helpers import ServiceProcess
from store_helpers import topic_vectors


@pytest.mark.parametrize("kill_after", [40, 250])
def test_sigkill_during_concurrent_adds_loses_and_doubles_nothing_answered(tmp_path, kill_after):
    path = tmp_path / "store"
    vecs = topic_vectors(8 * 400, 6, seed=3)[0]
    service = ServiceProcess(path)
    answered: list[tuple[int, str]] = []
    lock = threading.Lock()
    stop = threading.Event()
    cut_off: list[int] = []  # writers whose request the kill interrupted

    def writer(w: int) -> None:
        with httpx.Client(base_url=service.url, timeout=30) as http:
            for i in range(400):
                if stop.is_set():
                    return
                n = 1 + (i % 3)  # single adds and small batches
                texts = [f"w{w} add {i} item {j}" for j in range(n)]
                rows = [(w * 400 + (i + j) % 400) for j in range(n)]
                body = {"items": [{"text": t, "vector": vecs[r].tolist(), "namespace": f"w{w % 2}"}
                                  for t, r in zip(texts, rows)]}
                try:
                    r = http.post("/v1/memories", json=body)
                except httpx.TransportError:
                    cut_off.append(w)
                    return  # the service died: this add was never answered
                if r.status_code != 200:
                    return
                with lock:
                    answered.extend(zip(r.json()["ids"], texts))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    while len(answered) < kill_after and any(t.is_alive() for t in threads):
        threading.Event().wait(0.01)
    service.kill()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert len(answered) >= kill_after, service.output()
    assert cut_off, "the kill should land while adds are in flight"

    # restart on the same store: it opens, recovers, and holds every answered add once
    with ServiceProcess(path) as again:
        client = clag_fast.connect(again.url)
        assert len(dict(answered)) == len(answered)  # no id answered twice
        for mid, text in answered:
            assert client.get(mid).text == text
        n = client.stats()["memories"]
        assert n >= len(answered)
        extra = client.add("after the restart", embedding=vecs[0], namespace="w0")
        assert client.get(extra).text == "after the restart"
        client.close()

    # none twice: every text in the store is unique (an add answered or not is stored at most once)
    with MemoryStore.open(path, config=StoreConfig(slm="off"), embedder=False, slm=False) as store:
        texts = []
        for ns in ("w0", "w1"):
            hits = store.search(vecs[0], k=len(store), namespace=ns, mode="flat")
            texts += [h.text for h in hits]
        dupes = [t for t, c in Counter(texts).items() if c > 1]
        assert not dupes
        assert len(texts) == n + 1
        assert set(dict(answered).values()) <= set(texts)
