"""Placement and failover on a multi-node Ray cluster simulated on this machine
(``ray.cluster_utils.Cluster``: one head and shard-hosting worker raylets, each its own node;
they share this machine's disk, as nodes of a real cluster would share ROOT's filesystem)."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from clag_fast.distributed import ShardedStore  # noqa: E402

DIM = 8


@pytest.mark.slow
def test_owner_on_a_lost_node_restarts_on_another_with_its_memories(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    # owners need a "shard_host" slot: only nodes started to host shards have one
    worker = cluster.add_node(num_cpus=1, resources={"shard_host": 4})
    ray.init(address=cluster.address, namespace="clag_fast", log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        place = lambda shard: {"resources": {"shard_host": 1}}  # noqa: E731
        store = ShardedStore(tmp_path / "root", 2, dim=DIM, embedder=False, placement=place)
        rng = np.random.default_rng(0)
        vecs = rng.normal(size=(40, DIM)).astype(np.float32)
        ids = store.add_many([f"m{i}" for i in range(40)], vecs, namespaces=[f"ns{i % 4}" for i in range(40)],
                             keys=[f"k{i}" for i in range(40)])
        shards = store.existing_shards()
        nodes = {ray.get(store.owner(s).node.remote()) for s in shards}
        assert nodes == {worker.node_id}

        cluster.remove_node(worker)  # the node and every process on it are gone
        replacement = cluster.add_node(num_cpus=1, resources={"shard_host": 4})
        deadline = time.monotonic() + 120
        while True:
            try:
                moved = {ray.get(store.owner(s).node.remote(), timeout=10) for s in shards}
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                assert time.monotonic() < deadline, "the owners did not come back on the replacement node"
                time.sleep(0.5)
        assert moved == {replacement.node_id}
        assert len(store) == 40
        assert [m.text for m in store.get_many(ids)] == [f"m{i}" for i in range(40)]
        # the restarted owners take writes again, and a re-sent keyed batch adds nothing twice
        store.add_many([f"m{i}" for i in range(40)], vecs, namespaces=[f"ns{i % 4}" for i in range(40)],
                       keys=[f"k{i}" for i in range(40)])
        assert len(store) == 40
        store.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()
