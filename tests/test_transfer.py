"""Export and import (``MemoryStore.export`` / ``import_``, ``clag-fast export`` / ``import``):
exact round trips in JSONL and Parquet, idempotent and resumable imports (a malformed line, an
injected failure, a killed process), imports into stores that hold memories, widths, and the
importers from Chroma, mem0 and LangGraph with the real packages where they install."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from clag_fast import DimensionMismatchError, MalformedRecordError, MemoryStore, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import transfer
from clag_fast.store.catalog import Catalog
from store_helpers import run_until_killed, topic_vectors

ROOT = Path(__file__).resolve().parents[1]
CFG = StoreConfig(slm="off")


def open_store(path, **kw):
    kw.setdefault("config", CFG)
    kw.setdefault("embedder", False)
    return MemoryStore.open(path, slm=False, **kw)


def build(path, n=600, seed=0, dim=384):
    """A store with keyed and keyless memories, several namespaces and kinds, metadata
    (nested, unicode, none), accesses, clusters with profiles and archived memories."""
    vecs, topics = topic_vectors(n, 6, seed=seed, dim=dim)
    with open_store(path) as s:
        ids = s.add_many([f"note {i} about topic {t} ü" for i, t in enumerate(topics.tolist())], embeddings=vecs,
                         kinds=["fact" if i % 3 else "dialogue" for i in range(n)],
                         namespaces=[f"u{i % 3}" for i in range(n)],
                         metadata=[None if i % 4 == 0 else {"i": i, "tags": ["a", "é"], "deep": {"x": i / 7}}
                                   for i in range(n)],
                         keys=[f"key-{i}" if i % 2 else None for i in range(n)])
        s.organize()
        for q in vecs[:20]:
            s.search(q, k=3)
        biggest = s.clusters()[0].id
        s.forget_cluster(biggest)  # its members are archived: exported and imported as such
        s.delete(ids[3])
        s.flush()
    return ids, vecs


def snapshot(s):
    """Everything a round trip must keep: every memory (live and archived) and every live
    cluster. A memory's pairs naming a cluster that is no longer live (archived by
    ``forget_cluster``) are left out: an export carries live clusters only."""
    clusters = s.clusters()
    live = {c.id for c in clusters}
    mems = [dataclasses.replace(m, clusters=[p for p in m.clusters if p[0] in live])
            for m in s.get_many(list(range(1, 10_000)))]
    return mems, clusters


def memory_records(path, live):
    """The memory records of a JSONL export, pairs of clusters outside ``live`` left out."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines()[1:]:
        rec = json.loads(line)
        if "cluster" not in rec:
            rec["clusters"] = [p for p in rec["clusters"] if p[0] in live]
            out.append(rec)
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_round_trip_is_exact(tmp_path, fmt):
    ids, _ = build(tmp_path / "a")
    out = tmp_path / f"a.{fmt}"
    with open_store(tmp_path / "a") as a:
        report = a.export(out)
        mems_a, clusters_a = snapshot(a)
        a.export(tmp_path / "a2.jsonl")
    assert report["memories"] == len(mems_a) == 599 and any(m.archived for m in mems_a)
    with open_store(tmp_path / "b") as b:
        got = b.import_(out)
        assert got["imported"] == 599 and got["skipped"] == 0 and got["clusters"] == len(clusters_a)
        mems_b, clusters_b = snapshot(b)
        b.export(tmp_path / "b.jsonl")
    # Ids, keys, namespaces, kinds, texts, metadata, times, counts, strength, archived, clusters.
    assert mems_b == mems_a
    assert clusters_b == clusters_a
    # Vectors bit for bit (the same base64), and every other field: the second export's
    # records are the first's.
    live = {c.id for c in clusters_a}
    assert memory_records(tmp_path / "b.jsonl", live) == memory_records(tmp_path / "a2.jsonl", live)


def test_parquet_vectors_read_whether_or_not_their_elements_may_be_null(tmp_path):
    """The export declares the vector and cluster elements non-null (faster to read); a file
    another tool wrote with nullable elements reads to the same store."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    build(tmp_path / "a", n=300)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.parquet")
        live = {c.id for c in a.clusters()}
    table = pq.read_table(tmp_path / "a.parquet")
    vec = table.schema.field("vector")
    assert not vec.type.value_field.nullable
    loose = table.schema.set(table.schema.get_field_index("vector"),
                             pa.field("vector", pa.list_(pa.float32(), vec.type.list_size), nullable=False))
    loose = loose.set(loose.get_field_index("clusters"),
                      pa.field("clusters", pa.list_(pa.struct([("id", pa.int64()), ("affinity", pa.float32())]))))
    pq.write_table(table.cast(loose), tmp_path / "loose.parquet")
    assert pq.read_schema(tmp_path / "loose.parquet").field("vector").type.value_field.nullable
    for name in ("a", "loose"):
        with open_store(tmp_path / f"b-{name}") as b:
            assert b.import_(tmp_path / f"{name}.parquet")["imported"] == 299
            b.export(tmp_path / f"b-{name}.jsonl")
    assert memory_records(tmp_path / "b-loose.jsonl", live) == memory_records(tmp_path / "b-a.jsonl", live)


def test_the_native_check_leaves_only_what_it_cannot_confirm():
    from clag_fast import _clag_fast

    values = [None, '{"a": 1}', " {} ", "[1]", '{"x": NaN}', {"a": 1}, "nope", '{"é": "ü"}', 3]
    assert _clag_fast.unconfirmed_objects(values) == [3, 4, 5, 6, 8]


@pytest.mark.parametrize("bad, message", [("not json", "is not valid JSON"), ("[1, 2]", "must be a JSON object"),
                                          ('{"a": 1', "is not valid JSON")])
def test_parquet_metadata_that_is_not_a_json_object_names_its_row(tmp_path, bad, message):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    build(tmp_path / "a", n=120)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.parquet")
    table = pq.read_table(tmp_path / "a.parquet")
    meta = table.column("metadata").to_pylist()
    # Row 40 (from 1) is bad; rows written by other tools read as they stand: spaces, NaN.
    meta[39], meta[10], meta[11] = bad, '{ "spaced" :  [1, 2] }', '{"x": NaN}'
    at = table.schema.get_field_index("metadata")
    pq.write_table(table.set_column(at, table.schema.field("metadata"), pa.array(meta, pa.string())),
                   tmp_path / "bad.parquet")
    with open_store(tmp_path / "b") as b:
        with pytest.raises(MalformedRecordError, match=f"bad.parquet row 40: metadata {message}.* 39 records before"):
            b.import_(tmp_path / "bad.parquet")
        ids = table.column("id").to_pylist()
        assert b.get(ids[10]).metadata == {"spaced": [1, 2]}
        assert math.isnan(b.get(ids[11]).metadata["x"])  # as json.loads reads it
        with pytest.raises(KeyError):
            b.get(ids[39])


def test_the_imported_store_searches_like_the_original(tmp_path):
    ids, vecs = build(tmp_path / "a")
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
        want = [[(h.memory_id, h.cluster_id) for h in a.search(v, k=5)] for v in vecs[100:110]]
    with open_store(tmp_path / "b") as b:
        b.import_(tmp_path / "a.jsonl")
        got = [[(h.memory_id, h.cluster_id) for h in b.search(v, k=5)] for v in vecs[100:110]]
        assert got == want
    # The lexical index holds the imported texts too (BM25 alone: lexical_weight=1), for a
    # memory of namespace u2 that is live (the biggest cluster's members were archived).
    with open_store(tmp_path / "b", embedder=HashingEmbedder(384)) as b:
        i = next(i for i in range(101, 200, 3) if not b.get(ids[i]).archived)
        assert b.search(f"note {i}", k=1, namespace="u2", lexical_weight=1.0)[0].memory_id == ids[i]


def test_a_second_run_skips_everything(tmp_path):
    build(tmp_path / "a", n=300)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.parquet")
    with open_store(tmp_path / "b") as b:
        first = b.import_(tmp_path / "a.parquet")
        again = b.import_(tmp_path / "a.parquet")
        assert again == dict(again, read=first["read"], imported=0, skipped=first["read"], clusters=0)
        assert len(b) == 300 - 1 - sum(1 for m in snapshot(b)[0] if m.archived)


def test_import_into_a_store_that_holds_memories(tmp_path):
    build(tmp_path / "a", n=300)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
        mems_a, clusters_a = snapshot(a)
    own, _ = topic_vectors(50, 2, seed=9)
    with open_store(tmp_path / "b") as b:
        mine = b.add_many([f"own {i}" for i in range(50)], embeddings=own, namespace="u0")
        b.organize()
        own_clusters = {c.id for c in b.clusters()}
        got = b.import_(tmp_path / "a.jsonl")
        assert got["imported"] == len(mems_a)
        # New ids; keyed records keep their keys, keyless ones get a derived key.
        mems_b = [m for m in snapshot(b)[0] if m.memory_id not in mine]
        assert sorted(m.text for m in mems_b) == sorted(m.text for m in mems_a)
        assert {m.key for m in mems_b if not m.key.startswith("import:")} == {m.key for m in mems_a if m.key}
        # The export's clusters sit beside the store's own ones, with their profiles.
        assert own_clusters <= {c.id for c in b.clusters()}
        assert sorted(c.summary for c in b.clusters() if c.id not in own_clusters) == \
            sorted(c.summary for c in clusters_a)
        # A re-run (and an import of another export of the same store) stores nothing twice.
        assert b.import_(tmp_path / "a.jsonl")["imported"] == 0
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "again.parquet")
    with open_store(tmp_path / "b") as b:
        assert b.import_(tmp_path / "again.parquet")["imported"] == 0
        assert len(snapshot(b)[0]) == 50 + len(mems_a)


def test_a_malformed_line_names_its_number_and_loses_nothing(tmp_path):
    build(tmp_path / "a", n=200)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
        n_clusters = len(a.clusters())
    lines = (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    first_memory = 1 + 1 + n_clusters  # 1-based: header, clusters, then memories
    bad_at = first_memory + 120
    broken = lines.copy()
    broken[bad_at - 1] = broken[bad_at - 1][:200] + "\n"  # cut mid-record
    (tmp_path / "bad.jsonl").write_text("".join(broken), encoding="utf-8")
    with open_store(tmp_path / "b") as b:
        with pytest.raises(MalformedRecordError, match=rf"bad.jsonl line {bad_at}: not valid JSON") as e:
            b.import_(tmp_path / "bad.jsonl", batch_size=50)
        assert e.value.position.endswith(f"line {bad_at}") and e.value.imported == 120
        assert len(snapshot(b)[0]) == 120  # every record before it, none after
        # A record that parses but does not check: named too, same rule.
        bad2 = json.loads(lines[first_memory + 150 - 1])
        bad2["vector"] = bad2["vector"][:-8] + "!!!!!!!!"
        fixed = lines.copy()
        fixed[first_memory + 150 - 1] = json.dumps(bad2) + "\n"
        (tmp_path / "bad.jsonl").write_text("".join(fixed), encoding="utf-8")
        with pytest.raises(MalformedRecordError, match=rf"line {first_memory + 150}: vector is not base64"):
            b.import_(tmp_path / "bad.jsonl", batch_size=64)
        assert len(snapshot(b)[0]) == 150
        b.import_(tmp_path / "a.jsonl")
        mems = snapshot(b)[0]
    with open_store(tmp_path / "a") as a:
        assert mems == snapshot(a)[0]


@pytest.mark.parametrize("record, message", [
    ({"text": ""}, "text is empty"),
    ({"vector": [1.0, 2.0]}, "text is missing"),
    ({"text": "x", "vector": [0.0, 0.0]}, "vector is all zeros"),
    ({"text": "x", "vector": [1.0, float("nan")]}, "vector holds NaN or infinity"),
    ({"text": "x", "vector": [1.0, 2.0, 3.0]}, "vector has 3 values, the import holds 2-dimensional"),
    ({"text": "x", "vector": [1.0, 2.0], "colour": "red"}, r"unknown field\(s\) \['colour'\]"),
    ({"text": "x", "vector": [1.0, 2.0], "created_at": "yesterday"}, "created_at must be a number"),
    ({"text": "x", "vector": [1.0, 2.0], "metadata": [1, 2]}, "metadata must be an object"),
    ({"text": "x", "vector": [1.0, 2.0], "key": ""}, "key must be a non-empty string"),
    ({"text": "x", "vector": [1.0, 2.0], "archived": "no"}, "archived must be true or false"),
    ({"text": "x", "vector": [1.0, 2.0], "clusters": [[1, "high"]]}, r"clusters\[0\] must be"),
])
def test_each_bad_field_is_named_with_its_position(tmp_path, record, message):
    good = [{"text": f"fine {i}", "vector": [1.0, float(i)], "key": f"k{i}"} for i in range(3)]
    with open_store(tmp_path / "s") as s:
        with pytest.raises(MalformedRecordError, match=f"item 4: {message}"):
            s.import_(good + [record] + good)
        assert sorted(m.key for m in s.get_many(list(range(1, 10)))) == ["k0", "k1", "k2"]


def test_an_injected_failure_midway_then_a_rerun_stores_each_key_once(tmp_path, monkeypatch):
    build(tmp_path / "a", n=400)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
        want = snapshot(a)[0]
    calls = {"n": 0}
    real = Catalog.import_rows

    def failing(self, columns, rows):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (injected)")
        return real(self, columns, rows)

    monkeypatch.setattr(Catalog, "import_rows", failing)
    with open_store(tmp_path / "b") as b:
        with pytest.raises(OSError, match="injected"):
            b.import_(tmp_path / "a.jsonl", batch_size=100)
        assert len(snapshot(b)[0]) == 200  # two batches committed, the third rolled back whole
        monkeypatch.setattr(Catalog, "import_rows", real)
        report = b.import_(tmp_path / "a.jsonl", batch_size=100)
        assert report["skipped"] == 200 and report["imported"] == len(want) - 200
        assert snapshot(b)[0] == want


KILLED_IMPORT = """
import sys
sys.path[:0] = {paths!r}
from clag_fast import MemoryStore, StoreConfig
with MemoryStore.open({store!r}, config=StoreConfig(slm="off"), embedder=False, slm=False) as s:
    s.import_({source!r}, batch_size=500, progress=lambda done, total: print(done, flush=True))
"""


@pytest.mark.parametrize("into", ["empty", "holding"])
def test_an_import_killed_midway_and_rerun_ends_with_each_key_once(tmp_path, into):
    vecs, topics = topic_vectors(6000, 12, seed=3)
    with open_store(tmp_path / "a") as a:
        a.add_many([f"m{i}" for i in range(6000)], embeddings=vecs,
                   keys=[f"k{i}" if i % 2 else None for i in range(6000)], namespaces=[f"n{i % 2}" for i in range(6000)])
        a.organize()
        a.export(tmp_path / "a.jsonl")
        want = {(m.namespace, m.key, m.text) for m in a.get_many(list(range(1, 6001)))}
        whole = snapshot(a)
    store = tmp_path / "b"
    if into == "holding":
        with open_store(store) as b:
            b.add_many(["mine"], embeddings=vecs[:1], keys=["own"])
    code = KILLED_IMPORT.format(paths=[str(ROOT / "python")], store=str(store), source=str(tmp_path / "a.jsonl"))
    printed = run_until_killed(code, min_lines=2)
    assert printed and int(printed[-1]) < 6000  # killed midway
    with open_store(store) as b:
        partial = len(b)
        assert partial >= int(printed[-1]) and partial < 6000 + (into == "holding")
        b.import_(tmp_path / "a.jsonl")
        got = b.get_many(list(range(1, 20_000)))
        found = [(m.namespace, m.key, m.text) for m in got if m.key != "own"]
        if into == "holding":  # keyless records are known by their derived key
            found = [(ns, None if k.startswith("import:") else k, t) for ns, k, t in found]
        assert len(found) == 6000 and set(found) == want
        assert b.search(vecs[4000], k=1)[0].text == "m4000"
        if into == "empty":
            # Exact, clusters included: the rows the killed run committed after its last
            # index save were placed from their assignment records on reopen.
            assert snapshot(b) == whole


def test_a_new_store_takes_the_exports_width_and_a_fixed_one_refuses_another(tmp_path):
    v, _ = topic_vectors(40, 2, seed=4, dim=1536)
    with open_store(tmp_path / "wide") as s:
        s.add_many([f"w{i}" for i in range(40)], embeddings=v)
        s.export(tmp_path / "wide.jsonl")
    with MemoryStore.open(tmp_path / "new", slm=False) as s:  # default embedder, nothing added yet
        s.import_(tmp_path / "wide.jsonl")
        assert s.config.dim == 1536 and len(s) == 40
    with open_store(tmp_path / "narrow", config=CFG.replace(dim=384)) as s:
        with pytest.raises(DimensionMismatchError, match="1536-dimensional.*holds 384-dimensional ones; nothing"):
            s.import_(tmp_path / "wide.jsonl")
        assert len(s) == 0


def test_records_without_vectors_are_embedded_or_refused(tmp_path):
    records = [{"text": "green tea in the morning", "key": "tea"}, {"text": "a walk at noon", "key": "walk"}]
    with MemoryStore.open(tmp_path / "e", embedder=HashingEmbedder(64), config=CFG, slm=False) as s:
        assert s.import_(records)["imported"] == 2
        assert s.search("green tea", k=1)[0].key == "tea"
    with open_store(tmp_path / "f") as s:
        with pytest.raises(MalformedRecordError, match="item 1: the record has no vector and the store has no embedder"):
            s.import_(records)


def test_header_less_jsonl_and_keyless_records_import_once(tmp_path):
    lines = [json.dumps({"text": f"plain {i}", "vector": [1.0, float(i), 0.5]}) for i in range(5)]
    (tmp_path / "plain.jsonl").write_text("\n".join(lines + [lines[2]]) + "\n\n", encoding="utf-8")
    with open_store(tmp_path / "s") as s:
        first = s.import_(tmp_path / "plain.jsonl")
        assert first["imported"] == 5 and first["skipped"] == 1  # the repeated line is the same record
        assert s.import_(io.BytesIO((tmp_path / "plain.jsonl").read_bytes()))["imported"] == 0
        assert len(s) == 5


def test_export_of_one_namespace_and_of_one_cluster(tmp_path):
    build(tmp_path / "a", n=300)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "u1.jsonl", namespace="u1")
        target = next(c for c in a.clusters() if c.size >= 3)
        a.export(tmp_path / "c.parquet", cluster=target.id)
        members = a.cluster(target.id, limit=1000).members
        n_u1 = sum(1 for m in snapshot(a)[0] if m.namespace == "u1")
    with open_store(tmp_path / "b") as b:
        assert b.import_(tmp_path / "u1.jsonl")["imported"] == n_u1
        assert b.namespaces() == ["u1"]
    with open_store(tmp_path / "c") as c:
        c.import_(tmp_path / "c.parquet")
        (only,) = c.clusters()
        assert (only.id, only.summary, only.size) == (target.id, target.summary, target.size)
        assert [m.memory_id for m in c.cluster(target.id, limit=1000).members] == [m.memory_id for m in members]
    with open_store(tmp_path / "a") as a:
        with pytest.raises(KeyError, match="no cluster with id 999999"):
            a.export(tmp_path / "x.jsonl", cluster=999_999)


def test_clusters_route_places_records_by_vector(tmp_path):
    build(tmp_path / "a", n=300)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
    with open_store(tmp_path / "b") as b:
        got = b.import_(tmp_path / "a.jsonl", clusters="route")
        assert got["clusters"] == 0 and got["imported"] > 250
        assert b.clusters() and b.stats()["memories"] == len(b)  # the cold start ran on the imported rows


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with open_store(tmp_path / "s") as s:
        s.add("x", embedding=np.ones(8, np.float32))
        with pytest.raises(ImportError, match=r"need pyarrow: pip install pyarrow \(or 'clag_fast\[transfer\]'\), or use .jsonl"):
            s.export(tmp_path / "s.parquet")
        with pytest.raises(ImportError, match="need pyarrow"):
            s.import_(tmp_path / "s.parquet")


def test_unknown_suffix_and_source_types_are_refused(tmp_path):
    with open_store(tmp_path / "s") as s:
        with pytest.raises(ValueError, match="format='jsonl' or 'parquet'"):
            s.export(tmp_path / "s.csv")
        with pytest.raises(TypeError, match="iterable of record dicts"):
            s.import_({"text": "one record, not a list"})
        with pytest.raises(ValueError, match="clusters must be 'keep' or 'route'"):
            s.import_([], clusters="merge")


# -- importers ---------------------------------------------------------------------------------
def test_chroma_collection(tmp_path):
    chromadb = pytest.importorskip("chromadb")
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    col = client.get_or_create_collection("notes", embedding_function=None)
    vecs = np.random.default_rng(0).standard_normal((2500, 32)).astype(np.float32)
    col.add(ids=[f"doc-{i}" for i in range(2500)], documents=[f"chroma doc {i}" for i in range(2500)],
            metadatas=[{"n": i, "even": i % 2 == 0} for i in range(2500)], embeddings=vecs)
    with open_store(tmp_path / "s") as s:
        got = s.import_(transfer.from_chroma(col, namespace="chroma"))
        assert got["imported"] == 2500
        m = s.get(key="doc-7", namespace="chroma")
        assert m.text == "chroma doc 7" and m.metadata == {"n": 7, "even": False}
        assert s.search(vecs[7], k=1)[0].key == "doc-7"
        assert s.import_(transfer.from_chroma(col, namespace="chroma"))["imported"] == 0
    # The CLI reads the persistent directory itself.
    r = _cli("import", str(tmp_path / "chroma"), "--store", str(tmp_path / "t"), "--from", "chroma",
             "--collection", "notes", "--no-embedder")
    assert r.returncode == 0, r.stderr
    assert "imported 2500" in r.stdout


def test_mem0_dump_reads_back_through_the_mem0_interface(tmp_path):
    from clag_fast.compat.mem0 import Memory as Mem0

    emb = HashingEmbedder(64)
    with MemoryStore.open(tmp_path / "src", embedder=emb, config=CFG, slm=False) as src_store:
        src = Mem0(store=src_store, embedder=emb)
        src.add("I am vegetarian", user_id="alice", infer=False)
        src.add("Likes hiking in the Alps", user_id="alice", agent_id="planner", infer=False)
        dump = src.get_all(user_id="alice")
    (tmp_path / "mem0.json").write_text(json.dumps(dump), encoding="utf-8")
    with MemoryStore.open(tmp_path / "dst", embedder=emb, config=CFG, slm=False) as dst_store:
        assert dst_store.import_(transfer.from_mem0(tmp_path / "mem0.json"))["imported"] == 2
        back = Mem0(store=dst_store, embedder=emb).get_all(user_id="alice")
        strip = lambda d: sorted(({k: v for k, v in m.items()} for m in d["results"]), key=lambda m: m["id"])  # noqa: E731
        assert strip(back) == strip(dump)
        assert dst_store.import_(transfer.from_mem0(dump))["imported"] == 0
    # The command line embeds the texts with the default model into a new store.
    r = _cli("import", str(tmp_path / "mem0.json"), "--store", str(tmp_path / "cli"), "--from", "mem0")
    assert r.returncode == 0, r.stderr
    assert "imported 2" in r.stdout
    with MemoryStore.open(tmp_path / "cli", config=CFG, slm=False) as s:
        assert s.config.dim == 384 and s.search("vegetarian", k=1, namespace="mem0")[0].text == "I am vegetarian"


def test_mem0_package_dump(tmp_path, monkeypatch):
    """A dump of the real mem0 ``Memory`` (its local Qdrant and SQLite history; memories added
    with ``infer=False``, so no LLM is asked) imports with its ids, scopes, metadata and times."""
    monkeypatch.setenv("MEM0_TELEMETRY", "False")
    mem0 = pytest.importorskip("mem0")
    pytest.importorskip("langchain")  # mem0's "langchain" embedder provider imports it
    from langchain_core.embeddings import Embeddings

    emb = HashingEmbedder(64)

    class HashEmbeddings(Embeddings):
        def embed_documents(self, texts):
            return emb.encode(list(texts)).tolist()

        def embed_query(self, text):
            return emb.encode([text])[0].tolist()

    m = mem0.Memory.from_config({
        "vector_store": {"provider": "qdrant", "config": {"path": str(tmp_path / "qdrant"), "on_disk": True,
                                                          "embedding_model_dims": 64, "collection_name": "t"}},
        "embedder": {"provider": "langchain", "config": {"model": HashEmbeddings()}},
        # Never called: infer=False stores the texts as given.
        "llm": {"provider": "openai", "config": {"api_key": "unused", "openai_base_url": "http://127.0.0.1:9/v1"}},
        "history_db_path": str(tmp_path / "history.db"),
    })
    m.add("I am allergic to peanuts", user_id="alice", infer=False, metadata={"source": "chat"})
    m.add([{"role": "user", "content": "My flight leaves on Friday"}], user_id="alice", agent_id="planner",
          infer=False)
    m.add("I like green tea", user_id="bob", infer=False)
    dump = m.get_all(filters={"user_id": "alice"})
    assert len(dump["results"]) == 2
    with MemoryStore.open(tmp_path / "dst", embedder=emb, config=CFG, slm=False) as s:
        assert s.import_(transfer.from_mem0(dump))["imported"] == 2
        for item in dump["results"]:
            got = s.get(key=item["id"], namespace="mem0")
            assert got.text == item["memory"]
            assert got.metadata["user_id"] == "alice" and got.metadata["hash"] == item["hash"]
            assert got.created_at == pytest.approx(datetime.fromisoformat(item["created_at"]).timestamp())
        peanuts = next(i for i in dump["results"] if i["memory"].startswith("I am allergic"))
        assert s.get(key=peanuts["id"], namespace="mem0").metadata["source"] == "chat"
        flight = next(i for i in dump["results"] if i["memory"].startswith("My flight"))
        assert s.get(key=flight["id"], namespace="mem0").metadata["agent_id"] == "planner"
        assert s.search("peanuts", k=1, namespace="mem0")[0].key == peanuts["id"]
        assert s.import_(transfer.from_mem0(dump))["imported"] == 0  # idempotent by mem0's id


def test_langgraph_in_memory_store(tmp_path):
    pytest.importorskip("langgraph")
    from langgraph.store.memory import InMemoryStore

    lg = InMemoryStore()
    for i in range(30):
        lg.put(("users", f"u{i % 3}"), f"item{i}", {"text": f"the user said {i}", "n": i})
    lg.put(("misc",), "raw", {"no_text_field": True})
    emb = HashingEmbedder(64)
    with MemoryStore.open(tmp_path / "s", embedder=emb, config=CFG, slm=False) as s:
        got = s.import_(transfer.from_langgraph(lg, page=7))
        assert got["imported"] == 31
        m = s.get(key="item4", namespace="users.u1")
        assert m.text == "the user said 4" and m.metadata == {"text": "the user said 4", "n": 4}
        assert s.get(key="raw", namespace="misc").text == '{"no_text_field": true}'
        item = lg.get(("users", "u1"), "item4")
        assert abs(m.created_at - item.created_at.timestamp()) < 1e-6
        # Items as dumped (Item.dict()) import the same way, and skip what is stored.
        dumped = [i.dict() for i in lg.search((), limit=100)]
        (tmp_path / "lg.json").write_text(json.dumps(dumped), encoding="utf-8")
        assert s.import_(transfer.from_langgraph(tmp_path / "lg.json"))["imported"] == 0


# -- the command line ------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    from service_helpers import child_env

    return subprocess.run([sys.executable, "-m", "clag_fast.cli", *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=300)


def test_cli_export_then_import_round_trips(tmp_path):
    build(tmp_path / "a", n=200)
    r = _cli("export", str(tmp_path / "a.parquet"), "--store", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "exported 199 memories" in r.stdout
    r = _cli("import", str(tmp_path / "a.parquet"), "--store", str(tmp_path / "b"), "--no-embedder")
    assert r.returncode == 0, r.stderr
    assert "imported 199, 0 already stored" in r.stdout
    r = _cli("import", str(tmp_path / "a.parquet"), "--store", str(tmp_path / "b"), "--no-embedder")
    assert "imported 0, 199 already stored" in r.stdout
    with open_store(tmp_path / "a") as a, open_store(tmp_path / "b") as b:
        assert snapshot(a) == snapshot(b)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok", "vector": [1, 2]}\n{"text": \n', encoding="utf-8")
    r = _cli("import", str(tmp_path / "bad.jsonl"), "--store", str(tmp_path / "c"), "--no-embedder")
    assert r.returncode == 2 and "bad.jsonl line 2: not valid JSON" in r.stderr


def test_without_orjson_and_pybase64_the_files_are_the_same(tmp_path, monkeypatch):
    """The optional accelerators change speed only: the plain json / binascii paths write the
    same bytes and read the same records."""
    from clag_fast.store.transfer import fields as fields_mod

    build(tmp_path / "a", n=200)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "fast.jsonl")
        monkeypatch.setattr(fields_mod, "_pybase64", None)
        monkeypatch.setattr(fields_mod, "_fast_loads", None)
        a.export(tmp_path / "plain.jsonl")
        want = snapshot(a)
    fast, plain = (tmp_path / "fast.jsonl").read_bytes(), (tmp_path / "plain.jsonl").read_bytes()
    assert fast.split(b"\n", 1)[1] == plain.split(b"\n", 1)[1]
    with open_store(tmp_path / "b") as b:
        b.import_(tmp_path / "plain.jsonl")
        assert snapshot(b) == want


def test_a_record_clashing_with_a_stored_memory_stops_there(tmp_path):
    build(tmp_path / "a", n=100)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
        n_clusters = len(a.clusters())
    lines = (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    first = 2 + n_clusters  # 1-based line of the first memory
    records = [json.loads(ln) for ln in lines[first - 1:]]
    keyed = [i for i, r in enumerate(records) if r["key"]]
    # Two records of the "export" share a key (a hand-edited file): the second stops the import.
    dup = dict(records[keyed[5]], key=records[keyed[1]]["key"], namespace=records[keyed[1]]["namespace"])
    lines[first - 1 + keyed[5]] = json.dumps(dup) + "\n"
    (tmp_path / "dup.jsonl").write_text("".join(lines), encoding="utf-8")
    with open_store(tmp_path / "b") as b:
        with pytest.raises(MalformedRecordError, match=rf"line {first + keyed[5]}: key .* is also the key of memory"):
            b.import_(tmp_path / "dup.jsonl")
        assert len(snapshot(b)[0]) == keyed[5]  # every record before it
    # A memory written between two runs under an id the export uses: named, nothing overwritten.
    with open_store(tmp_path / "c") as c:
        c.import_(io.BytesIO("".join(lines[: first - 1 + 10]).encode()))
        took = c.add("written in between", embedding=np.ones(384, np.float32), key="mine", namespace="u0")
        assert took == records[10]["id"]  # the next id: the export's next record's
        with pytest.raises(MalformedRecordError, match=rf"memory id {took} is stored already as another memory"):
            c.import_(tmp_path / "a.jsonl")
        assert c.get(took).text == "written in between"


def test_a_new_field_is_one_line_in_fields(tmp_path, monkeypatch):
    """A store column added later travels through export and import in both formats once
    ``FIELDS`` names it, nothing else changed."""
    from clag_fast.store.transfer import fields as fields_mod
    from clag_fast.store.transfer.fields import Field

    monkeypatch.setattr(fields_mod, "FIELDS", fields_mod.FIELDS + (
        Field("mood", "mood", "str", nullable=True), Field("weight", "weight", "int", nullable=True)))
    build(tmp_path / "a", n=60)
    with open_store(tmp_path / "a") as a:
        db = a._catalog.db  # the column another change would add, added here by hand
        db.execute("ALTER TABLE memories ADD COLUMN mood TEXT")
        db.execute("ALTER TABLE memories ADD COLUMN weight INTEGER")
        db.execute("UPDATE memories SET mood = 'm' || (id % 3), weight = id WHERE id % 2 = 0")
        for fmt in ("jsonl", "parquet"):
            a.export(tmp_path / f"a.{fmt}")
        want = sorted(db.execute("SELECT id, mood, weight FROM memories").fetchall())
    first = json.loads((tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()[-1])
    assert "mood" in first and "weight" in first
    for fmt in ("jsonl", "parquet"):
        with open_store(tmp_path / f"b_{fmt}") as b:
            b._catalog.db.execute("ALTER TABLE memories ADD COLUMN mood TEXT")
            b._catalog.db.execute("ALTER TABLE memories ADD COLUMN weight INTEGER")
            b.import_(tmp_path / f"a.{fmt}")
            assert sorted(b._catalog.db.execute("SELECT id, mood, weight FROM memories").fetchall()) == want
            assert any(t is None for _, t, _ in want) and any(t is not None for _, t, _ in want)
    bad = [{"text": "x", "vector": [1.0, 0.0], "weight": -2}]
    with open_store(tmp_path / "c") as c:
        c._catalog.db.execute("ALTER TABLE memories ADD COLUMN mood TEXT")
        c._catalog.db.execute("ALTER TABLE memories ADD COLUMN weight INTEGER")
        with pytest.raises(MalformedRecordError, match="item 1: weight must be a non-negative integer"):
            c.import_(bad)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_conversations_travel_with_their_memories(tmp_path, fmt):
    """Threads, turns, speakers and updates round-trip; the imported store links the threads
    again; into a store that gives new ids, an update's older id is left out."""
    rng = np.random.default_rng(4)
    vecs = rng.standard_normal((6, 2)).astype(np.float32)
    with MemoryStore.open(tmp_path / "a", config=StoreConfig(dim=2), embedder=False, slm=False) as a:
        ids = a.add_many([f"turn {i}" for i in range(5)], embeddings=vecs[:5], thread="trip",
                         turns=[5, 1, 2, 3, 4], speakers=["Ann", "Bob", "Ann", "Bob", "Ann"])
        new = a.add("turn 0, changed", embedding=vecs[5], thread="trip", turn=6, supersedes=ids[0])
        a.export(tmp_path / f"a.{fmt}")
        want = [(m.thread, m.turn, m.speaker, m.superseded_by) for m in a.get_many(ids + [new])]
    with MemoryStore.open(tmp_path / "b", embedder=False, slm=False) as b:
        b.import_(tmp_path / f"a.{fmt}")
        assert [(m.thread, m.turn, m.speaker, m.superseded_by) for m in b.get_many(ids + [new])] == want
        hit = b.search(vecs[2], k=1, context=1)[0]
        assert hit.memory_id == ids[2] and [t.memory_id for t in hit.context] == [ids[1], ids[3]]
    with MemoryStore.open(tmp_path / "c", config=StoreConfig(dim=2), embedder=False, slm=False) as c:
        c.add("already here", embedding=vecs[0])
        c.import_(tmp_path / f"a.{fmt}")
        assert all(m.superseded_by is None for m in c.memories(limit=10).items)
        assert {m.thread for m in c.memories(limit=10).items} == {None, "trip"}


def test_export_to_file_objects_text_or_binary(tmp_path):
    build(tmp_path / "a", n=80)
    text, raw = io.StringIO(), io.BytesIO()
    with open_store(tmp_path / "a") as a:
        a.export(text)
        a.export(raw, format="jsonl")
        want = snapshot(a)
        with pytest.raises(ValueError, match="Parquet needs a path"):
            a.export(io.BytesIO(), format="parquet")
    assert text.getvalue().encode("utf-8").split(b"\n", 1)[1] == raw.getvalue().split(b"\n", 1)[1]
    with open_store(tmp_path / "b") as b:
        b.import_(io.StringIO(text.getvalue()))
        assert snapshot(b) == want


def _awkward_lines(dim=4):
    """Memory lines in every form a JSONL file may hold them that the native reader takes or
    leaves: escapes, unicode, nulls, ints where floats go, "-0", metadata in and out of the
    stored form (spaces, floats, duplicate keys), threads, archived records, pairs."""
    rng = np.random.default_rng(5)
    vecs = rng.normal(size=(40, dim)).astype(np.float32)
    b64 = transfer.fields.encode_vectors(vecs)
    metas = [None, {"a": 1}, '{"a":1}', '{"b": [1.5, "x\\u00e9\\n"], "c": {"d": -0.0}}', '{"k": 1, "k": 2}',
             '{"e": 1e2, "f": 1E+16}', '{"g": "\\/\\u001f"}', '{"h": 0.1}', '{ "i" : true }']
    lines = []
    for i in range(40):
        meta = metas[i % len(metas)]
        meta_text = "null" if meta is None else meta if isinstance(meta, str) else json.dumps(meta)
        text = ["plain", r'tab\there \"q\" \\', r"\u00e9\ud83d\ude00 é😀", r"a\/b"][i % 4] + f" {i}"
        fields = [f'"id": {i + 1}', f'"key": {json.dumps(f"k{i}") if i % 3 else "null"}',
                  f'"namespace": "ns{i % 2}"', f'"text": "{text}"', f'"metadata": {meta_text}',
                  f'"created_at": {["1700000000.25", "1700000000", "-0", "17e8"][i % 4]}',
                  f'"last_accessed": {"null" if i % 2 else "1700000001.5"}', f'"access_count": {i % 5}',
                  f'"strength": {["1", "0.5", "2.0"][i % 3]}', f'"archived": {"true" if i % 7 == 6 else "false"}',
                  f'"thread": {json.dumps(f"t{i % 3}") if i % 2 else "null"}', f'"turn": {i if i % 2 else "null"}',
                  f'"speaker": {"null" if i % 2 else chr(34) + "me" + chr(34)}', f'"vector": "{b64[i]}"',
                  f'"clusters": {["[]", "null", "[[0, 0.75], [1, 1]]"][i % 3]}']
        if i % 5 == 4:
            fields = fields[::-1]  # another order of the same fields
        lines.append("{" + (", " if i % 2 else ",").join(fields) + "}\n")
    return lines


def test_the_native_reader_stores_what_the_general_reader_stores(tmp_path, monkeypatch):
    """Lines read natively (a binary file) and by the general path (a text file object) make
    the same store, field for field, and the same export."""
    from clag_fast import _clag_fast

    taken = []
    native = _clag_fast.parse_export_lines

    def counting(*args):
        got = native(*args)
        taken.append(got[0])
        return got

    monkeypatch.setattr(_clag_fast, "parse_export_lines", counting)
    lines = _awkward_lines()
    header = json.dumps({"format": transfer.fields.FORMAT, "version": 1, "store_id": "s", "dim": 4,
                         "memories": len(lines), "clusters": 2, "soft_k": 3})
    clusters = [json.dumps({"cluster": {"id": c, "summary": f"c{c}", "tags": [], "source": "import",
                                        "created_at": 1.0, "updated_at": 1.0, "profiled_size": 0,
                                        "last_hit_at": None}}) for c in (0, 1)]
    path = tmp_path / "awkward.jsonl"
    path.write_text("\n".join([header] + clusters) + "\n" + "".join(lines), encoding="utf-8")
    with open_store(tmp_path / "native") as a:
        assert a.import_(path)["imported"] == len(lines)
        assert sum(taken) == len(lines)  # every line went through the native reader
        a.export(tmp_path / "native.jsonl")
        got = snapshot(a)
    taken.clear()
    with open_store(tmp_path / "general") as b, open(path, encoding="utf-8") as text:
        assert b.import_(text)["imported"] == len(lines)
        assert taken == []
        b.export(tmp_path / "general.jsonl")
        want = snapshot(b)
    assert got[0] == want[0]  # every memory, field for field
    # Records without pairs were routed into new clusters, made at each import's own time.
    untimed = lambda cs: [dataclasses.replace(c, created_at=0, updated_at=0) for c in cs]  # noqa: E731
    assert untimed(got[1]) == untimed(want[1])
    memory_lines = lambda p: [x for x in p.read_bytes().split(b"\n")[1:] if not x.startswith(b'{"cluster"')]  # noqa: E731
    assert memory_lines(tmp_path / "native.jsonl") == memory_lines(tmp_path / "general.jsonl")


def test_a_malformed_line_inside_a_native_batch_stops_there(tmp_path):
    """A bad line between good ones (one batch): the lines before it are stored, it and every
    line after are not, its number is named; a valid line the native reader leaves (a vector
    as a list) is read by the general path with the lines after it."""
    build(tmp_path / "a", n=120)
    with open_store(tmp_path / "a") as a:
        a.export(tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if i and '"cluster"' not in line[:12]) + 1  # 1-based
    for bad, message in [('{"text": "x", "vector": "AAAA", }\n', "not valid JSON"),
                         (lines[first + 40][:-2] + ', "access_count": -1}\n', "access_count must be a non-negative"),
                         (lines[first + 40][:-2] + ', "text": "  "}\n', "text is empty")]:
        broken = lines[:first + 59] + [bad] + lines[first + 59:]
        (tmp_path / "bad.jsonl").write_text("".join(broken), encoding="utf-8")
        with open_store(tmp_path / "b") as b:
            with pytest.raises(MalformedRecordError, match=rf"bad.jsonl line {first + 60}: {message}") as e:
                b.import_(tmp_path / "bad.jsonl")
            assert e.value.imported == 60 and len(snapshot(b)[0]) == 60
        shutil.rmtree(tmp_path / "b")
    # A list vector midway: valid, left to the general path, which reads it and the rest.
    rec = json.loads(lines[first + 59])
    rec["vector"] = np.frombuffer(__import__("base64").b64decode(rec["vector"]), "<f4").tolist()
    mixed = lines[:first + 59] + [json.dumps(rec) + "\n"] + lines[first + 60:]
    (tmp_path / "mixed.jsonl").write_text("".join(mixed), encoding="utf-8")
    with open_store(tmp_path / "c") as c:
        assert c.import_(tmp_path / "mixed.jsonl")["imported"] == len(lines) - first + 1
        c.export(tmp_path / "c.jsonl")
    body = lambda p: p.read_bytes().split(b"\n", 1)[1]  # noqa: E731
    assert body(tmp_path / "c.jsonl") == body(tmp_path / "a.jsonl")


def test_export_lines_spell_pairs_and_vectors_as_printf_and_base64(tmp_path):
    """The native line writer: affinities as C's %.9g (each float32 exactly), pairs with -1
    ids left out, vectors as base64 of their float32 bytes, fields as their JSON texts."""
    import base64

    rng = np.random.default_rng(3)
    n, k = 500, 4
    aff = np.concatenate([rng.random((n, k)), rng.random((n, k)) * 1e-6, rng.random((n, k)) * 1e9]).astype(np.float32)
    ids = rng.integers(-1, 50, size=aff.shape)
    vecs = rng.normal(size=(len(aff), 6)).astype(np.float32)
    n = len(aff)
    cols = [[i + 1 for i in range(n)] if f.name == "id" else [f"t{i} é\n\"" for i in range(n)] if f.name == "text"
            else [None] * n if f.nullable else [1.5] * n if f.type == "float" else [0] * n if f.type == "int"
            else ["ns"] * n for f in transfer.FIELDS]
    out = io.BytesIO()
    transfer.jsonl.Writer(out).memories(cols, vecs, ids, aff, [False] * n)
    lines = out.getvalue().decode("utf-8").splitlines()
    assert len(lines) == n
    for i, line in enumerate(lines):
        want = ",".join("[%d,%.9g]" % (c, a) for c, a in zip(ids[i].tolist(), aff[i].tolist()) if c >= 0)
        assert line.endswith(f'"clusters":[{want}]}}'), (line[-200:], want)
        rec = json.loads(line)
        assert rec["text"] == f"t{i} é\n\"" and rec["id"] == i + 1 and rec["created_at"] == 1.5
        assert base64.b64decode(rec["vector"]) == vecs[i].astype("<f4").tobytes()
        assert np.array_equal(np.asarray([p[1] for p in rec["clusters"]], np.float32), aff[i][ids[i] >= 0])
