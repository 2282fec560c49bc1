"""The sharded store's layout file (no Ray needed): stable routing, pins, ids, racing creators."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from clag_fast.distributed.shardmap import MAP_FILE, ShardMap, decode_id, encode_id, hash_shard
from service_helpers import child_env


def test_hash_routing_is_the_same_in_another_process():
    names = [f"tenant-{i}" for i in range(50)] + ["default", "ünïcode/ns"]
    here = [hash_shard(n, 7) for n in names]
    code = ("import json,sys; from clag_fast.distributed.shardmap import hash_shard; "
            "print(json.dumps([hash_shard(n, 7) for n in json.loads(sys.argv[1])]))")
    there = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(names)], capture_output=True,
                                      text=True, check=True, env=child_env()).stdout)
    assert here == there
    assert len(set(here)) > 3  # spread over the shards, not one bucket


def test_layout_persists_and_pins_override_the_hash(tmp_path):
    layout = ShardMap.create_or_load(tmp_path, 4, dim=16, embedder=False)
    ns = "big-tenant"
    other = (layout.shard_of(ns) + 1) % 4
    layout.pin(ns, other)
    again = ShardMap.load(tmp_path)
    assert again.shard_of(ns) == other
    assert again.shards == 4 and again.dim == 16 and again.embedder is False
    assert again.shard_of("someone-else") == hash_shard("someone-else", 4)
    with pytest.raises(ValueError, match="shard must be between 0 and 3"):
        again.pin(ns, 4)


def test_reopening_with_other_settings_is_refused(tmp_path):
    ShardMap.create_or_load(tmp_path, 4, dim=16)
    with pytest.raises(ValueError, match=r"shards=8 \(stored: 4\)"):
        ShardMap.create_or_load(tmp_path, 8)
    with pytest.raises(FileNotFoundError, match="give shards="):
        ShardMap.create_or_load(tmp_path / "new")
    assert ShardMap.create_or_load(tmp_path).shards == 4  # no settings: the stored ones


def test_racing_creators_agree_on_one_layout(tmp_path):
    def create(n: int) -> int:
        try:
            return ShardMap.create_or_load(tmp_path, n).shards
        except ValueError:
            return -1  # lost the race with other settings: refused, never re-routed

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, [2, 3, 4, 5, 6, 7, 8, 9]))
    stored = json.loads((tmp_path / MAP_FILE).read_text())["shards"]
    assert results.count(stored) == 1 and results.count(-1) == 7
    assert not list(tmp_path.glob(".*.tmp"))


def test_ids_carry_their_shard():
    for shard, local in [(0, 1), (3, 12345), (4095, (1 << 40) - 1)]:
        gid = encode_id(shard, local)
        assert decode_id(gid) == (shard, local)
        assert gid < 2 ** 53
    with pytest.raises(ValueError, match="non-negative"):
        decode_id(-5)
