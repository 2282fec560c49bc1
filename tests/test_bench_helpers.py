"""The benchmark helpers compute the numbers in BENCHMARKS.md: check them against plain numpy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))

import engines  # noqa: E402
import measure  # noqa: E402
import vector_sets  # noqa: E402


def _unit(rng, n, d=32):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("chunk", [7, 100, 10_000])
def test_exact_topk_matches_full_sort(chunk):
    rng = np.random.default_rng(0)
    base, q = _unit(rng, 1_000), _unit(rng, 20)
    want = np.argsort(-(q @ base.T), axis=1, kind="stable")[:, :10]
    got = vector_sets.exact_topk(base, q, k=10, chunk=chunk)
    np.testing.assert_array_equal(got, want)


def test_recall_counts_overlap_and_ignores_padding():
    truth = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    found = np.array([[4, 3, 9, -1], [8, 7, 6, 5]])
    assert measure.recall_at_k(found, truth) == pytest.approx((2 + 4) / 8)


def test_numpy_assignment_is_top3_by_cosine():
    rng = np.random.default_rng(1)
    rows, centres = _unit(rng, 500), _unit(rng, 40)
    ids, scores = engines.assign_numpy(rows, centres, chunk=64)
    s = rows @ centres.T
    want = np.argsort(-s, axis=1)[:, :3]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(scores, np.take_along_axis(s, want, axis=1), rtol=1e-6)
    assert engines.primary_agreement(ids, want[:100]) == 1.0


def test_clustered_rows_are_unit_and_deterministic():
    c = vector_sets._centres("hard")
    a = vector_sets._clustered_chunk(c, 50, 0.5, seed=3)
    b = vector_sets._clustered_chunk(c, 50, 0.5, seed=3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)


def test_dataset_selection_rejects_unknown_names(monkeypatch):
    monkeypatch.setenv("CLAG_BENCH_SIZES", "100k")
    monkeypatch.setenv("CLAG_BENCH_SETS", "easy,real")
    assert vector_sets.selected() == ["easy-100k", "real"]
    monkeypatch.setenv("CLAG_BENCH_SIZES", "10M")
    with pytest.raises(ValueError, match="unknown size '10M'"):
        vector_sets.selected()
    with pytest.raises(ValueError, match="unknown dataset"):
        vector_sets.load("medium-1M")


def test_every_engine_is_timed_on_the_same_queries(monkeypatch):
    """Equal work: no engine gets fewer (cheaper, noisier) queries than another."""
    ds = vector_sets.VectorSet("x-1M", np.zeros((300_001, 4), np.float32), np.zeros((1_000, 4), np.float32),
                               np.zeros((1_000, 10), np.int64), 10, {})
    monkeypatch.delenv("CLAG_BENCH_QUERIES", raising=False)
    families = ("numpy-brute", "faiss-flat", "faiss-ivf", "usearch-hnsw", "clag", "clag-flat")
    assert {engines.n_queries_for(f, ds) for f in families} == {1_000}
    monkeypatch.setenv("CLAG_BENCH_QUERIES", "100")
    assert {engines.n_queries_for(f, ds) for f in families} == {100}


def test_uneven_sets_have_another_blob_count_and_uneven_blobs():
    w = vector_sets.blob_weights("uneven")
    assert vector_sets.BLOBS["uneven"] != vector_sets.N_CENTRES and len(w) == vector_sets.BLOBS["uneven"]
    assert w.sum() == pytest.approx(1.0) and w.max() / w.min() > 100
    assert vector_sets.blob_weights("easy") is None
    centres = vector_sets._centres("uneven")
    assert centres.shape == (vector_sets.BLOBS["uneven"], vector_sets.DIM)
    x = vector_sets._clustered_chunk(centres, 5_000, vector_sets.SPREAD["uneven"], seed=3, weights=w)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    owner = np.argmax(x @ centres.T, axis=1)  # the easy spread keeps rows by their blob
    counts = np.bincount(owner, minlength=len(centres))
    assert counts[:10].sum() > 10 * counts[-10:].sum()  # the first blobs are far bigger
    assert "uneven-100k" in vector_sets.NAMES


def test_selected_includes_the_uneven_sets(monkeypatch):
    monkeypatch.setenv("CLAG_BENCH_SIZES", "100k")
    monkeypatch.delenv("CLAG_BENCH_SETS", raising=False)
    assert vector_sets.selected() == ["easy-100k", "uneven-100k", "real"]
    monkeypatch.setenv("CLAG_BENCH_SETS", "uneven")
    assert vector_sets.selected() == ["uneven-100k"]


def test_ingest_bench_streams_the_exact_top10_of_its_rows():
    import bench_ingest

    vecs = bench_ingest.Vectors("blobs")
    n, batch = 1_000, 7  # a ragged last chunk
    rows = np.concatenate([vecs.chunk(s, min(batch, n - s)) for s in range(0, n, batch)])
    q = vecs.chunk(50_000, 20)
    want = np.argsort(-(q @ rows.T), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(bench_ingest.exact_top10(vecs, n, batch, q), want)


def test_ingest_bench_defer_mode_owes_one_pass_and_counts_it(tmp_path):
    import bench_ingest

    kw = dict(n=4_000, batch=500, data="blobs", slices=2, queries=20)
    default = bench_ingest.ingest(tmp_path / "a", **kw)
    deferred = bench_ingest.ingest(tmp_path / "b", defer=True, **kw)
    # The default load owes nothing; the deferred one ran fewer passes inside add_many (the
    # cold start only) and then the one it owed, which the end-to-end rate counts.
    assert default["owed"] is None and default["end_to_end_rate"] == default["ingest_rate"]
    assert deferred["passes"] == 1 < default["passes"]
    assert deferred["owed"] is not None and deferred["owed_s"] > 0
    assert deferred["end_to_end_rate"] < deferred["ingest_rate"]
    for res in (default, deferred):
        assert 0.5 <= res["recall10"] <= 1.0 and res["search_p50_ms"] > 0 and res["scanned"] >= 10
    # The printed tables name the owed pass only where there was one.
    assert "organize_deferred" in bench_ingest.table(deferred)
    assert "organize_deferred" not in bench_ingest.table(default)


def test_ingest_bench_records_the_columns_of_its_benchmarks_table():
    import bench_ingest
    import record

    def run(mode, rate, owed):
        return {"mode": mode, "ingest_rate": rate, "owed_s": owed, "end_to_end_rate": rate / 2, "clusters_after_load": 3099,
                "recall10": 0.999, "search_p50_ms": 0.4012, "scanned": 1003.0, "organize_s": 5.1}

    runs = [run("default", 33408.2, 0.0), run("defer", 71655.0, 6.96), run("defer", 73118.0, 6.48)]
    columns = record.load("ingest")["tables"]["load-1m"]["columns"]
    for mode in ("default", "defer"):
        assert list(bench_ingest.recorded_cells(runs, mode)) == columns
    defer = bench_ingest.recorded_cells(runs, "defer")
    assert defer["adds (memories/s)"] == "71,655 / 73,118" and defer["owed pass s"] == "6.96 / 6.48"
    assert defer["clusters"] == "3,099" and defer["recall@10"] == "0.999"  # shared values once
    assert bench_ingest.recorded_cells(runs, "default")["owed pass s"] == "-"
    with pytest.raises(ValueError, match="no defer run"):
        bench_ingest.recorded_cells(runs[:1], "defer")


def test_store_search_bench_records_the_columns_of_its_benchmarks_table():
    import bench_store_search
    import record

    def r(engine, config, recall, warm, p50=None, p99=None):
        return {"engine": engine, "config": config, "recall": recall, "warm_p50_ms": warm, "p50_ms": p50, "p99_ms": p99}

    result = {"n": 1_000_000, "facade_paired": {"overhead_ms": 0.0451},
              "rows": [r("clag_fast", "search() defaults", 0.9997, 0.643, 0.9, 2.1),
                       r("clag_fast", "search_many(300 queries)", 0.9997, 0.316),
                       r("faiss IVFFlat", "nlist 3094, nprobe 1", 0.97, 0.2),
                       r("faiss IVFFlat", "nlist 3094, nprobe 8", 1.0, 0.848)]}
    cells = bench_store_search.recorded_cells(result)
    assert list(cells) == record.load("search")["tables"]["store"]["columns"]
    assert cells["memories"] == "1M" and cells["ratio"] == "0.76x" and cells["first-pass p99/p50"] == "2.33"
    assert cells["faiss IVFFlat at equal recall"] == "nlist 3094, nprobe 8 (1.0000): 0.848"
    assert cells["facade ms"] == "0.045 (call against call)" and cells["search_many ms/query"] == "0.316"
    result["rows"] = result["rows"][:3]  # no faiss row recalls as much as the store
    with pytest.raises(ValueError, match="equal recall"):
        bench_store_search.recorded_cells(result)
