"""The assignments table (schema v4: one packed row per memory): what is written is what is
read back, memories without a cluster keep no row, renumbering keeps only known clusters, and
a schema-3 database (one row per memory and rank) is converted on open with nothing lost."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from clag_fast import MemoryStore, StoreConfig
from clag_fast.store.catalog import SCHEMA_VERSION, Catalog
from store_helpers import topic_vectors

CFG = StoreConfig(min_memories_to_cluster=20, organize_every=10, max_cluster_size=12, slm="off")


def _catalog_with_memories(path: Path, n: int) -> Catalog:
    cat = Catalog(path)
    cat.insert_memories(list(range(1, n + 1)), [f"t{i}" for i in range(n)], ["user_input"] * n,
                        ["default"] * n, [None] * n, 0.0, list(range(n)), None)
    return cat


def test_arrays_round_trip_with_padding_and_empty_rows(tmp_path):
    cat = _catalog_with_memories(tmp_path / "m.db", 4)
    ids = np.array([[7, 3, -1], [5, -1, -1], [-1, -1, -1], [2, 9, 4]], np.int64)
    aff = np.array([[0.9, 0.5, -np.inf], [0.25, -np.inf, -np.inf], [-np.inf] * 3, [0.8, 0.7, 0.6]], np.float32)
    cat.replace_assignment_arrays(np.arange(1, 5), ids, aff)
    got = cat.assignments()
    want = [(1, 0, 7, 0.9), (1, 1, 3, 0.5), (2, 0, 5, 0.25), (4, 0, 2, 0.8), (4, 1, 9, 0.7), (4, 2, 4, 0.6)]
    assert [(m, r, c) for m, r, c, _ in got] == [(m, r, c) for m, r, c, _ in want]
    np.testing.assert_allclose([a for *_, a in got], [a for *_, a in want], rtol=1e-6)
    # A rewrite replaces the whole row: fewer clusters leave no stale ranks behind, and a
    # memory that lost every cluster keeps no row.
    cat.replace_assignments([4, 1], [[(11, 0.4)], []])
    assert [(m, r, c) for m, r, c, _ in cat.assignments()] == [(2, 0, 5), (4, 0, 11)]
    cat.close()


def test_renumber_keeps_known_clusters_only(tmp_path):
    cat = _catalog_with_memories(tmp_path / "m.db", 2)
    cat.add_clusters([(3, "kmeans"), (8, "kmeans")], 0.0, {}, profiled=False)
    cat.replace_assignments([1, 2], [[(3, 0.9), (8, 0.8), (99, 0.7)], [(99, 0.6)]])
    cat.renumber_clusters({3: 0, 8: 1})
    assert [(m, r, c) for m, r, c, _ in cat.assignments()] == [(1, 0, 0), (1, 1, 1)]
    cat.close()


def test_a_schema_3_database_is_converted_on_open(tmp_path):
    path = tmp_path / "old"
    vecs, _ = topic_vectors(60, 4, seed=5)
    with MemoryStore.open(path, config=CFG, embedder=False, llm=False) as s:
        ids = s.add_many([f"m{i}" for i in range(60)], embeddings=vecs)
        s.organize()
        before = {m.memory_id: m.clusters for m in s.get_many(ids)}
        rows_before = s._state.catalog.assignments()
    assert any(len(c) > 1 for c in before.values()), "the test needs soft (multi-cluster) assignments"
    # Write the assignments back in the schema-3 layout, one row per (memory, rank).
    con = sqlite3.connect(path / "memories.db")
    con.executescript("""
        DROP TABLE assignments;
        CREATE TABLE assignments (
            memory_id  INTEGER NOT NULL REFERENCES memories (id),
            rank       INTEGER NOT NULL,
            cluster_id INTEGER NOT NULL,
            affinity   REAL    NOT NULL,
            PRIMARY KEY (memory_id, rank)
        ) WITHOUT ROWID;
        PRAGMA user_version=3;
    """)
    con.executemany("INSERT INTO assignments VALUES (?, ?, ?, ?)", rows_before)
    con.commit()
    con.close()
    with MemoryStore.open(path, config=CFG, embedder=False, llm=False) as s:
        assert s._state.catalog.assignments() == rows_before
        assert {m.memory_id: m.clusters for m in s.get_many(ids)} == before
    con = sqlite3.connect(path / "memories.db")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert "pairs" in {r[1] for r in con.execute("PRAGMA table_info(assignments)")}
    con.close()


def test_arrays_in_any_id_order_stay_aligned_and_the_last_upsert_wins(tmp_path):
    cat = _catalog_with_memories(tmp_path / "m.db", 5)
    mids = np.array([4, 2, 5, 2, 1], np.int64)  # unsorted, memory 2 twice
    ids = np.array([[40, -1], [20, 21], [50, 51], [22, -1], [10, 11]], np.int64)
    aff = np.array([[0.4, -np.inf], [0.2, 0.1], [0.5, 0.4], [0.3, -np.inf], [0.9, 0.8]], np.float32)
    cat.replace_assignment_arrays(mids, ids, aff)
    got = {(m, r): (c, round(a, 3)) for m, r, c, a in cat.assignments()}
    assert got == {(1, 0): (10, 0.9), (1, 1): (11, 0.8), (2, 0): (22, 0.3), (4, 0): (40, 0.4),
                   (5, 0): (50, 0.5), (5, 1): (51, 0.4)}
