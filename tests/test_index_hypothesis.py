"""Property tests: every native kernel and both searches against plain numpy references."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from clag_fast.index import VectorIndex

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@st.composite
def problems(draw, max_rows=300):
    dim = draw(st.integers(1, 40))
    n = draw(st.integers(0, max_rows))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # Mix of scales (stored rows are normalised) and a few exact duplicates (ties).
    x = rng.normal(size=(n, dim)) * rng.uniform(0.01, 100, size=(n, 1))
    if n > 4:
        x[1] = x[0] * 3
    x[np.linalg.norm(x, axis=1) < 1e-6] = 1.0
    return dim, x, rng


def assert_topk_matches(ids, scores, count, ref_scores, eligible, k, atol=1e-5):
    """ids/scores (one query) equal the numpy top-k up to ties within atol."""
    order = np.argsort(-ref_scores[eligible], kind="stable")
    cand = np.flatnonzero(eligible)[order]
    want = min(k, len(cand))
    assert count == want
    np.testing.assert_allclose(scores[:want], ref_scores[cand[:want]], atol=atol)
    assert len(set(ids[:want].tolist())) == want  # no row twice
    for r, s in zip(ids[:want], scores[:want]):
        assert eligible[r]
        assert abs(ref_scores[r] - s) <= atol
    assert (ids[want:] == -1).all() and np.isneginf(scores[want:]).all()


@SETTINGS
@given(problems())
def test_append_stores_normalised_rows(tmp_path_factory, prob):
    dim, x, _ = prob
    with VectorIndex.open(tmp_path_factory.mktemp("a") / "ix", dim=dim) as ix:
        ix.append(x)
        np.testing.assert_allclose(ix.vectors(), unit(x) if len(x) else x.reshape(0, dim), atol=1e-6)


@SETTINGS
@given(problems(), st.integers(1, 12), st.data())
def test_flat_search_matches_numpy(tmp_path_factory, prob, k, data):
    dim, x, rng = prob
    n = len(x)
    q = rng.normal(size=(data.draw(st.integers(1, 4)), dim)) + 0.01
    mask = rng.random(n) < data.draw(st.floats(0, 1)) if data.draw(st.booleans()) else None
    w = rng.uniform(0, 2, n).astype(np.float32) if data.draw(st.booleans()) else None
    with VectorIndex.open(tmp_path_factory.mktemp("f") / "ix", dim=dim) as ix:
        ix.append(x)
        r = ix.search(q, k=k, mode="flat", mask=mask, weights=w)
        v = ix.vectors().astype(np.float64)
    ref = unit(q) @ v.T if n else np.zeros((len(q), 0))
    if w is not None:
        ref = ref * w
    elig = np.ones(n, bool) if mask is None else mask
    for i in range(len(q)):
        assert_topk_matches(r.ids[i], r.scores[i], r.counts[i], ref[i], elig, k)
        assert r.scanned[i] == elig.sum()


@SETTINGS
@given(problems(max_rows=200), st.integers(1, 6), st.integers(1, 5), st.data())
def test_soft_assign_matches_numpy(tmp_path_factory, prob, c, k, data):
    dim, x, rng = prob
    if len(x) == 0:
        x = rng.normal(size=(3, dim)) + 0.1
    centres = rng.normal(size=(c, dim)) + 0.01
    with VectorIndex.open(tmp_path_factory.mktemp("s") / "ix", dim=dim) as ix:
        cids = np.array([ix.new_cluster(cen) for cen in centres])
        ids, sc = ix.soft_assign(x, k=k)
    ref = unit(x) @ unit(centres).T
    for i in range(len(x)):
        pos = {int(cid): j for j, cid in enumerate(cids)}
        want = np.sort(ref[i])[::-1][:k]
        got = sc[i][: min(k, c)]
        np.testing.assert_allclose(got, want, atol=1e-5)
        for cid, s in zip(ids[i][: min(k, c)], got):
            assert abs(ref[i, pos[int(cid)]] - s) <= 1e-5
        assert (ids[i][c:] == -1).all()


def numpy_two_stage(v, centres, cids, members, pending, q, k, n_probe, mask, w):
    """Reference: top-n_probe centres, then exact top-k over their members + pending rows."""
    probe = np.argsort(-(centres @ q), kind="stable")[:n_probe]
    cand = set(pending)
    for j in probe:
        cand |= members[int(cids[j])]
    cand = np.array(sorted(cand), np.int64)
    s = np.full(len(v), -np.inf)
    if len(cand):
        s[cand] = v[cand] @ q
        if w is not None:
            s[cand] *= w[cand]
    elig = np.zeros(len(v), bool)
    elig[cand] = True
    if mask is not None:
        elig &= mask
    return s, elig


@SETTINGS
@given(problems(), st.integers(1, 8), st.integers(1, 10), st.data())
def test_two_stage_matches_numpy_reference(tmp_path_factory, prob, c, k, data):
    dim, x, rng = prob
    n = len(x)
    assume(n >= c + 5)
    n_probe = data.draw(st.integers(1, c + 1))
    with VectorIndex.open(tmp_path_factory.mktemp("t") / "ix", dim=dim) as ix:
        ix.append(x)
        cids = ix.kmeans(c, rows=np.arange(n - 5), seed=data.draw(st.integers(0, 5)))
        # Secondary memberships for a random subset; the last 5 rows stay pending.
        ids = ix.cluster_ids()
        sec_rows = np.flatnonzero(rng.random(n - 5) < 0.3)
        if len(sec_rows):
            prim = ix.cluster_of(sec_rows)
            sec = rng.choice(ids, size=len(sec_rows))
            ix.assign(sec_rows, np.stack([prim, sec], axis=1))
        mask = rng.random(n) < 0.8 if data.draw(st.booleans()) else None
        w = rng.uniform(0.1, 2, n).astype(np.float32) if data.draw(st.booleans()) else None
        q = rng.normal(size=(3, dim)) + 0.01
        r = ix.search(q, k=k, n_probe=n_probe, mask=mask, weights=w)
        v = ix.vectors().astype(np.float64)
        centres = ix.centres().astype(np.float64)
        members = {int(cid): set(ix.members(cid).tolist()) | set(ix.secondary_members(cid).tolist()) for cid in ids}
        assert set(cids.tolist()) <= set(ids.tolist())
    for i in range(len(q)):
        qq = unit(q[i])
        # Stage 1 near-ties could legitimately pick a different cluster: draw again.
        cs = np.sort(centres @ qq)[::-1]
        assume(not (n_probe < len(cs) and cs[n_probe - 1] - cs[n_probe] < 1e-5))
        s, elig = numpy_two_stage(v, centres, ids, members, range(n - 5, n), qq, k, n_probe, mask, w)
        assert_topk_matches(r.ids[i], r.scores[i], r.counts[i], s, elig, k)
        assert r.scanned[i] == elig.sum()
        assert set(r.probed[i].tolist()) == set(ids[np.argsort(-(centres @ qq), kind="stable")[:n_probe]].tolist())


@SETTINGS
@given(problems(max_rows=150), st.integers(1, 5))
def test_two_stage_with_every_cluster_probed_equals_flat(tmp_path_factory, prob, c):
    dim, x, rng = prob
    assume(len(x) >= c)
    with VectorIndex.open(tmp_path_factory.mktemp("e") / "ix", dim=dim) as ix:
        ix.append(x)
        ix.kmeans(c, seed=0)
        q = rng.normal(size=(2, dim)) + 0.01
        a = ix.search(q, k=7, mode="flat")
        b = ix.search(q, k=7, n_probe=len(ix.cluster_ids()))
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)
    np.testing.assert_array_equal(a.counts, b.counts)


@SETTINGS
@given(problems(max_rows=200), st.integers(1, 6), st.integers(0, 3))
def test_kmeans_is_a_deterministic_partition_with_mean_centres(tmp_path_factory, prob, c, seed):
    dim, x, _ = prob
    assume(len(x) >= c)
    out = []
    for _ in range(2):
        with VectorIndex.open(tmp_path_factory.mktemp("k") / "ix", dim=dim) as ix:
            ix.append(x)
            ids = ix.kmeans(c, seed=seed)
            labels = ix.cluster_of(np.arange(len(x)))
            assert set(labels.tolist()) <= set(ids.tolist())
            assert ix.cluster_sizes().sum() == len(x)
            v = ix.vectors().astype(np.float64)
            for cid, cen in zip(ix.cluster_ids(), ix.centres()):
                m = ix.members(cid)
                total = v[m].sum(0)
                # Members that cancel out (x and -x) leave no direction to compare with.
                if len(m) and np.linalg.norm(total) > 1e-3:
                    np.testing.assert_allclose(cen, unit(total), atol=1e-5)
            out.append((labels, ix.centres()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


@st.composite
def blob_problems(draw):
    """Stores big enough that stage 2 scans int8 member codes (see rust/quant.rs)."""
    dim = draw(st.sampled_from([16, 64, 100, 384]))
    # >= 333 rows per cluster on average: most probes exceed the 4 x (4k + 32) rows (k <= 10)
    # under which stage 2 skips the codes, so most draws exercise the int8 path.
    n = draw(st.integers(2000, 3500))
    c = draw(st.integers(2, 6))
    spread = draw(st.sampled_from([0.05, 0.3, 1.0, 3.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    centres = rng.normal(size=(c, dim))
    x = centres[rng.integers(0, c, n)] + spread * rng.normal(size=(n, dim)) / np.sqrt(dim) * np.linalg.norm(centres, axis=1).mean()
    return dim, x, c, rng


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob_problems(), st.integers(1, 10), st.data())
def test_int8_stage_two_returns_exact_scores_of_the_true_top_k(tmp_path_factory, prob, k, data):
    """The int8 scan only shortlists; returned scores are exact and only near-ties may swap.

    Checked against numpy: the probed clusters are numpy's nearest centres, the scanned count
    is numpy's candidate count, every returned score equals numpy's exact score, and a row of
    numpy's true top-k may be missing only when int8 rounding (|error| well under 0.01 for
    unit vectors) let more than the shortlist's depth of rows outrank it, i.e. only within a
    hair of the k-th score.
    """
    dim, x, c, rng = prob
    n_probe = data.draw(st.integers(1, c))
    mask = rng.random(len(x)) < 0.8 if data.draw(st.booleans()) else None
    w = rng.uniform(0.5, 1.5, len(x)).astype(np.float32) if data.draw(st.booleans()) else None
    q = x[rng.integers(0, len(x), 3)] + 0.01 * rng.normal(size=(3, dim))
    with VectorIndex.open(tmp_path_factory.mktemp("q8") / "ix", dim=dim) as ix:
        ix.append(x)
        ix.kmeans(c, seed=0)
        r = ix.search(q, k=k, n_probe=n_probe, mask=mask, weights=w)
        v = ix.vectors().astype(np.float64)
        cids = ix.cluster_ids()
        centres = ix.centres().astype(np.float64)
        members = {int(cid): set(ix.members(cid).tolist()) | set(ix.secondary_members(cid).tolist()) for cid in cids}
    for i in range(len(q)):
        qq = unit(q[i])
        cs = np.sort(centres @ qq)[::-1]
        assume(not (n_probe < len(cs) and cs[n_probe - 1] - cs[n_probe] < 1e-5))  # stage-1 near-tie
        s, elig = numpy_two_stage(v, centres, cids, members, [], qq, k, n_probe, mask, w)
        true_top = np.flatnonzero(elig)[np.argsort(-s[elig], kind="stable")][:k]
        n = r.counts[i]
        assert n == len(true_top)
        assert r.scanned[i] == elig.sum()
        assert set(r.probed[i].tolist()) == set(cids[np.argsort(-(centres @ qq), kind="stable")[:n_probe]].tolist())
        ids, sc = r.ids[i, :n], r.scores[i, :n]
        np.testing.assert_allclose(sc, s[ids], atol=1e-5)  # exact f32 re-scores
        assert (np.diff(sc) <= 1e-7).all() and len(set(ids.tolist())) == n
        assert elig[ids].all()
        kth = sc[-1] if n else np.inf
        for m in set(true_top.tolist()) - set(ids.tolist()):
            assert s[m] - kth < 0.01, (m, s[m], kth)
