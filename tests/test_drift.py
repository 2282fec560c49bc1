"""Centres are running means, so young clusters move as members join; organisation must not
leave members stranded in a cluster that moved away from them (they would be unfindable by a
two-stage search that probes only the nearest clusters)."""

from __future__ import annotations

from clag_fast.config import StoreConfig
from clag_fast.store import MemoryStore
from store_helpers import topic_vectors


def test_organisation_leaves_no_member_stranded(tmp_path):
    cfg = StoreConfig(min_memories_to_cluster=40, organize_every=25, max_cluster_size=60, slm="off")
    vecs, _ = topic_vectors(30000, 12, seed=7)  # the crash test's stream
    vecs = vecs[:650]
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=False) as s:
        i = 0
        worst: list[float] = []
        while i < len(vecs):
            b = min(1 + i % 3, len(vecs) - i)
            s.add_many([f"text {i + j}" for j in range(b)], embeddings=vecs[i:i + b])
            i += b
            if i % 50 < 3 and s.stats()["clusters"]:
                # each memory's own cluster is among the 2 nearest centres to its vector:
                # a two-stage search probing 2 clusters finds every memory by its own vector
                for mid_i in range(0, i, 3):
                    hit = s.search(vecs[mid_i], k=1, n_probe=2)[0]
                    worst.append(hit.score)
        assert min(worst) > 0.999, "a memory was not found by its own vector with n_probe=2"
