"""Recovery on open (store/recovery.py): each file of a store directory corrupted, truncated
or removed in turn.

* ``index/clusters.bin`` is derived state: unreadable or missing, it is moved aside and the
  clusters are rebuilt from the database, with the same membership and profiles.
* ``memories.db`` is the source of truth: lost or emptied beside vectors, the store refuses
  to open (naming both files) instead of opening empty.
* ``index/vectors.f32`` damaged: a clear error naming the file, and the database untouched.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from clag_fast import StoreFormatError
from clag_fast.config import StoreConfig
from clag_fast.index import VectorIndex
from clag_fast.store import MemoryStore
from store_helpers import DIM, texts_for, topic_vectors

CFG = StoreConfig(min_memories_to_cluster=50, organize_every=0)
LOGGER = "clag_fast.store.recovery"
N_FIRST, N = 240, 360


def open_store(path: Path, **kw) -> MemoryStore:
    return MemoryStore.open(path, embedder=False, slm=False, config=CFG, **kw)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A closed store of 360 clustered memories, organised twice (split and merged, so the
    cluster ids have gaps and a rebuild really renumbers them), and its vectors."""
    path = tmp_path_factory.mktemp("recovery") / "base"
    vecs, top = topic_vectors(N, 12, seed=1)
    with open_store(path) as s:
        ids = s.add_many(texts_for(top[:N_FIRST]), embeddings=vecs[:N_FIRST])
        s.organize()
        ids += s.add_many(texts_for(top[N_FIRST:], N_FIRST), embeddings=vecs[N_FIRST:])
        report = s.organize()
        assert report["split"] or report["merged"]
    return path, ids, vecs


@pytest.fixture
def store_dir(built, tmp_path):
    base, ids, vecs = built
    path = tmp_path / "s"
    shutil.copytree(base, path)
    return path, ids, vecs


def digest(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def wal_is_empty(path: Path) -> bool:
    """No write reached the database: its WAL is absent or empty (a reader may create it)."""
    wal = path / "memories.db-wal"
    return not wal.exists() or wal.stat().st_size == 0


def snapshot(path: Path, ids: list[int], vecs: np.ndarray) -> dict:
    """What recovery must preserve, read through the public API, then from the index files:
    the membership partition (primary and secondary members of each cluster, by memory id),
    each block's profile, and the store's view of every memory's clusters."""
    with open_store(path) as s:
        clusters = {c.id: c for c in s.clusters()}
        memories = {m: s.get(m) for m in ids}
        # flat: the hit is the memory itself whatever the clusters; its cluster_id is the
        # index's primary cluster for the row.
        flat = s.search_many(vecs, k=1, mode="flat")
        two_stage = s.search_many(vecs, k=3)
        hit_cluster = {m: (h[0].memory_id, h[0].cluster_id, h[0].cluster_summary) for m, h in zip(ids, flat)}
        found = {m: m in {x.memory_id for x in h} for m, h in zip(ids, two_stage)}
    # Rows were added in id order, without updates or deletes: row r holds memory ids[r].
    with VectorIndex.open(path / "index", dim=DIM, read_only=True) as ix:
        cids = ix.cluster_ids().tolist()
        members = {c: (frozenset(ids[r] for r in ix.members(c).tolist()),
                       frozenset(ids[r] for r in ix.secondary_members(c).tolist())) for c in cids}
    return {"clusters": clusters, "memories": memories, "hit_cluster": hit_cluster, "found": found,
            "members": members}


def partition(snap: dict) -> set:
    return set(snap["members"].values())


def profiles_by_block(snap: dict) -> dict:
    c = snap["clusters"]
    return {snap["members"][cid]: (c[cid].summary, tuple(c[cid].tags)) for cid in snap["members"]}


def assert_consistent(snap: dict, ids: list[int]) -> None:
    """Cluster ids agree between clusters(), the index, hits and get(id).clusters."""
    cids = set(snap["clusters"])
    assert cids == set(snap["members"]), "clusters() and the index list different clusters"
    for m in ids:
        hit_id, hit_cluster, hit_summary = snap["hit_cluster"][m]
        assert hit_id == m
        stored = snap["memories"][m].clusters
        assert stored, f"memory {m} lost its clusters"
        assert {c for c, _ in stored} <= cids, f"memory {m} names clusters that do not exist: {stored}"
        assert hit_cluster == stored[0][0], f"memory {m}: hit says cluster {hit_cluster}, get() says {stored}"
        assert m in snap["members"][hit_cluster][0], f"memory {m} is not a primary member of {hit_cluster}"
        assert hit_summary == snap["clusters"][hit_cluster].summary
        assert snap["found"][m], f"memory {m} not found by a two-stage search for its own vector"


# -- index/clusters.bin ------------------------------------------------------------------------
def _flip_middle(f: Path) -> None:
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    b[len(b) // 2 + 1] ^= 0x55
    f.write_bytes(bytes(b))


def _flip_header(f: Path) -> None:
    b = bytearray(f.read_bytes())
    for i in range(4):
        b[i] ^= 0xFF
    f.write_bytes(bytes(b))


CLUSTER_DAMAGE = {
    "flipped": _flip_middle,
    "flipped header": _flip_header,
    "truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 3]),
    "truncated short": lambda f: f.write_bytes(f.read_bytes()[:10]),
    "emptied": lambda f: f.write_bytes(b""),
    "garbage": lambda f: f.write_bytes(np.random.default_rng(0).bytes(f.stat().st_size)),
    "removed": lambda f: f.unlink(),
}


@pytest.mark.parametrize("damage", list(CLUSTER_DAMAGE))
def test_a_lost_cluster_file_is_rebuilt_from_the_database(store_dir, damage, caplog):
    path, ids, vecs = store_dir
    before = snapshot(path, ids, vecs)
    assert_consistent(before, ids)
    assert max(before["clusters"]) >= len(before["clusters"]), "ids have no gaps: renumbering untested"
    cfile = path / "index" / "clusters.bin"
    CLUSTER_DAMAGE[damage](cfile)
    damaged = None if damage == "removed" else cfile.read_bytes()
    vec_digest = digest(path / "index" / "vectors.f32")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with open_store(path) as s:
            assert not s.read_only
            assert len(s) == N
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert warnings, "recovery should warn"
    assert any("rebuilt" in r.getMessage() for r in warnings)
    aside = sorted(p.name for p in (path / "index").iterdir() if p.name.startswith("clusters.bin.corrupt-"))
    if damage == "removed":
        assert aside == []
    else:
        assert len(aside) == 1 and re.fullmatch(r"clusters\.bin\.corrupt-\d+", aside[0])
        assert (path / "index" / aside[0]).read_bytes() == damaged, "the damaged file is kept as it was"
        assert any(aside[0] in r.getMessage() for r in warnings), "the warning names where it went"
    assert digest(path / "index" / "vectors.f32") == vec_digest

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        after = snapshot(path, ids, vecs)
    assert_consistent(after, ids)
    assert len(after["clusters"]) == len(before["clusters"])
    assert partition(after) == partition(before)
    assert profiles_by_block(after) == profiles_by_block(before)
    for m in ids:
        assert after["memories"][m].text == before["memories"][m].text
        assert [a for _, a in after["memories"][m].clusters] == pytest.approx(
            [a for _, a in before["memories"][m].clusters])
    # The rebuild numbered the clusters afresh (the index's own numbering, from 0).
    assert sorted(after["clusters"]) == list(range(len(after["clusters"])))

    # The second reopen (inside snapshot) found nothing to repair.
    assert not [r for r in caplog.records if r.name == LOGGER], [r.getMessage() for r in caplog.records]
    assert sorted(p.name for p in (path / "index").iterdir() if ".corrupt-" in p.name) == aside
    again = snapshot(path, ids, vecs)
    assert {c: m for c, m in again["members"].items()} == after["members"]


@pytest.mark.parametrize("damage", ["flipped", "truncated", "garbage"])
def test_read_only_open_of_a_corrupt_cluster_file_is_refused(store_dir, damage):
    path, _, _ = store_dir
    cfile = path / "index" / "clusters.bin"
    CLUSTER_DAMAGE[damage](cfile)
    damaged = cfile.read_bytes()
    with pytest.raises(StoreFormatError, match=r"clusters\.bin.*writable"):
        open_store(path, read_only=True)
    assert cfile.read_bytes() == damaged
    assert not [p for p in (path / "index").iterdir() if ".corrupt-" in p.name]


def test_read_only_open_without_a_cluster_file_still_finds_everything(store_dir):
    path, ids, vecs = store_dir
    (path / "index" / "clusters.bin").unlink()
    with open_store(path, read_only=True) as s:
        assert len(s) == N
        for m, h in zip(ids, s.search_many(vecs, k=1)):
            assert h[0].memory_id == m
    assert not (path / "index" / "clusters.bin").exists()


# -- memories.db -------------------------------------------------------------------------------
def _remove_db(path: Path) -> None:
    for name in ("memories.db", "memories.db-wal", "memories.db-shm"):
        (path / name).unlink(missing_ok=True)


DB_DAMAGE = {
    "emptied": lambda path: (path / "memories.db").write_bytes(b""),
    "removed": _remove_db,
}


@pytest.mark.parametrize("damage", ["emptied", "removed"])
def test_a_lost_database_beside_vectors_is_refused(store_dir, damage):
    path, _, _ = store_dir
    vf = path / "index" / "vectors.f32"
    vec_bytes = vf.read_bytes()
    DB_DAMAGE[damage](path)
    for read_only in (False, True):
        with pytest.raises(StoreFormatError) as e:
            open_store(path, read_only=read_only)
        msg = str(e.value)
        assert str(path / "memories.db") in msg and str(vf) in msg, msg
    assert vf.read_bytes() == vec_bytes
    db = path / "memories.db"
    assert (db.exists() and db.stat().st_size == 0) if damage == "emptied" else not db.exists()
    assert not (path / "index" / "clusters.bin.corrupt").exists()


@pytest.mark.parametrize("damage", list(DB_DAMAGE))
def test_a_lost_database_message_names_both_files(store_dir, damage):
    """Whatever refuses the open, the message says which file is missing."""
    path, _, _ = store_dir
    DB_DAMAGE[damage](path)
    with pytest.raises(StoreFormatError, match="memories.db"):
        open_store(path)


@pytest.mark.parametrize("exists", [False, True])
def test_a_fresh_store_opens_in_an_empty_directory(tmp_path, exists):
    path = tmp_path / "new"
    if exists:
        path.mkdir()
    vecs, top = topic_vectors(60, 3, seed=3)
    with open_store(path) as s:
        ids = s.add_many(texts_for(top), embeddings=vecs)
    with open_store(path) as s:
        assert len(s) == 60
        assert s.search(vecs[7], k=1)[0].memory_id == ids[7]


CRASHING_ADD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from clag_fast.config import StoreConfig
    from clag_fast.store import MemoryStore, placement
    from store_helpers import topic_vectors

    store = MemoryStore.open({path!r}, config=StoreConfig(min_memories_to_cluster=50, organize_every=0),
                             embedder=False, slm=False)

    def crash(*args, **kwargs):  # inside the SQLite transaction, after the vector rows were appended
        os._exit(17)

    placement.record_placement = crash
    vecs, _ = topic_vectors(3, 2, seed=5)
    store.add_many(["a", "b", "c"], embeddings=vecs)
    """
)


def test_a_store_whose_first_add_crashed_before_the_commit_opens(tmp_path):
    path = tmp_path / "s"
    code = CRASHING_ADD.format(tests=str(Path(__file__).parent), path=str(path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    with VectorIndex.open(path / "index", dim=DIM, read_only=True) as ix:
        assert len(ix) == 3, "the crash should leave vector rows the database does not reference"
    vecs, top = topic_vectors(60, 3, seed=3)
    with open_store(path) as s:
        assert len(s) == 0
        ids = s.add_many(texts_for(top), embeddings=vecs)
        assert s.stats()["vector_rows"] == 63  # the orphan rows stay, unreferenced
    with open_store(path) as s:
        assert len(s) == 60
        for m, h in zip(ids, s.search_many(vecs, k=1)):
            assert h[0].memory_id == m


# -- index/vectors.f32 -------------------------------------------------------------------------
def _truncate_rows(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: 64 + DIM * 4 * 50 + 7])


def _flip_bytes(f: Path, where: range) -> None:
    b = bytearray(f.read_bytes())
    for i in where:
        b[i] ^= 0xFF
    f.write_bytes(bytes(b))


VECTOR_DAMAGE = {
    "truncated rows": (_truncate_rows, "truncated or corrupt"),
    "truncated header": (lambda f: f.write_bytes(f.read_bytes()[:40]), "truncated header"),
    "flipped magic": (lambda f: _flip_bytes(f, range(0, 2)), "not a clag_fast vector file"),
    "flipped dim": (lambda f: _flip_bytes(f, range(12, 13)), "corrupt header"),
    "flipped both commit slots": (lambda f: _flip_bytes(f, range(30, 50)), "corrupt header"),
}


@pytest.mark.parametrize("damage", list(VECTOR_DAMAGE))
def test_a_damaged_vector_file_is_a_clear_error_and_the_database_untouched(store_dir, damage):
    path, _, _ = store_dir
    vf = path / "index" / "vectors.f32"
    spoil, message = VECTOR_DAMAGE[damage]
    spoil(vf)
    damaged = vf.read_bytes()
    db = digest(path / "memories.db")
    for read_only in (False, True):
        with pytest.raises(OSError, match=message) as e:
            open_store(path, read_only=read_only)
        assert str(vf) in str(e.value)
    assert vf.read_bytes() == damaged
    assert digest(path / "memories.db") == db
    assert wal_is_empty(path)
    assert not [p for p in (path / "index").iterdir() if ".corrupt-" in p.name]


def _spoil_active_slot(path: Path) -> int:
    """Spoil the active commit slot of the vector file: it falls back to the other slot's
    older count (a torn header write looks the same). Returns the rows it held before."""
    vf = path / "index" / "vectors.f32"
    with VectorIndex.open(path / "index", dim=DIM, read_only=True) as ix:
        n_rows = len(ix)
    b = vf.read_bytes()
    seqs = [int.from_bytes(b[o:o + 8], "little") for o in (16, 40)]
    active = 16 if seqs[0] > seqs[1] else 40
    _flip_bytes(vf, range(active + 8, active + 9))  # the active slot's count: checksum fails
    with VectorIndex.open(path / "index", dim=DIM, read_only=True) as ix:
        assert 0 < len(ix) < n_rows
    return n_rows


def _index_files(path: Path) -> dict:
    return {p.name: digest(p) for p in sorted((path / "index").iterdir())}


@pytest.mark.parametrize("damage", ["lost commit", "removed"])
def test_open_index_refuses_fewer_rows_than_the_database_references(store_dir, damage):
    """recovery.open_index(rows_needed=...) refuses before opening anything for writing."""
    from clag_fast.store import recovery

    path, ids, vecs = store_dir
    vf = path / "index" / "vectors.f32"
    if damage == "removed":
        vf.unlink()
        n_rows = N
    else:
        n_rows = _spoil_active_slot(path)
    files = _index_files(path)
    for read_only in (True, False):
        with pytest.raises(StoreFormatError) as e:
            recovery.open_index(path, DIM, read_only, rows_needed=n_rows)
        assert str(vf) in str(e.value) and str(path / "memories.db") in str(e.value)
        assert _index_files(path) == files, "the refused open changed the index files"
    if damage == "lost commit":
        with recovery.open_index(path, DIM, True, rows_needed=10) as ix:  # enough rows: opens
            assert len(ix) >= 10


@pytest.mark.parametrize("damage", ["lost commit", "removed"])
def test_a_vector_file_with_fewer_rows_than_the_database_is_refused_untouched(store_dir, damage):
    path, _, _ = store_dir
    vf = path / "index" / "vectors.f32"
    if damage == "removed":
        vf.unlink()
    else:
        _spoil_active_slot(path)
    files = _index_files(path)
    db = digest(path / "memories.db")
    with pytest.raises(StoreFormatError) as e:
        open_store(path)
    assert str(vf) in str(e.value)
    assert _index_files(path) == files
    assert digest(path / "memories.db") == db
    assert wal_is_empty(path)


def test_a_vector_file_that_lost_its_latest_commit_is_an_error(store_dir):
    """What the store does today: refuses (naming the store, not the file) the damaged file."""
    path, _, _ = store_dir
    _spoil_active_slot(path)
    with pytest.raises(StoreFormatError, match=r"vector file"):
        open_store(path, read_only=True)
    with pytest.raises(StoreFormatError, match=r"vector file"):
        open_store(path)
