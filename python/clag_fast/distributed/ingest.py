"""Bulk ingest into a sharded store with Ray Data.

    read (JSONL / Parquet / any Dataset)
      -> prepare: namespace, key, owning shard per row; drop rows whose key is already stored
      -> embed: batches through the ONNX embedder on a pool of actors (GPU actors with num_gpus)
      -> write: each batch split by shard, one ``add_many(embeddings=, keys=)`` per owner

Prepare is a plain function that Ray Data runs inside the embedding actor (or, with given
vectors, inside the read tasks): no process of its own, and the rows are not copied through
the object store to reach the embedder. (Ray Data fuses it into the actor only when the two
reserve the same resources: one CPU and no GPU, the default with one embedder; otherwise it
runs in tasks of its own.) The embedding actor writes too, with as many calls
running at once as it has cores, each embedding on one core: a call's preparation and its
wait for the owners overlap the other calls' embedding, one Ray worker fewer starts, and the
vectors are not copied through the object store to a writing actor. (One call at a time, the
embedder sat idle during each write: 100k texts went from 1,285 to 878 texts/s. A separate
writing actor, which fixed that, read a median 0.69x one process's rate against this design's
0.72x, six pairs of 30k-text runs in turns; BENCHMARKS.md, Ray.) With given
vectors, a writing actor that reserves no core does the writes.

Idempotent and resumable by keys: every row has one (its ``key_column``, or a hash of its
namespace and text), a key already in its namespace is skipped before it is embedded, and a
batch is one atomic ``add_many`` on its owner, where a key that slipped through is an upsert
(same id). So a run killed at any point and started again ends with each row stored exactly
once, and the second run embeds only what the first did not write.

The owners write with ``defer_organize``: the stores' periodic re-organisations (every 5% of
growth, so at every write of 2,048 up to ~41k memories) wait until the pipeline is done, and
each owner then runs the one pass that is owed before ``ingest`` returns. They took most of
an owner's CPU, on cores the embedder needs. A run killed before that pass leaves it owed in
the store's database: the next ingest (or the next write, or ``organize()``) runs it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from clag_fast.distributed.shardmap import ShardMap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestReport:
    """What one ``ingest`` run did: rows read, rows already stored (skipped), rows written."""

    rows: int
    skipped: int
    added: int
    seconds: float

    @property
    def rate(self) -> float:
        """Rows written per second."""
        return self.added / self.seconds if self.seconds else 0.0


def row_key(namespace: str, text: str) -> str:
    """The key of a row without one: the same text in the same namespace is stored once."""
    return "h:" + hashlib.blake2b(f"{namespace}\0{text}".encode(), digest_size=12).hexdigest()


def read(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Any:
    """A Ray Dataset from JSONL / JSON or Parquet files (by extension)."""
    import ray.data

    items = [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not items:
        raise ValueError("no input files")
    if all(p.endswith(".parquet") or Path(p).is_dir() for p in items):
        return ray.data.read_parquet(items)
    if all(p.endswith((".jsonl", ".json", ".jsonl.gz")) for p in items):
        return ray.data.read_json(items, lines=all(p.endswith((".jsonl", ".jsonl.gz")) for p in items))
    raise ValueError(f"cannot tell the format of {items}: name files *.jsonl, *.json or *.parquet")


def _prepare(batch: dict[str, np.ndarray], *, root: str, namespace: str, text_column: str,
             key_column: str | None, namespace_column: str | None, kind_column: str | None,
             vector_column: str | None, resume: bool) -> dict[str, np.ndarray]:
    """Rows -> namespace, key, shard, text (+ kind, vector); drops keys already stored.

    A plain function, so Ray Data fuses it into the read tasks: no actor process of its own
    and no object-store hop between reading and preparing. The input row count travels in
    ``rows`` (on the first row out of each batch; a batch whose rows are all stored leaves one
    placeholder row with ``new`` False), so the report counts rows without a second read of
    the input (``Dataset.count()`` re-reads a JSONL file from the start)."""
    layout = ShardMap.load(root)  # per batch: a small file, and a reused worker sees new pins
    if text_column not in batch:
        raise ValueError(f"the dataset has no {text_column!r} column (columns: {sorted(batch)})")
    texts = [str(t) if t is not None else "" for t in batch[text_column]]
    for t in texts:
        if not t.strip():
            raise ValueError(f"a row has an empty {text_column!r}: every memory needs a text")
    n = len(texts)
    namespaces = [str(x) for x in batch[namespace_column]] if namespace_column else [namespace] * n
    if key_column:
        keys = [str(k) for k in batch[key_column]]
    else:
        keys = [row_key(ns, t) for ns, t in zip(namespaces, texts)]
    shards = np.array([layout.shard_of(ns) for ns in namespaces], np.int64)
    keep = _missing(layout, namespaces, keys, shards) if resume else np.ones(n, bool)
    out: dict[str, Any] = {"text": np.array(texts, object), "namespace": np.array(namespaces, object),
                           "key": np.array(keys, object), "shard": shards,
                           "kind": np.array([str(k) for k in batch[kind_column]] if kind_column
                                            else ["fact"] * n, object)}
    if vector_column:
        out["vector"] = np.stack([np.asarray(v, np.float32) for v in batch[vector_column]]) if n else \
            np.empty((0, layout.dim), np.float32)
    out = {k: v[keep] for k, v in out.items()}
    kept = int(keep.sum())
    if n and not kept:  # the placeholder that carries this batch's row count
        out = {k: (np.zeros((1,) + v.shape[1:], v.dtype) if v.dtype != object else np.array([""], object))
               for k, v in out.items()}
    out["new"] = np.full(max(kept, 1 if n else 0), bool(kept))
    out["rows"] = np.zeros(len(out["new"]), np.int64)
    if n:
        out["rows"][0] = n
    return out


def _missing(layout: ShardMap, namespaces: list[str], keys: list[str], shards: np.ndarray) -> np.ndarray:
    """Which rows' keys are not stored yet (asked of each owning shard, one call per namespace)."""
    import ray

    from clag_fast.distributed.backend import owner_handle

    keep = np.ones(len(keys), bool)
    by_ns: dict[str, list[int]] = {}
    for i, ns in enumerate(namespaces):
        by_ns.setdefault(ns, []).append(i)
    asks = []
    for ns, idx in by_ns.items():
        shard = int(shards[idx[0]])
        if (layout.shard_dir(shard) / "memories.db").exists():  # a read never creates a shard
            asks.append((idx, owner_handle(layout, shard).missing_keys.remote(ns, [keys[i] for i in idx])))
    for idx, ref in asks:
        missing = set(ray.get(ref))
        for i in idx:
            keep[i] = keys[i] in missing
    return keep


class _Write:
    """Each batch split by shard; one atomic ``add_many`` per owner (in parallel)."""

    def __init__(self, root: str) -> None:
        self.layout = ShardMap.load(root)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return _write(self.layout, batch)


class _EmbedWrite:
    """An embedding actor that also writes: one ONNX embedder, loaded once, for every batch
    it is given, and the vectors go straight to the owners. Ray Data runs several calls at
    once in it (one per core it uses), each embedding on one core, so one call's write wait
    (and its preparation, where that is fused into the actor) overlaps the others' embedding.
    On a GPU, ``threads`` are the host threads of each call."""

    def __init__(self, root: str, device: str, threads: int | None) -> None:
        from clag_fast.embed.embedder import Embedder

        self.layout = ShardMap.load(root)
        self.embedder = Embedder(threads=1 if device == "cpu" else threads, device=device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        new = np.flatnonzero(batch["new"])  # placeholders (row counts only) are not embedded
        batch["vector"] = np.zeros((len(batch["new"]), self.embedder.dim), np.float32)
        if len(new):
            batch["vector"][new] = self.embedder.encode([str(t) for t in batch["text"][new]])
        return _write(self.layout, batch)


def _write(layout: ShardMap, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``batch`` split by shard; one atomic ``add_many`` per owner, in parallel; the rows
    written and read."""
    import ray

    from clag_fast.distributed.backend import owner_handle

    new = batch["new"]
    shards = batch["shard"]
    refs = []
    for shard in np.unique(shards[new]).tolist():
        idx = np.flatnonzero(new & (shards == shard))
        refs.append(owner_handle(layout, shard).add_many.remote(
            [str(t) for t in batch["text"][idx]], np.ascontiguousarray(batch["vector"][idx], np.float32),
            [str(k) for k in batch["kind"][idx]], [str(n) for n in batch["namespace"][idx]], None,
            [str(k) for k in batch["key"][idx]], defer_organize=True))
    added = sum(len(ids) for ids in ray.get(refs))
    return {"added": np.array([added], np.int64), "rows": np.array([int(batch["rows"].sum())], np.int64)}


def _organize_owners(layout: ShardMap) -> None:
    """The re-organisation each shard's writes put off (``defer_organize``), all shards at
    once. Every existing shard is asked, not only those written to now: a resumed run that
    found everything stored still settles what its killed predecessor left owed (a store
    records it)."""
    import ray

    from clag_fast.distributed.backend import owner_handle

    shards = layout.existing_shards()
    reports = ray.get([owner_handle(layout, s).organize_deferred.remote() for s in shards])
    for s, r in zip(shards, reports):
        if r is not None:
            log.info("shard %d organised after the ingest: %d clusters, %.2f s", s, r["clusters"], r["seconds"])


def _pool(size: int, calls: int = 1) -> Any:
    """A fixed pool of ``size`` actors, each running ``calls`` calls at once."""
    import ray.data

    return ray.data.ActorPoolStrategy(size=size, max_concurrent_calls_per_actor=calls,
                                      enable_true_multi_threading=True)


def _embed_shape(embedders: int, threads: int | None, gpus: float) -> tuple[int, float]:
    """(calls each embedding actor runs at once, cores it reserves). Calls: ``threads``, else
    the cluster's cores shared out among the actors (at most this machine's), one core each;
    two on a GPU. Cores: its threads, but never so many that the pool holds every core of the
    cluster (the read tasks feeding it need one, else the pipeline waits forever)."""
    import ray

    from clag_fast.embed.embedder import usable_cpus

    total = float(ray.cluster_resources().get("CPU", 1))
    cpus = max(0.1, min(float(threads or 1), (total - 1) / embedders if total > 1 else total / (2 * embedders)))
    if gpus:
        return 2, cpus
    return threads or max(1, min(usable_cpus(), int(total) // embedders)), cpus


def ingest(dataset: Any, root: str | os.PathLike[str], *, shards: int | None = None, namespace: str = "default",
           text_column: str = "text", key_column: str | None = None, namespace_column: str | None = None,
           kind_column: str | None = None, vector_column: str | None = None, dim: int | None = None,
           batch_size: int = 2048, embed_batch: int = 2048, embedders: int = 1, embed_threads: int | None = None,
           num_gpus: float = 0,
           resume: bool = True, progress: Callable[[int], None] | None = None) -> IngestReport:
    """Add every row of ``dataset`` to the sharded store at ``root``, at most once per key.

    dataset: a ``ray.data.Dataset``, or JSONL / JSON / Parquet path(s) (see ``read``).
    shards, dim: the layout when ``root`` is new (dim defaults to the embedder's 384, or the
      width of ``vector_column``).
    text_column: the memory's text. key_column: a unique id per row (default: a hash of the
      namespace and the text, so identical texts of a namespace are stored once).
    namespace_column: per-row namespaces (else every row goes to ``namespace``).
    vector_column: precomputed embeddings (then nothing is embedded).
    batch_size: rows per batch read and prepared, and per write with given vectors (one
      atomic ``add_many`` per shard owner, with ``defer_organize``: the owners re-organise
      once, after the last write, before this returns; a run that dies first leaves that
      pass owed to the next).
    embed_batch: texts per embedding call, and per write of embedded texts. The embedder
      sorts a call's texts by length and pads each inner batch to its longest, so a call of
      256 texts pads far more than one process embedding everything at once would.
    embedders, embed_threads, num_gpus: the embedding actor pool: how many actors, calls
      running at once in each, one core apiece (default: the cluster's cores shared out among
      the actors, at most this machine's; each actor reserves ``embed_threads`` cores, one by
      default, all of them together at most one fewer than the cluster has, so read tasks
      keep one), and GPUs each (GPU actors embed on CUDA, two
      calls at once, ``embed_threads`` host threads each).
    resume: skip rows whose key is already stored, before embedding (a re-run after a
      failure embeds only what is missing). Off, they are re-embedded and upserted.
    progress: called with the number of rows written after each batch (Ray Data shows its
      own progress bars too).
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="auto")
    t0 = time.perf_counter()
    ds = read(dataset) if isinstance(dataset, (str, os.PathLike, list, tuple)) else dataset
    layout = ShardMap.create_or_load(root, shards, dim=dim, embedder=True if vector_column is None else None)
    # Start the owners the run will write to while Ray Data starts its own workers: started by
    # the first write instead, the owner's process start and store open (~2 s on 2 cores)
    # stalled the pipeline. Known ahead: the shards that exist, and the one of ``namespace``
    # when every row goes there (a shard no row is written to is never created).
    from clag_fast.distributed.backend import owner_handle

    warm = set(layout.existing_shards())
    if namespace_column is None:
        warm.add(layout.shard_of(namespace))
    for s in sorted(warm):
        owner_handle(layout, s)  # creating the handle starts the actor; no need to wait for it
    prepared = ds.map_batches(
        _prepare, fn_kwargs=dict(root=str(layout.root), namespace=namespace, text_column=text_column,
                                 key_column=key_column, namespace_column=namespace_column, kind_column=kind_column,
                                 vector_column=vector_column, resume=resume),
        batch_size=batch_size, batch_format="numpy")
    if vector_column is None:
        # On CPU, one call per core the actor uses, each embedding on one core; on a GPU,
        # two, so one's write overlaps the other's inference.
        calls, cpus = _embed_shape(embedders, embed_threads, num_gpus)
        written = prepared.map_batches(_EmbedWrite, fn_constructor_args=(str(layout.root), "cuda" if num_gpus else "cpu",
                                                                         embed_threads),
                                       batch_size=embed_batch, batch_format="numpy", compute=_pool(embedders, calls),
                                       num_gpus=num_gpus, num_cpus=cpus)
    else:
        # Writing waits on the owners most of the time: it reserves no core, so a small
        # cluster never holds every core in actors while a read task waits for one.
        written = prepared.map_batches(_Write, fn_constructor_args=(str(layout.root),), batch_size=batch_size,
                                       batch_format="numpy", compute=_pool(1), num_cpus=0)
    # Ray Data polls every map worker's memory (psutil, once a second) for its statistics:
    # CPU the embedder could use (~1% of it in py-spy), for numbers nothing here reads.
    written.context.memory_usage_poll_interval_s = None
    added = rows = 0
    for out in written.iter_batches(batch_size=None, batch_format="numpy"):
        added += int(out["added"].sum())
        rows += int(out["rows"].sum())
        if progress is not None:
            progress(added)
    _organize_owners(layout)
    report = IngestReport(rows=rows, skipped=rows - added, added=added, seconds=time.perf_counter() - t0)
    log.info("ingest into %s: %d rows, %d added, %d already stored, %.1f rows/s", root, report.rows,
             report.added, report.skipped, report.rate)
    return report
