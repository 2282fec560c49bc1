"""The assignment records (``index/assignments.bin``): what is written is what is read back,
renumbering keeps only known clusters, the file grows and survives a reopen, a damaged or lost
one is rebuilt from the clusters, and a store that kept its assignments in the database
(schema 3 or 4) has them moved into the file on open with nothing lost."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from clag_fast import MemoryStore, StoreConfig
from clag_fast.store.assignments import HEADER, MIN_GROWTH, Assignments, renumbered
from clag_fast.store.catalog import ASSIGNMENTS_V1, SCHEMA_VERSION
from store_helpers import topic_vectors

CFG = StoreConfig(min_memories_to_cluster=20, organize_every=10, max_cluster_size=12, slm="off")


def _records(a: Assignments, rows) -> list[list[tuple[int, float]]]:
    return [[(c, round(x, 3)) for c, x in p] for p in a.pairs(list(rows))]


def test_round_trip_with_padding_empty_rows_and_rewrites(tmp_path):
    a = Assignments(tmp_path / "a.bin", 3)
    ids = np.array([[7, 3, -1], [5, -1, -1], [-1, -1, -1], [2, 9, 4]], np.int64)
    aff = np.array([[0.9, 0.5, -np.inf], [0.25, -np.inf, -np.inf], [-np.inf] * 3, [0.8, 0.7, 0.6]], np.float32)
    a.write(np.arange(4), ids, aff)
    assert _records(a, range(5)) == [[(7, 0.9), (3, 0.5)], [(5, 0.25)], [], [(2, 0.8), (9, 0.7), (4, 0.6)], []]
    # A rewrite replaces the whole record: fewer clusters leave no stale ranks behind.
    a.write(np.array([3, 0]), np.array([[11], [-1]]), np.array([[0.4], [0.0]]))
    assert _records(a, [0, 3]) == [[], [(11, 0.4)]]
    # Unsorted rows, one of them twice: aligned, and the last record of the row wins.
    a.write(np.array([4, 1, 4]), np.array([[40, -1], [10, 12], [41, 42]]), np.array([[0.4, 0], [0.1, 0.2], [0.5, 0.3]]))
    assert _records(a, [1, 4]) == [[(10, 0.1), (12, 0.2)], [(41, 0.5), (42, 0.3)]]
    # Columns past k are dropped.
    a.write(np.array([2]), np.array([[1, 2, 3, 4]]), np.array([[0.9, 0.8, 0.7, 0.6]]))
    assert _records(a, [2]) == [[(1, 0.9), (2, 0.8), (3, 0.7)]]
    a.close()


def test_the_file_grows_and_keeps_its_records_across_a_reopen(tmp_path):
    path = tmp_path / "a.bin"
    a = Assignments(path, 2)
    far = MIN_GROWTH * 3 + 5  # past the first growth and the doubling after it
    a.write(np.array([0, far]), np.array([[1, 2], [3, -1]]), np.array([[0.5, 0.25], [0.75, 0.0]]))
    cap = a.capacity
    assert cap > far
    a.close()
    assert path.stat().st_size == HEADER + cap * 2 * 12
    b = Assignments(path, 2, read_only=True)
    assert _records(b, [0, far, far - 1, far * 10]) == [[(1, 0.5), (2, 0.25)], [(3, 0.75)], [], []]
    with pytest.raises(PermissionError, match="read-only"):
        b.write(np.array([1]), np.array([[1]]), np.array([[0.1]]))


def test_a_changed_soft_k_converts_the_file(tmp_path):
    path = tmp_path / "a.bin"
    a = Assignments(path, 3)
    a.write(np.array([0, 1]), np.array([[1, 2, 3], [4, -1, -1]]), np.array([[0.9, 0.8, 0.7], [0.6, 0, 0]]))
    a.close()
    b = Assignments(path, 2)
    assert b.k == 2 and _records(b, [0, 1]) == [[(1, 0.9), (2, 0.8)], [(4, 0.6)]]
    b.close()
    Assignments(path, 4).close()  # widened: the same pairs, room for more
    c = Assignments(path, 4, read_only=True)
    assert c.k == 4 and _records(c, [0]) == [[(1, 0.9), (2, 0.8)]]


def test_renumber_keeps_known_clusters_only(tmp_path):
    a = Assignments(tmp_path / "a.bin", 3)
    a.write(np.array([0, 1, 2]), np.array([[3, 99, 8], [99, -1, -1], [8, 3, -1]]),
            np.array([[0.9, 0.8, 0.7], [0.6, 0, 0], [0.5, 0.4, 0]]))
    a.renumber({3: 0, 8: 1})
    # Pairs of unknown clusters go, the rest keep their order (best first).
    assert _records(a, [0, 1, 2]) == [[(0, 0.9), (1, 0.7)], [], [(1, 0.5), (0, 0.4)]]
    ids, aff = renumbered(np.array([[5, 6]]), np.array([[0.3, 0.2]], np.float32), {})
    assert ids.tolist() == [[-1, -1]]


def _store(path, n=60):
    vecs, _ = topic_vectors(n, 4, seed=5)
    s = MemoryStore.open(path, config=CFG, embedder=False, slm=False)
    ids = s.add_many([f"m{i}" for i in range(n)], embeddings=vecs)
    s.organize()
    return s, ids


def test_get_reads_the_records_and_hides_dropped_clusters(tmp_path):
    s, ids = _store(tmp_path / "s")
    state = s._state
    m = s.get(ids[0])
    row = int(state.catalog.row_of(ids[0])[0])
    assert m.clusters == [(c, pytest.approx(x)) for c, x in state.assignments.pairs([row])[0]]
    assert m.clusters[0][0] == int(state.index.cluster_of(np.array([row]))[0])
    # A pair naming a cluster the database no longer lists is not shown.
    state.assignments.write(np.array([row]), np.array([[m.clusters[0][0], 10_000]]), np.array([[0.9, 0.8]]))
    assert [c for c, _ in s.get(ids[0]).clusters] == [m.clusters[0][0]]
    s.close()


def test_lost_or_damaged_records_are_rebuilt_from_the_clusters(tmp_path):
    path = tmp_path / "s"
    s, ids = _store(path)
    primary = {m.memory_id: m.clusters[0][0] for m in s.get_many(ids)}
    s.close()
    f = path / "index" / "assignments.bin"
    # Records a power loss could take: zeroed on disk.
    raw = bytearray(f.read_bytes())
    raw[HEADER:] = bytes(len(raw) - HEADER)
    f.write_bytes(bytes(raw))
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as s:
        assert {m.memory_id: m.clusters[0][0] for m in s.get_many(ids)} == primary
    # A damaged header: the file is moved aside and the records rebuilt.
    raw = bytearray(f.read_bytes())
    raw[:4] = b"XXXX"
    f.write_bytes(bytes(raw))
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as s:
        assert {m.memory_id: m.clusters[0][0] for m in s.get_many(ids)} == primary
    assert list((path / "index").glob("assignments.bin.corrupt-*"))
    # Removed altogether.
    f.unlink()
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as s:
        assert {m.memory_id: m.clusters[0][0] for m in s.get_many(ids)} == primary


def test_clusters_are_rebuilt_from_the_records(tmp_path):
    path = tmp_path / "s"
    s, ids = _store(path)
    members = sorted(sorted(m.memory_id for m in s.memories(cluster=c, limit=1000).items)
                     for c in s._state.index.cluster_ids().tolist())
    s.close()
    (path / "index" / "clusters.bin").write_bytes(b"garbage")
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as s:
        again = sorted(sorted(m.memory_id for m in s.memories(cluster=c, limit=1000).items)
                       for c in s._state.index.cluster_ids().tolist())
        assert again == members


@pytest.mark.parametrize("schema", [3, 4])
def test_a_database_holding_assignments_moves_them_into_the_file(tmp_path, schema):
    path = tmp_path / "old"
    s, ids = _store(path)
    before = {m.memory_id: m.clusters for m in s.get_many(ids)}
    assert any(len(c) > 1 for c in before.values()), "the test needs soft (multi-cluster) assignments"
    s.close()
    # Write the assignments back into the database as an older version kept them, and lose
    # the file, so nothing but the database can bring the soft assignments back.
    con = sqlite3.connect(path / "memories.db")
    if schema == 3:
        con.executescript(f"DROP TABLE assignments;\n{ASSIGNMENTS_V1}PRAGMA user_version=3;")
        con.executemany("INSERT INTO assignments VALUES (?, ?, ?, ?)",
                        [(m, r, c, a) for m, pairs in before.items() for r, (c, a) in enumerate(pairs)])
    else:
        rec = np.dtype([("cluster", "<i8"), ("affinity", "<f4")])
        con.executemany("INSERT INTO assignments (memory_id, pairs) VALUES (?, ?)",
                        [(m, np.array(pairs, rec).tobytes()) for m, pairs in before.items()])
    con.commit()
    con.close()
    (path / "index" / "assignments.bin").unlink()
    if schema == 4:  # (a schema-3 database needs a writer first: its migration)
        # A reader before any writer: the records in memory.
        with MemoryStore.open(path, config=CFG, embedder=False, slm=False, read_only=True) as r:
            assert {m.memory_id: m.clusters for m in r.get_many(ids)} == before
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as s:
        assert {m.memory_id: m.clusters for m in s.get_many(ids)} == before
    con = sqlite3.connect(path / "memories.db")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert con.execute("SELECT COUNT(*) FROM assignments").fetchone()[0] == 0
    con.close()
    with MemoryStore.open(path, config=CFG, embedder=False, slm=False) as s:
        assert {m.memory_id: m.clusters for m in s.get_many(ids)} == before


def test_the_database_is_checkpointed_only_after_the_rows_are_synced(tmp_path, monkeypatch):
    """No automatic checkpoints: the database file takes the log's pages at flush points (the
    rows synced first), or once CHECKPOINT_ROWS rows were added since the last one."""
    from clag_fast.store import memory_store

    cfg = StoreConfig(organize_every=0, min_memories_to_cluster=10_000, slm="off", dim=8)
    db = tmp_path / "s" / "memories.db"
    vecs = np.random.default_rng(1).standard_normal((8200, 8)).astype(np.float32)
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=False) as s:
        s.flush()
        size = db.stat().st_size
        # ~5 MB of log: SQLite's automatic checkpoint would have run at 4 MB.
        s.add_many([f"m{i} " + "x" * 600 for i in range(8000)], embeddings=vecs[:8000])
        assert db.stat().st_size == size, "a commit checkpointed by itself"
        assert (tmp_path / "s" / "memories.db-wal").stat().st_size > 0
        s.flush()
        grown = db.stat().st_size
        assert grown > size
        monkeypatch.setattr(memory_store, "CHECKPOINT_ROWS", 150)
        s.add_many([f"n{i}" for i in range(100)], embeddings=vecs[8000:8100])
        assert db.stat().st_size == grown and s._state.rows_since_checkpoint == 100
        s.add_many([f"o{i}" for i in range(100)], embeddings=vecs[8100:])
        assert db.stat().st_size > grown and s._state.rows_since_checkpoint == 0
    with MemoryStore.open(tmp_path / "s", config=cfg, embedder=False, slm=False) as s:
        assert len(s) == 8200
