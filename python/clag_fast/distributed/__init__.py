"""clag_fast beyond one machine, on Ray (``pip install "clag_fast[ray]"``).

- ``ShardedStore``: MemoryStore's methods over namespace-sharded stores, one Ray actor
  (``ShardOwner``) per shard directory, namespaces routed by a stable hash or a pin table
  persisted in ``ROOT/cluster.json`` (``ShardMap``).
- ``frontdoor``: the ``clag-fast serve`` /v1 HTTP API as a Ray Serve deployment over the
  shards (``run``, or ``serve run clag_fast.distributed.frontdoor:app_builder root=DIR``).
- ``ingest``: bulk import with Ray Data (read -> embed on an actor pool -> add_many per
  shard), idempotent and resumable by keys.

    import ray, clag_fast.distributed as cd
    ray.init()
    store = cd.ShardedStore("mem-cluster/", shards=4)
    cd.ingest("turns.jsonl", "mem-cluster/", namespace_column="user")
    store.search("what can the user eat?", k=5, namespace="user-42")
"""

from __future__ import annotations

from clag_fast.distributed.backend import ShardedStore
from clag_fast.distributed.ingest import IngestReport, ingest, read
from clag_fast.distributed.shardmap import ShardMap

__all__ = ["IngestReport", "ShardMap", "ShardedStore", "ingest", "read"]
