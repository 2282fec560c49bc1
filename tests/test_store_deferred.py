"""Deferred organisation for bulk loads: ``add_many(defer_organize=True)`` puts off the
periodic passes (not the cold start), ``organize_deferred()`` runs the one that is owed, and
the debt survives a crash of the writing process."""

from __future__ import annotations

import numpy as np

from clag_fast import MemoryStore, StoreConfig
from store_helpers import run_until_killed, texts_for, topic_vectors

# coherence=1: every cluster over the cap is split, so a pass that ran is visible in the sizes
# (each topic of topic_vectors is one coherent blob the default would keep whole).
CFG = StoreConfig(min_memories_to_cluster=30, organize_every=20, target_cluster_size=4, max_cluster_size=8,
                  coherence=1.0, slm="off")


def open_store(path, config=CFG):
    return MemoryStore.open(path, config=config, embedder=False, slm=False)


def _bulk(n: int, topics: int = 6, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    vecs, top = topic_vectors(n, topics, seed=seed)
    return vecs, texts_for(top, start=seed * 100_000)


def _assigned(store: MemoryStore) -> np.ndarray:
    state = store._state
    live = state.rows.live_rows()
    return state.index.cluster_of(live) >= 0


def test_deferred_writes_run_one_pass_when_asked(tmp_path):
    vecs, texts = _bulk(400)
    with open_store(tmp_path / "s") as s:
        for lo in range(0, 400, 40):
            s.add_many(texts[lo:lo + 40], embeddings=vecs[lo:lo + 40], defer_organize=True)
        # The cold start ran (at the first 40): later rows are routed into its clusters...
        assert s.stats()["organizations"] == 1 and _assigned(s).all()
        # ...which grew past the largest size a pass leaves, since no periodic pass ran.
        max_size = CFG.cluster_sizes_for(400)[1]
        assert max(c.size for c in s.clusters()) > max_size
        report = s.organize_deferred()
        assert report is not None and report["reason"] == "periodic" and report["split"]
        assert s.stats()["organizations"] == 2
        assert _assigned(s).all() and len(s) == 400
        assert sum(c.size for c in s.clusters()) >= 400  # soft assignment: a row may sit in two
        assert s.organize_deferred() is None  # nothing owed any more


def test_without_defer_the_same_writes_organise_periodically(tmp_path):
    vecs, texts = _bulk(400)
    with open_store(tmp_path / "s") as s:
        for lo in range(0, 400, 40):
            s.add_many(texts[lo:lo + 40], embeddings=vecs[lo:lo + 40])
        assert s.stats()["organizations"] >= 5  # the cold start, then periodic passes
        assert _assigned(s).all()
        assert s.organize_deferred() is None


def test_a_write_without_defer_runs_the_owed_pass(tmp_path):
    vecs, texts = _bulk(200)
    with open_store(tmp_path / "s") as s:
        s.add_many(texts[:100], embeddings=vecs[:100], defer_organize=True)  # the cold start
        s.add_many(texts[100:190], embeddings=vecs[100:190], defer_organize=True)  # periodic due, deferred
        assert s.stats()["organizations"] == 1
        s.add_many(texts[190:], embeddings=vecs[190:])
        assert s.stats()["organizations"] == 2 and _assigned(s).all()
        assert s.organize_deferred() is None


def test_deferred_adds_below_the_period_owe_nothing(tmp_path):
    vecs, texts = _bulk(110)
    with open_store(tmp_path / "s") as s:
        s.add_many(texts[:100], embeddings=vecs[:100], defer_organize=True)  # the cold start
        s.add_many(texts[100:], embeddings=vecs[100:], defer_organize=True)  # 10 < the period
        assert s.organize_deferred() is None and s.stats()["organizations"] == 1


def test_an_explicit_organize_settles_the_debt(tmp_path):
    vecs, texts = _bulk(200)
    with open_store(tmp_path / "s") as s:
        s.add_many(texts[:100], embeddings=vecs[:100], defer_organize=True)
        s.add_many(texts[100:], embeddings=vecs[100:], defer_organize=True)
        s.organize()
        assert s.organize_deferred() is None
    with open_store(tmp_path / "s") as s:  # nor does the database still record it
        assert s.organize_deferred() is None


_KILLED_WRITER = """
import sys
sys.path[:0] = {paths!r}
from clag_fast import MemoryStore, StoreConfig
from store_helpers import texts_for, topic_vectors
cfg = StoreConfig(min_memories_to_cluster=30, organize_every=20, target_cluster_size=4, max_cluster_size=8,
                  coherence=1.0, slm="off")
vecs, top = topic_vectors(400, 6, seed=0)
texts = texts_for(top)
s = MemoryStore.open({path!r}, config=cfg, embedder=False, slm=False)
for lo in range(0, 400, 40):
    s.add_many(texts[lo:lo + 40], embeddings=vecs[lo:lo + 40], defer_organize=True)
    print(lo + 40, flush=True)
import time
time.sleep(600)
"""


def test_a_killed_bulk_writer_leaves_the_pass_owed(tmp_path):
    """SIGKILL after deferred writes (no close, no flush): the reopened store still owes the
    pass, runs it once, and is then organised like the writer's would have been."""
    import os
    from pathlib import Path

    here = Path(__file__).resolve().parent
    paths = [str(here.parent / "python"), str(here)]
    lines = run_until_killed(_KILLED_WRITER.format(paths=paths, path=str(tmp_path / "s")), min_lines=10,
                             timeout_s=120)
    assert lines[-1].strip() == "400", lines
    assert os.path.exists(tmp_path / "s" / "memories.db")
    with open_store(tmp_path / "s") as s:
        assert len(s) == 400
        report = s.organize_deferred()
        assert report is not None and report["reason"] == "periodic"
        assert _assigned(s).all()
        max_size = CFG.cluster_sizes_for(400)[1]
        assert sum(c.size > max_size for c in s.clusters()) <= 1  # split (a part with no cut may stay)
    with open_store(tmp_path / "s") as s:
        assert s.organize_deferred() is None


def test_a_deferred_cold_start_labels_at_most_a_pass_worth(tmp_path, monkeypatch):
    """The cold start of a bulk load labels ``LABELS_PER_PASS`` clusters (its clusters are the
    first batch's, soon grown and split); a normal cold start labels every cluster."""
    from clag_fast.store import slm_scheduler as scheduler

    monkeypatch.setattr(scheduler, "LABELS_PER_PASS", 3)
    vecs, texts = _bulk(100)
    counts = {}
    for defer in (False, True):
        with open_store(tmp_path / f"s{defer}") as s:
            s.add_many(texts, embeddings=vecs, defer_organize=defer)
            assert s.stats()["organizations"] == 1  # the cold start
            clusters = s.clusters()
            counts[defer] = (sum(bool(c.summary) for c in clusters), len(clusters))
    assert counts[False][0] == counts[False][1] > 3
    assert counts[True][0] == 3 and counts[True][1] == counts[False][1]
