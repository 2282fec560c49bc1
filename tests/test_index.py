"""VectorIndex facade: every method of the ARCHITECTURE contract, bad input, persistence."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast.index import SearchResult, VectorIndex

DIM = 16


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def blobs(n: int, centres: int, dim: int = DIM, spread: float = 0.05, seed: int = 0):
    rng = np.random.default_rng(seed)
    c = unit(rng.normal(size=(centres, dim)))
    lab = np.arange(n) % centres
    x = unit(c[lab] + spread * rng.normal(size=(n, dim)))
    return x, lab, c


@pytest.fixture
def idx(tmp_path):
    with VectorIndex.open(tmp_path / "ix", dim=DIM) as ix:
        yield ix


def test_open_append_len_vectors(idx, tmp_path):
    assert idx.dim == DIM and len(idx) == 0
    assert idx.vectors().shape == (0, DIM)
    rows = idx.append(np.full(DIM, 2.0))  # (dim,) + float64 + not unit: coerced and normalised
    assert rows.dtype == np.int64 and rows.tolist() == [0]
    x, _, _ = blobs(10, 2)
    assert idx.append(x).tolist() == list(range(1, 11))
    v = idx.vectors()
    assert v.shape == (11, DIM) and v.dtype == np.float32
    np.testing.assert_allclose(v[0], np.full(DIM, 1 / 4), rtol=1e-6)
    np.testing.assert_allclose(v[1:], x, atol=1e-6)
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0, 0] = 1.0
    # A view taken before more appends survives the file growing (remap).
    idx.append(np.tile(x, (3000, 1)))
    assert v.shape == (11, DIM) and float(v[1] @ x[0]) == pytest.approx(1.0, abs=1e-6)
    assert len(idx) == 30011
    # Non-contiguous / Fortran input is coerced.
    f = np.asfortranarray(x[:, :])
    assert idx.append(f[::2]).shape == (5,)


@pytest.mark.parametrize(
    "bad, msg",
    [
        (np.full((2, DIM), np.nan), "non-finite"),
        (np.vstack([np.ones(DIM), np.full(DIM, np.inf)]), "row 1"),
        (np.zeros((1, DIM)), "zero vector"),
        (np.ones((2, DIM + 1)), "dim"),
        (np.ones((2, 2, DIM)), "shape"),
        (np.array(["a"] * DIM), "real numbers"),
        (np.full((1, DIM), 1e39), "non-finite"),  # overflows float32
    ],
)
def test_append_bad_input_writes_nothing(idx, bad, msg):
    idx.append(np.ones(DIM))
    with pytest.raises(ValueError, match=msg):
        idx.append(bad)
    assert len(idx) == 1


def test_open_errors(tmp_path):
    with pytest.raises(ValueError, match="dim is required"):
        VectorIndex.open(tmp_path / "new")
    with pytest.raises(ValueError):
        VectorIndex.open(tmp_path / "new", dim=0)
    VectorIndex.open(tmp_path / "a", dim=4).close()
    with pytest.raises(ValueError, match="dim 4"):
        VectorIndex.open(tmp_path / "a", dim=5)
    with pytest.raises(OSError, match="no such"):
        VectorIndex.open(tmp_path / "missing", dim=4, read_only=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="not a directory"):
        VectorIndex.open(tmp_path / "file", dim=4)


def test_second_writer_refused_reader_allowed(tmp_path):
    a = VectorIndex.open(tmp_path / "ix", dim=4)
    a.append(np.eye(4))
    with pytest.raises(OSError, match="another process"):
        VectorIndex.open(tmp_path / "ix", dim=4)
    r = VectorIndex.open(tmp_path / "ix", read_only=True)
    assert len(r) == 4 and r.dim == 4
    with pytest.raises(OSError, match="read-only"):
        r.append(np.ones(4))
    r.close()
    a.close()


def test_closed_index_raises_oserror(tmp_path):
    ix = VectorIndex.open(tmp_path / "ix", dim=4)
    ix.append(np.eye(4))
    v = ix.vectors()
    ix.close()
    ix.close()  # idempotent
    assert ix.closed
    assert v[2, 2] == 1.0  # the view outlives the index
    with pytest.raises(OSError, match="closed"):
        len(ix)
    with pytest.raises(OSError, match="closed"):
        ix.search(np.ones(4))


def test_empty_store_and_k_larger_than_store(idx):
    r = idx.search(np.ones(DIM), k=5)
    assert isinstance(r, SearchResult) and len(r) == 1
    assert r.counts.tolist() == [0] and r.ids.tolist() == [[-1] * 5]
    assert np.all(np.isneginf(r.scores))
    idx.append(np.eye(DIM)[:3])
    for mode in ("flat", "two_stage"):
        r = idx.search(np.eye(DIM)[:2], k=5, mode=mode)
        assert r.counts.tolist() == [3, 3]
        assert r.ids[0, 0] == 0 and r.ids[1, 0] == 1
        assert r.ids[0, 3:].tolist() == [-1, -1]
        assert r.clusters[0, 0] == -1


def test_search_bad_parameters(idx):
    idx.append(np.eye(DIM)[:3])
    q = np.ones(DIM)
    for kw, msg in [
        (dict(k=0), "k must be"),
        (dict(n_probe=0), "n_probe"),
        (dict(mode="hnsw"), "mode"),
        (dict(mask=np.ones(2, bool)), "mask"),
        (dict(mask=np.ones(3, np.int64)), "bool"),
        (dict(weights=np.ones(4)), "weights"),
        (dict(weights=np.array([1.0, np.nan, 1.0])), "weights"),
        (dict(weights=np.array([1.0, -1.0, 1.0])), "weights"),
        (dict(probe_gap=-0.1), "probe_gap"),
        (dict(probe_gap=float("nan")), "probe_gap"),
        (dict(probe_gap="wide"), "probe_gap"),
        (dict(probe_gap=0.1, min_probe=0), "min_probe"),
    ]:
        with pytest.raises(ValueError, match=msg):
            idx.search(q, **kw)
    with pytest.raises(ValueError, match="columns"):
        idx.search(np.ones(DIM + 1))
    with pytest.raises(ValueError, match="zero"):
        idx.search(np.zeros(DIM))


def test_clusters_lifecycle(idx):
    x, lab, c = blobs(300, 3)
    idx.append(x)
    assert idx.n_pending() == 300
    ids = idx.kmeans(3, seed=1)
    assert ids.dtype == np.int64 and len(ids) == 3
    assert idx.n_pending() == 0
    np.testing.assert_array_equal(idx.cluster_ids(), np.sort(ids))
    assert idx.cluster_sizes().tolist() == [100, 100, 100]
    assert idx.centres().shape == (3, DIM)
    # Each k-means cluster is exactly one blob.
    for cid in ids:
        m = idx.members(cid)
        assert m.dtype == np.int64 and len(set(lab[m])) == 1
    # Centres are the normalised member means.
    for cid, cen in zip(idx.cluster_ids(), idx.centres()):
        np.testing.assert_allclose(cen, unit(x[idx.members(cid)].sum(0)), atol=1e-5)
    owner = {int(r): int(cid) for cid in ids for r in idx.members(cid)}
    assert idx.cluster_of([0, 1, 2]).tolist() == [owner[0], owner[1], owner[2]]
    assert idx.cluster_of(np.arange(300)).tolist() == [owner[r] for r in range(300)]
    assert idx.cluster_of(7).tolist() == [owner[7]]
    with pytest.raises(KeyError):
        idx.members(99)
    with pytest.raises(KeyError):
        idx.cluster_of([300])
    with pytest.raises(ValueError):
        idx.cluster_of([0.5])

    # soft assignment: no state change, padding beyond the cluster count
    sids, ssc = idx.soft_assign(x[:5], k=4)
    assert sids.shape == (5, 4) and ssc.dtype == np.float32
    assert sids[:, 3].tolist() == [-1] * 5 and np.all(np.isneginf(ssc[:, 3]))
    assert sids[:, 0].tolist() == idx.cluster_of(np.arange(5)).tolist()

    # split and merge
    a, b = idx.split(ids[0], seed=0)
    assert ids[0] not in idx.cluster_ids()
    assert len(idx.members(a)) + len(idx.members(b)) == 100
    idx.merge(a, b)
    assert b not in idx.cluster_ids() and len(idx.members(a)) == 100
    assert idx.merge_candidates(0.999) == []
    with pytest.raises(ValueError):
        idx.merge(a, a)
    with pytest.raises(KeyError):
        idx.split(12345)


def test_assign_soft_and_unassign(idx):
    x, lab, c = blobs(60, 3)
    idx.append(x)
    cids = [idx.new_cluster(c[i]) for i in range(3)]
    rows = np.arange(60)
    soft = np.stack([np.array(cids)[lab], np.array(cids)[(lab + 1) % 3], np.full(60, -1)], axis=1)
    idx.assign(rows, soft)
    assert idx.cluster_sizes().tolist() == [20, 20, 20]
    assert len(idx.secondary_members(cids[1])) == 20
    # anchor + members: centre = normalise(weight * anchor + sum)
    m = idx.members(cids[0])
    np.testing.assert_allclose(idx.centres()[0], unit(c[0] + x[m].sum(0)), atol=1e-5)
    idx.set_centre(cids[0], c[0], weight=50.0)
    np.testing.assert_allclose(idx.centres()[0], unit(50 * c[0] + x[m].sum(0)), atol=1e-5)
    # hard reassignment of one row
    idx.assign([0], [cids[2]])
    assert idx.cluster_of([0]).tolist() == [cids[2]]
    idx.unassign([0, 1])
    assert idx.cluster_of([0, 1]).tolist() == [-1, -1]
    with pytest.raises(ValueError, match="members"):
        idx.drop_cluster(cids[1])
    with pytest.raises(KeyError):
        idx.assign([0], [77])
    with pytest.raises(ValueError):
        idx.assign([0, 1], [cids[0]])
    with pytest.raises(ValueError):
        idx.assign([0], [[-1, cids[0]]])
    before = idx.cluster_sizes().tolist()
    with pytest.raises(KeyError):
        idx.assign([2, 999], [cids[0], cids[0]])  # validated first: nothing changed
    assert idx.cluster_sizes().tolist() == before
    e = idx.new_cluster()  # no anchor, no members: no centre, never proposed
    sids, _ = idx.soft_assign(x[:10], k=5)
    assert e not in sids and (sids[:, 4] == -1).all()
    np.testing.assert_array_equal(idx.centres()[-1], np.zeros(DIM, np.float32))
    idx.drop_cluster(e)
    assert e not in idx.cluster_ids()
    with pytest.raises(ValueError, match="weight"):
        idx.new_cluster(c[0], weight=-1)


def test_two_stage_search_finds_blob_members(idx):
    x, lab, c = blobs(2000, 20)
    idx.append(x)
    idx.kmeans(20, seed=0)
    q = x[:50]
    flat = idx.search(q, k=5, mode="flat")
    two = idx.search(q, k=5, n_probe=2)
    assert (two.ids[:, 0] == np.arange(50)).all()
    assert (flat.ids[:, 0] == np.arange(50)).all()
    assert (two.scanned < 2000).all() and (flat.scanned == 2000).all()
    assert two.probed.shape == (50, 2) and flat.probed.shape == (50, 0)
    assert (two.clusters[:, 0] == idx.cluster_of(np.arange(50))).all()
    # mask and weights
    mask = np.ones(2000, bool)
    mask[0] = False
    r = idx.search(x[0], k=3, mask=mask)
    assert 0 not in r.ids[0]
    w = np.ones(2000, np.float32)
    w[0] = 0.5
    r = idx.search(x[0], k=1, weights=w)
    assert r.ids[0, 0] != 0
    # unassigned (pending) rows are still found in two-stage mode
    new = idx.append(unit(np.ones(DIM)))
    r = idx.search(np.ones(DIM), k=1, n_probe=1)
    assert r.ids[0, 0] == new[0] and r.clusters[0, 0] == -1


def test_adaptive_probing_against_numpy(idx):
    """probe_gap: the probed clusters are the best-ranked centres, taken while within
    min_probe, within the gap of the best one, or while fewer than k rows are listed (at most
    n_probe), and the hits are the exact top-k over their members, as numpy computes them."""
    x, lab, c = blobs(3000, 30, spread=0.3, seed=3)
    idx.append(x)
    idx.kmeans(30, seed=0)
    rng = np.random.default_rng(4)
    q = unit(np.concatenate([x[:20] + 0.05 * rng.normal(size=(20, DIM)), rng.normal(size=(20, DIM))]))
    cids, cen = idx.cluster_ids(), idx.centres()
    owner = idx.cluster_of(np.arange(len(x)))
    sizes = idx.cluster_sizes()
    for gap, min_probe, cap, k in [(0.0, 1, 6, 10), (0.05, 1, 6, 10), (0.2, 2, 8, 10), (0.5, 1, 4, 10),
                                   (3.0, 1, 30, 10), (0.0, 1, 8, 250)]:
        r = idx.search(q, k=k, n_probe=cap, probe_gap=gap, min_probe=min_probe)
        assert r.probed.shape == (len(q), cap)
        for i, qv in enumerate(q):
            s = cen @ qv
            order = np.argsort(-s, kind="stable")[:cap]
            want_n, listed = 0, 0
            for j, c in enumerate(order):  # the rule as documented, one cluster at a time
                if not (j < min_probe or s[c] >= s[order[0]] - np.float32(gap) or listed < k):
                    break
                want_n, listed = want_n + 1, listed + sizes[c]
            got = r.probed[i][r.probed[i] >= 0]
            assert len(got) == want_n
            assert (r.probed[i][len(got):] == -1).all()
            # Same set as numpy's ranking (ties within rounding may swap neighbours' order).
            np.testing.assert_allclose(np.sort(s[np.searchsorted(cids, got)])[::-1], s[order[:len(got)]], atol=1e-5)
            rows = np.flatnonzero(np.isin(owner, got))
            assert r.scanned[i] == len(rows)
            exact = rows[np.argsort(-(x[rows] @ qv), kind="stable")[:k]]
            assert set(r.ids[i][: r.counts[i]]) == set(exact)
    # The cap at every cluster and a gap wider than any score difference: flat's answer.
    flat = idx.search(q, k=10, mode="flat")
    every = idx.search(q, k=10, n_probe=len(cids), probe_gap=2.0)
    np.testing.assert_array_equal(every.ids, flat.ids)
    # probe_gap=None keeps the fixed count.
    fixed = idx.search(q, k=10, n_probe=3)
    assert (fixed.probed >= 0).all() and fixed.probed.shape == (len(q), 3)


def test_persistence_round_trip(tmp_path):
    x, lab, c = blobs(500, 5)
    p = tmp_path / "ix"
    with VectorIndex.open(p, dim=DIM) as ix:
        ix.append(x)
        ids = ix.kmeans(5, seed=3)
        t = ix.new_cluster(c[0], weight=2.0)
        ix.assign([0, 1], [[ids[0], t], [ids[1], -1]])
        ix.unassign([2])
        state = (ix.cluster_ids(), ix.centres(), ix.cluster_sizes(), ix.cluster_of(np.arange(500)))
        res = ix.search(x[:20], k=5, n_probe=2)
    with VectorIndex.open(p, dim=DIM) as ix:
        for a, b in zip(state, (ix.cluster_ids(), ix.centres(), ix.cluster_sizes(), ix.cluster_of(np.arange(500)))):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ix.secondary_members(t), [0])
        r2 = ix.search(x[:20], k=5, n_probe=2)
        np.testing.assert_array_equal(res.ids, r2.ids)
        np.testing.assert_array_equal(res.scores, r2.scores)
        assert ix.new_cluster() > max(state[0])  # ids never reused
        ix.append(x[:3])
    with VectorIndex.open(p, dim=DIM) as ix:
        assert len(ix) == 503  # close() flushed
        assert ix.cluster_of([500, 501, 502]).tolist() == [-1, -1, -1]


def test_a_flush_without_syncs_survives_a_process_that_dies(tmp_path):
    """flush(durable=False) (what organisation does without StoreConfig.fsync) saves the
    cluster state for the next open; only a power loss could take it, and rows with it."""
    import subprocess
    import sys
    import textwrap

    p = tmp_path / "ix"
    code = textwrap.dedent(
        f"""
        import os, numpy as np
        from clag_fast.index import VectorIndex
        ix = VectorIndex.open({str(p)!r}, dim=4)
        ix.append(np.eye(4)); ix.kmeans(2); ix.flush(durable=False)
        ix.append(np.ones((2, 4))); ix.assign([4, 5], [ix.cluster_ids()[0]] * 2); ix.flush(durable=False)
        print(ix.cluster_of(np.arange(6)).tolist())
        os._exit(0)  # no close, no durable flush
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    with VectorIndex.open(p, dim=4) as ix:
        assert len(ix) == 6 and ix.n_pending() == 0
        assert str(ix.cluster_of(np.arange(6)).tolist()) == out.strip()


def test_rows_appended_after_flush_are_unassigned_on_reopen(tmp_path):
    import subprocess
    import sys
    import textwrap

    p = tmp_path / "ix"
    code = textwrap.dedent(
        f"""
        import os, numpy as np
        from clag_fast.index import VectorIndex
        ix = VectorIndex.open({str(p)!r}, dim=4)
        ix.append(np.eye(4)); ix.kmeans(2); ix.flush()
        ix.append(np.ones((2, 4)))
        os._exit(0)  # no close, no flush
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with VectorIndex.open(p, dim=4) as ix:
        assert len(ix) == 6
        assert ix.cluster_of(np.arange(6)).tolist()[4:] == [-1, -1]
        assert (ix.cluster_of(np.arange(4)) >= 0).all()
        assert ix.n_pending() == 2


def test_huge_k_is_a_value_error_not_an_abort(idx):
    idx.append(np.eye(DIM)[:2])
    with pytest.raises(ValueError, match="too large"):
        idx.search(np.ones(DIM), k=10**12)
    idx.new_cluster(np.ones(DIM))
    with pytest.raises(ValueError, match="out of range"):
        idx.soft_assign(np.ones(DIM), k=10**12)


def test_concurrent_searches_and_writes_from_threads(idx):
    """The GIL is released around native calls; the index lock keeps readers and writers
    consistent (no crash, no deadlock, every search sees a valid prefix)."""
    import threading

    x, lab, c = blobs(3000, 10)
    idx.append(x[:1000])
    idx.kmeans(10, seed=0)
    errors: list[BaseException] = []
    stop = threading.Event()
    started = threading.Barrier(4)
    searches = [0, 0, 0]

    def reader(i):
        try:
            started.wait(timeout=30)
            # at least one search per reader, even when the writes finish first
            while not stop.is_set() or searches[i] == 0:
                r = idx.search(x[:8], k=5, n_probe=2)
                assert (r.counts == 5).all()
                n = len(idx)
                assert (r.ids[:, 0] < n).all()
                searches[i] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait(timeout=30)  # the readers run while the writes below happen
    for s in range(1000, 3000, 100):
        rows = idx.append(x[s : s + 100])
        ids, _ = idx.soft_assign(x[s : s + 100], k=2)
        idx.assign(rows, ids)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert all(n > 0 for n in searches), searches
    assert len(idx) == 3000 and idx.cluster_sizes().sum() == 3000


def test_member_cache_off_gives_identical_results(tmp_path):
    x, lab, c = blobs(1500, 12)
    p = tmp_path / "ix"
    with VectorIndex.open(p, dim=DIM) as ix:
        ix.append(x)
        ids = ix.kmeans(12, seed=0)
        ix.assign(np.arange(0, 1500, 7), np.stack([ix.cluster_of(np.arange(0, 1500, 7)), np.roll(ids, 1)[lab[::7]]], 1))
        a = ix.search(x[:40], k=8, n_probe=3)
    with VectorIndex.open(p, read_only=True, member_cache=False) as ix:
        b = ix.search(x[:40], k=8, n_probe=3)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.scanned, b.scanned)


def test_degenerate_inputs_do_not_crash(idx):
    same = np.tile(np.eye(DIM)[0], (6, 1))
    idx.append(same)
    ids = idx.kmeans(6, seed=0)  # k == rows, all rows identical
    assert idx.cluster_sizes().sum() == 6 and len(ids) == 6
    big = ids[np.argmax([len(idx.members(c)) for c in ids])]
    if len(idx.members(big)) >= 2:
        a, b = idx.split(big)  # identical members: one side may be empty, but no crash
        assert len(idx.members(a)) + len(idx.members(b)) >= 2
    r = idx.search(np.eye(DIM)[0], k=20, n_probe=50)
    assert r.counts[0] == 6
    live = idx.cluster_ids()
    idx.assign([0, 0, 0], [live[0], live[1], live[1]])  # duplicate rows: the last one wins
    assert idx.cluster_of([0]).tolist() == [live[1]]
    idx.unassign([])
    idx.assign([], np.zeros((0, 2), np.int64))
    with pytest.raises(ValueError):
        idx.kmeans(7)  # more clusters than rows
    with pytest.raises(ValueError):
        idx.new_cluster(np.ones(DIM + 1))
    with pytest.raises(ValueError):
        idx.new_cluster(np.zeros(DIM))
    with pytest.raises(ValueError):
        idx.split(idx.new_cluster(np.ones(DIM)))  # fewer than 2 members
    with pytest.raises(ValueError):
        idx.kmeans(2, rows=[[0, 1]])
    with pytest.raises(KeyError):
        idx.kmeans(1, rows=[-1])


def test_dropped_index_is_flushed(tmp_path):
    import gc

    ix = VectorIndex.open(tmp_path / "ix", dim=4)
    ix.append(np.eye(4))
    ix.kmeans(2)
    del ix
    gc.collect()
    with VectorIndex.open(tmp_path / "ix", dim=4) as again:  # the writer lock was released
        assert len(again) == 4 and (again.cluster_of(np.arange(4)) >= 0).all()


def test_native_stub_matches_the_module():
    """A light stubtest: every public name of the native VectorIndex is in the .pyi and back."""
    import ast
    import pathlib

    import clag_fast._clag_fast as native

    stub = pathlib.Path(native.__file__).with_name("_clag_fast.pyi")
    tree = ast.parse(stub.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VectorIndex")
    stubbed = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    public = {n for n in dir(native.VectorIndex) if not n.startswith("_")} | {"__len__"}
    assert stubbed == public


def test_listed_rows_search_and_its_errors(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    idx = VectorIndex.open(tmp_path / "i", dim=8)
    idx.append(x)
    rows = np.arange(0, 300, 7)
    for dtype in (np.uint32, np.int64):
        res = idx.search(x[14], k=3, mode="flat", rows=rows.astype(dtype))
        assert res.ids[0, 0] == 14 and int(res.scanned[0]) == len(rows)
        assert set(res.ids[0].tolist()) <= set(rows.tolist())
    with pytest.raises(ValueError, match="out of range"):
        idx.search(x[0], k=3, mode="flat", rows=np.asarray([1, 300], np.uint32))
    with pytest.raises(ValueError, match="must lie in"):
        idx.search(x[0], k=3, mode="flat", rows=np.asarray([-1, 2], np.int64))


def test_warm_builds_member_copies_without_changing_results(tmp_path):
    rng = np.random.default_rng(8)
    centres = rng.standard_normal((4, 16)).astype(np.float32)
    x = (centres[rng.integers(0, 4, 2000)] + 0.3 * rng.standard_normal((2000, 16))).astype(np.float32)
    idx = VectorIndex.open(tmp_path / "w", dim=16)
    idx.append(x)
    idx.kmeans(4)
    before = idx.search(x[:20], k=10, n_probe=1)
    assert idx.warm() == 4  # every cluster with members gets its int8 copy
    after = idx.search(x[:20], k=10, n_probe=1)
    assert np.array_equal(before.ids, after.ids) and np.array_equal(before.scores, after.scores)
    idx.close()
    with pytest.raises(OSError):
        idx.warm()


def assert_gathered_copy_searches_alike(idx, queries, rows, block, k):
    """A search of listed rows finds the same rows and scores from a gathered copy of their
    vectors as from the file."""
    a = idx.search(queries, k=k, mode="flat", rows=rows)
    b = idx.search(queries, k=k, mode="flat", rows=rows, rows_vectors=block)
    assert np.array_equal(a.ids, b.ids) and np.allclose(a.scores, b.scores, atol=1e-6)


def test_listed_rows_from_a_gathered_copy_match_and_are_checked(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((500, 8)).astype(np.float32)
    idx = VectorIndex.open(tmp_path / "g", dim=8)
    idx.append(x)
    rows = np.arange(3, 500, 11).astype(np.uint32)
    block = idx.vectors()[rows]
    assert_gathered_copy_searches_alike(idx, x[:5], rows, block, k=4)
    with pytest.raises(ValueError, match="rows_vectors"):
        idx.search(x[0], k=4, mode="flat", rows=rows, rows_vectors=block[1:])
    with pytest.raises(ValueError, match="needs rows"):
        idx.search(x[0], k=4, mode="flat", rows_vectors=block)


def test_gather_copies_rows_cache_line_aligned(tmp_path):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((400, 384)).astype(np.float32)
    idx = VectorIndex.open(tmp_path / "a", dim=384)
    idx.append(x)
    for rows in (np.arange(5, 400, 13).astype(np.uint32), [3, 1, 399], np.asarray([0], np.int64), []):
        block = idx.gather(rows)
        want = idx.vectors()[np.asarray(rows, np.int64)]
        assert block.dtype == np.float32 and block.flags.c_contiguous and block.shape == (len(rows), 384)
        assert np.array_equal(block, want)
        assert not len(rows) or block.ctypes.data % 64 == 0  # every row too: 384 floats are 24 lines
    rows = np.arange(0, 400, 3).astype(np.uint32)
    assert_gathered_copy_searches_alike(idx, x[:3], rows, idx.gather(rows), k=5)
    for bad in ([400], [-1], np.asarray([2**40], np.int64)):
        with pytest.raises(ValueError, match="must lie in"):
            idx.gather(bad)
    with pytest.raises(ValueError, match="must be integers"):
        idx.gather([1.5])


def test_listed_rows_in_any_layout_are_converted_or_refused(tmp_path):
    # contiguous uint32 rows skip the wrapper's conversion; anything else still gets it
    rng = np.random.default_rng(9)
    x = rng.standard_normal((200, 8)).astype(np.float32)
    idx = VectorIndex.open(tmp_path / "l", dim=8)
    idx.append(x)
    rows = np.arange(0, 200, 2).astype(np.uint32)
    want = idx.search(x[4], k=3, mode="flat", rows=rows)
    for same in (rows[::-1].copy(), np.repeat(rows, 2)[::2], rows.tolist(), rows.astype(np.int16), rows.byteswap().view(rows.dtype.newbyteorder())):
        got = idx.search(x[4], k=3, mode="flat", rows=same)
        assert np.array_equal(got.ids, want.ids), type(same)
    with pytest.raises(ValueError, match="1-D array of row numbers"):
        idx.search(x[4], k=3, mode="flat", rows=rows.reshape(2, -1))
    with pytest.raises(ValueError, match="out of range"):
        idx.search(x[4], k=3, mode="flat", rows=np.asarray([0, 200], np.uint32))


def test_search_one_answers_as_search_does(idx):
    """search_one (the store's single-query path) gives search's hits, cut to their count,
    with memory ids mapped through the caller's column, under every probe rule and filter."""
    x, lab, c = blobs(3000, 30, spread=0.3, seed=5)
    idx.append(x)
    idx.kmeans(30, seed=0)
    idx.append(unit(np.random.default_rng(6).normal(size=(7, DIM))))  # pending rows are searched too
    n = len(idx)
    mids = np.arange(n, dtype=np.int64) * 10 + 3
    rng = np.random.default_rng(7)
    mask = rng.random(n) < 0.7
    weights = rng.random(n).astype(np.float32)
    q = unit(np.concatenate([x[:10] + 0.05 * rng.normal(size=(10, DIM)), rng.normal(size=(10, DIM))]))
    cases = [dict(k=5, n_probe=3), dict(k=10, n_probe=8, probe_gap=0.1, min_probe=2),
             dict(k=7, n_probe=4, mask=mask, weights=weights), dict(k=2000, n_probe=30, mode="flat", mask=mask),
             dict(k=10, n_probe=6, probe_gap=0.0, min_rows=50)]
    for kw in cases:
        for qv in q:
            # One query at a time: a batch may take another kernel (scores differ in the last bits).
            ref, i = idx.search(qv, **kw), 0
            rows, scores, clusters, got_mids, scanned, probed = idx.search_one(qv, mids, **kw)
            count = int(ref.counts[i])
            assert rows == ref.ids[i, :count].tolist()
            assert scores == ref.scores[i, :count].tolist()
            assert clusters == ref.clusters[i, :count].tolist()
            assert got_mids == (mids[ref.ids[i, :count]]).tolist()
            assert scanned == int(ref.scanned[i])
            assert probed == [p for p in ref.probed[i].tolist() if p >= 0]
    with pytest.raises(ValueError, match="k must be"):
        idx.search_one(q[0], mids, k=0, n_probe=2)
    with pytest.raises(ValueError, match="NaN|finite"):
        idx.search_one(np.full(DIM, np.nan, np.float32), mids, k=3, n_probe=2)
    for width in (DIM + 1, 2 * DIM, 0):  # two queries' worth, or none, is one query's error too
        with pytest.raises(ValueError, match="dim 16"):
            idx.search_one(np.ones(width, np.float32), mids, k=3, n_probe=2)
    with pytest.raises(ValueError, match="memory_ids has 5 entries"):
        idx.search_one(x[0], mids[:5], k=3, n_probe=2, mode="flat")
    with pytest.raises(ValueError, match="mode must be"):
        idx.search_one(q[0], mids, k=3, n_probe=2, mode="fast")


def test_committed_rows_reads_the_header_alone(tmp_path):
    """committed_rows: the rows a writer committed, readable while it holds the file, and the
    same errors as open for a missing or damaged file; it changes nothing."""
    path = tmp_path / "ix"
    with VectorIndex.open(path, dim=DIM) as ix:
        ix.append(unit(np.random.default_rng(0).normal(size=(7, DIM))))
        ix.flush()
        before = {p.name: p.read_bytes() for p in path.iterdir()}
        assert VectorIndex.committed_rows(path) == 7  # no lock taken: the writer is open
        assert {p.name: p.read_bytes() for p in path.iterdir()} == before
        ix.append(unit(np.random.default_rng(1).normal(size=(2, DIM))))
        ix.flush()
        assert VectorIndex.committed_rows(path) == 9
    assert VectorIndex.committed_rows(path) == 9
    with pytest.raises(OSError, match="no such vector file"):
        VectorIndex.committed_rows(tmp_path / "nowhere")
    raw = bytearray((path / "vectors.f32").read_bytes())
    raw[:8] = b"garbage!"
    (path / "vectors.f32").write_bytes(bytes(raw))
    with pytest.raises(OSError):
        VectorIndex.committed_rows(path)


def test_merge_candidates_match_every_pair_of_centres(tmp_path):
    """merge_candidates works in blocks of centres (upper triangle only, blocks on the thread
    pool): the same pairs, scores and order as every pair of the centre matrix compared, with
    more centres than a block and merged-away slots among them."""
    x, _, _ = blobs(6_000, 700, spread=0.3, seed=3)
    with VectorIndex.open(tmp_path / "ix", dim=DIM) as ix:
        ix.append(x)
        ix.kmeans(600, seed=1)
        ids = ix.cluster_ids()
        for a, b in zip(ids[:40:2].tolist(), ids[1:40:2].tolist()):
            ix.merge(a, b)  # leaves slots without a centre among the rest
        ids, centres = ix.cluster_ids(), ix.centres()
        assert len(ids) > 256
        g = centres.astype(np.float64) @ centres.T.astype(np.float64)
        for threshold in (0.75, 0.5):
            want = {(min(ids[i], ids[j]), max(ids[i], ids[j])): g[i, j]
                    for i in range(len(ids)) for j in range(i + 1, len(ids)) if g[i, j] >= threshold + 1e-4}
            got = ix.merge_candidates(threshold)
            pairs = {(a, b): s for a, b, s in got}
            assert len(pairs) == len(got)
            assert set(want) <= set(pairs), "a pair above the threshold is missing"
            assert all(s >= threshold for s in pairs.values())
            assert all(abs(pairs[p] - want[p]) < 1e-4 for p in want)
            assert [s for _, _, s in got] == sorted((s for _, _, s in got), reverse=True)
            assert want, "the data should give some pairs at this threshold"


def test_merge_candidates_after_changes_equal_a_fresh_comparison(tmp_path):
    """A later merge_candidates compares only the centres written since the last call: the
    answer equals that of an index opened fresh on the same saved state (which compares every
    pair), after merges, new clusters and rows joining clusters."""
    x, _, _ = blobs(6_000, 700, spread=0.3, seed=3)
    with VectorIndex.open(tmp_path / "ix", dim=DIM) as ix:
        ix.append(x[:4_000])
        ix.kmeans(600, seed=1)
        first = ix.merge_candidates(0.75)
        assert first
        for a, b, _ in first[:30]:
            if a in ix.cluster_ids() and b in ix.cluster_ids():
                ix.merge(a, b)
        rows = ix.append(x[4_000:])
        fresh = [ix.new_cluster() for _ in range(300)]
        targets = np.resize(np.asarray(fresh + ix.cluster_ids()[::3].tolist(), np.int64), len(rows))
        ix.assign(rows, targets[:, None])
        got = ix.merge_candidates(0.75)
        ix.flush()
        with VectorIndex.open(tmp_path / "ix", dim=DIM, read_only=True) as again:
            want = again.merge_candidates(0.75)
    assert {(a, b) for a, b, _ in got} == {(a, b) for a, b, _ in want} != {(a, b) for a, b, _ in first}
    sims = {(a, b): s for a, b, s in want}
    assert all(abs(s - sims[(a, b)]) < 1e-5 for a, b, s in got)


def test_split_many_is_split_for_each_and_all_or_nothing(tmp_path):
    """split_many fits the clusters' 2-means side by side: each cluster ends split exactly as
    split() alone splits it (same member sets), and a bad list changes nothing."""
    x, _, _ = blobs(3_000, 60, spread=0.4, seed=4)
    parts = {}
    for name in ("one", "many"):
        with VectorIndex.open(tmp_path / name, dim=DIM) as ix:
            ix.append(x)
            ix.kmeans(12, seed=2)
            ids = sorted(ix.cluster_ids().tolist())[:6]
            if name == "one":
                pairs = [ix.split(c, seed=0) for c in ids]
            else:
                before = {c: ix.members(c).tolist() for c in ix.cluster_ids().tolist()}
                for bad, err in (([ids[0], ids[0]], ValueError), ([ids[0], 987654], KeyError)):
                    with pytest.raises(err):
                        ix.split_many(bad)
                    assert {c: ix.members(c).tolist() for c in ix.cluster_ids().tolist()} == before
                pairs = ix.split_many(ids, seed=0)
            assert len(pairs) == len(ids) and not set(ids) & set(ix.cluster_ids().tolist())
            parts[name] = sorted(sorted(ix.members(c).tolist()) for pair in pairs for c in pair)
            assert sum(len(ix.members(c)) for c in ix.cluster_ids().tolist()) == len(x)
    assert parts["one"] == parts["many"]
    with VectorIndex.open(tmp_path / "tiny", dim=DIM) as ix:
        ix.append(x[:3])
        c = ix.new_cluster(x[0])
        ix.assign(np.array([0]), np.array([c]))
        with pytest.raises(ValueError, match="at least 2"):
            ix.split_many([c])
