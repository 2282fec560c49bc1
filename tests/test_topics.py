"""Topic-level operations: a cluster with its members, forgetting (archive or delete), moving
and merging clusters by hand, in the store, through a real started service (rights and
tenancy as the other routes), the Python clients, the CLI and the MCP ``forget_topic`` tool."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import anyio
import httpx
import pytest

import clag_fast
from clag_fast import MemoryStore, StoreConfig
from clag_fast.errors import ServiceForbidden
from service_helpers import ROOT, ServiceProcess, child_env
from store_helpers import topic_vectors

CFG = StoreConfig(slm="off")


def open_store(path, **kw):
    return MemoryStore.open(path, config=CFG, embedder=False, slm=False, **kw)


def filled(path, n=400, namespaces=("u1", "u2")):
    vecs, topics = topic_vectors(n, 4, seed=2)
    s = open_store(path)
    ids = s.add_many([f"m{i} t{t}" for i, t in enumerate(topics.tolist())], embeddings=vecs,
                     namespaces=[namespaces[i % len(namespaces)] for i in range(n)])
    s.organize()
    return s, ids, vecs


def test_cluster_lists_its_members_a_page_at_a_time(tmp_path):
    s, ids, _ = filled(tmp_path / "s")
    with s:
        big = s.clusters()[0]
        page = s.cluster(big.id, limit=3)
        assert page.info == big and len(page.members) == 3 and page.next_cursor
        seen = [m.memory_id for m in page.members]
        while page.next_cursor:
            page = s.cluster(big.id, limit=3, cursor=page.next_cursor)
            seen += [m.memory_id for m in page.members]
        assert seen == sorted(seen) and len(seen) == big.size
        assert all(m.cluster_id == big.id for m in s.get_many(seen))
        only_u1 = s.cluster(big.id, namespace="u1", limit=1000).members
        assert only_u1 and {m.namespace for m in only_u1} == {"u1"}
        with pytest.raises(KeyError, match="no cluster with id 123456"):
            s.cluster(123456)


@pytest.mark.parametrize("action", ["archive", "delete"])
def test_forget_a_whole_cluster(tmp_path, action):
    s, ids, vecs = filled(tmp_path / "s")
    with s:
        target = s.clusters()[0]
        members = [m.memory_id for m in s.cluster(target.id, limit=1000).members]
        n = len(s)
        assert s.forget_cluster(target.id, action=action) == len(members)
        assert len(s) == n - len(members)
        assert target.id not in {c.id for c in s.clusters()}
        assert not set(members) & {h.memory_id for v in vecs[:50] for h in s.search(v, k=10)}
        kept = s.get_many(members)
        if action == "archive":
            assert len(kept) == len(members) and all(m.archived for m in kept)
        else:
            assert kept == []
        with pytest.raises(KeyError):
            s.forget_cluster(target.id)
    with open_store(tmp_path / "s") as s:  # what it did is durable
        assert target.id not in {c.id for c in s.clusters()} and len(s) == n - len(members)


def test_forget_one_namespace_of_a_cluster_keeps_the_rest(tmp_path):
    s, ids, _ = filled(tmp_path / "s")
    with s:
        target = s.clusters()[0]
        u1 = [m.memory_id for m in s.cluster(target.id, namespace="u1", limit=1000).members]
        assert s.forget_cluster(target.id, namespace="u1", action="delete") == len(u1)
        left = s.cluster(target.id, limit=1000)
        assert left.info.size == target.size - len(u1) and {m.namespace for m in left.members} == {"u2"}
        with pytest.raises(ValueError, match="action must be"):
            s.forget_cluster(target.id, action="shred")


def test_move_members_to_another_cluster(tmp_path):
    s, ids, vecs = filled(tmp_path / "s")
    with s:
        a, b = s.clusters()[:2]
        some = [m.memory_id for m in s.cluster(a.id, limit=2).members]
        assert s.move_cluster(a.id, b.id, memory_ids=some) == 2
        assert all(m.cluster_id == b.id for m in s.get_many(some))
        with pytest.raises(ValueError, match="is not a member of cluster"):
            s.move_cluster(a.id, b.id, memory_ids=some)
        with pytest.raises(ValueError, match="into itself"):
            s.move_cluster(b.id, b.id)
        rest = s.cluster(a.id, limit=1000).members
        assert s.move_cluster(a.id, b.id) == len(rest)
        assert a.id not in {c.id for c in s.clusters()}  # emptied: gone
        assert s.cluster(b.id).info.size == a.size + b.size
        moved = some + [m.memory_id for m in rest]
    with open_store(tmp_path / "s") as s:
        assert all(m.cluster_id == b.id for m in s.get_many(moved))  # durable


def test_merge_two_clusters_by_hand(tmp_path):
    s, ids, vecs = filled(tmp_path / "s")
    with s:
        a, b = s.clusters()[:2]
        b_members = [m.memory_id for m in s.cluster(b.id, limit=1000).members]
        assert s.merge_clusters(a.id, b.id) == b.size
        merged = s.cluster(a.id, limit=1000)
        assert merged.info.size == a.size + b.size and merged.info.summary == a.summary
        assert b.id not in {c.id for c in s.clusters()}
        for m in s.get_many(b_members):
            assert m.cluster_id == a.id and b.id not in [c for c, _ in m.clusters]
        i = ids.index(b_members[0])
        assert s.search(vecs[i], k=1)[0].memory_id == b_members[0]
        with pytest.raises(ValueError, match="with itself"):
            s.merge_clusters(a.id, a.id)
        with pytest.raises(KeyError):
            s.merge_clusters(a.id, b.id)


def test_cli_topic_commands(tmp_path):
    s, ids, _ = filled(tmp_path / "s")
    with s:
        a, b, c = s.clusters()[:3]
    run = lambda *args: subprocess.run([sys.executable, "-m", "clag_fast.cli", "topic", *args, "--store",  # noqa: E731
                                        str(tmp_path / "s")], capture_output=True, text=True, env=child_env(),
                                       cwd=ROOT, timeout=120)
    r = run("show", str(a.id), "--limit", "2")
    assert r.returncode == 0 and f"cluster {a.id} ({a.size} members" in r.stdout and "more" in r.stdout
    assert "moved" in run("move", str(c.id), "--to", str(b.id)).stdout
    assert f"merged cluster {b.id} into cluster {a.id}" in run("merge", str(a.id), str(b.id)).stdout
    r = run("forget", str(a.id), "--delete")
    assert r.returncode == 0 and f"deleted {a.size + b.size + c.size} memories" in r.stdout
    r = run("show", str(a.id))
    assert r.returncode == 2 and "no cluster with id" in r.stderr


# -- the service -------------------------------------------------------------------------------
KEY_U1, KEY_ADMIN = "tenant-u1-key-0123456789", "admin-key-0123456789abcd"
KEYS = f"""
[[keys]]
name = "u1"
key = "{KEY_U1}"
write = ["u1"]

[[keys]]
name = "admin"
key = "{KEY_ADMIN}"
admin = true
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("topics")
    (root / "keys.toml").write_text(KEYS)
    with ServiceProcess(root / "store", keys=root / "keys.toml") as svc:
        admin = clag_fast.connect(svc.url, api_key=KEY_ADMIN)
        mixed, _ = topic_vectors(200, 2, seed=11)
        own, _ = topic_vectors(60, 1, seed=77)  # a topic only u1 has
        admin.add_many([f"shared {i}" for i in range(200)], embeddings=mixed,
                       namespaces=["u1" if i % 2 else "u2" for i in range(200)])
        admin.add_many([f"own {i}" for i in range(60)], embeddings=own, namespace="u1")
        admin.organize()
        yield svc, admin
        admin.close()


def _pure_u1(admin):
    """A cluster whose members are all in u1, and one that mixes u1 and u2."""
    pure = mixed = None
    for c in admin.clusters():
        spaces = {m.namespace for m in admin.cluster(c.id, limit=1000).members}
        if spaces == {"u1"} and pure is None:
            pure = c
        if spaces == {"u1", "u2"} and mixed is None:
            mixed = c
    assert pure is not None and mixed is not None
    return pure, mixed


@pytest.mark.parametrize("kind", ["client", "async_client"])
def test_service_cluster_routes_with_rights_and_tenancy(service, kind):
    svc, admin = service
    pure, mixed = _pure_u1(admin)

    async def checks(u1):
        async def call(name, *a, **kw):
            out = getattr(u1, name)(*a, **kw)
            return await out if inspect.isawaitable(out) else out

        page = await call("cluster", pure.id, limit=5)
        assert page.info.id == pure.id and len(page.members) == 5 and {m.namespace for m in page.members} == {"u1"}
        with pytest.raises(KeyError, match=f"no cluster with id {mixed.id}"):
            await call("cluster", mixed.id)  # a mixed cluster is not this key's to see
        with pytest.raises(ServiceForbidden, match="admin"):
            await call("merge_clusters", pure.id, mixed.id)
        with pytest.raises(ServiceForbidden, match="admin"):
            await call("forget_cluster", pure.id)  # every namespace: admin only
        with pytest.raises(ServiceForbidden):
            await call("forget_cluster", pure.id, namespace="u2")
        with pytest.raises(ServiceForbidden, match="admin"):
            await call("move_cluster", pure.id, mixed.id)

    async def run():
        if kind == "client":
            with clag_fast.connect(svc.url, api_key=KEY_U1) as u1:
                await checks(u1)
        else:
            async with clag_fast.connect_async(svc.url, api_key=KEY_U1) as u1:
                await checks(u1)

    anyio.run(run)


def test_service_forget_move_merge_end_to_end(service):
    svc, admin = service
    pure, mixed = _pure_u1(admin)
    u1 = clag_fast.connect(svc.url, api_key=KEY_U1)
    # The tenant forgets its own topic (its namespace named): archived, gone from search.
    assert u1.forget_cluster(pure.id, namespace="u1") == pure.size
    assert pure.id not in {c.id for c in admin.clusters()}
    with pytest.raises(KeyError):
        u1.cluster(pure.id)
    # The admin moves and merges.
    others = [c for c in admin.clusters() if c.id != mixed.id]
    dest = others[0]
    some = [m.memory_id for m in admin.cluster(mixed.id, limit=3).members]
    assert admin.move_cluster(mixed.id, dest.id, memory_ids=some) == 3
    assert all(m.cluster_id == dest.id for m in admin.get_many(some))
    size = admin.cluster(mixed.id).info.size
    assert admin.merge_clusters(dest.id, mixed.id) == size
    assert mixed.id not in {c.id for c in admin.clusters()}
    # Bad input is a 400 / 404 with a message, as elsewhere.
    r = httpx.delete(f"{svc.url}/v1/clusters/{dest.id}", params={"action": "shred"},
                     headers={"Authorization": f"Bearer {KEY_ADMIN}"})
    assert r.status_code == 400
    r = httpx.post(f"{svc.url}/v1/clusters/999999/merge", json={"other": dest.id},
                   headers={"Authorization": f"Bearer {KEY_ADMIN}"})
    assert r.status_code == 404 and "no cluster with id 999999" in r.json()["error"]["message"]
    # One namespace for a whole batch, on the wire too; naming it twice is refused.
    r = httpx.post(f"{svc.url}/v1/memories", headers={"Authorization": f"Bearer {KEY_U1}"},
                   json={"namespace": "u1", "items": [{"text": "x", "namespace": "u1", "vector": [1.0] * 384}]})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]
    u1.close()


# -- MCP ---------------------------------------------------------------------------------------
def test_mcp_forget_topic(tmp_path):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    path = tmp_path / "store"
    with open_store(path) as s:
        mine, _ = topic_vectors(120, 2, seed=3)
        s.add_many([f"agent note {i}" for i in range(120)], embeddings=mine, namespace="agent")
        other = s.add_many(["other tenant"] * 40, embeddings=topic_vectors(40, 1, seed=8)[0], namespace="other")
        s.organize()
        other_topic = s.get(other[0]).cluster_id
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=child_env(),
                                   args=["-m", "clag_fast.cli", "mcp", "--store", str(path), "--namespace", "agent",
                                         "--no-embedder"])

    def data(result):
        assert not result.is_error, result.content
        return result.structured_content if result.structured_content is not None else json.loads(result.content[0].text)

    async def session():
        async with Client(params, read_timeout_seconds=120) as client:
            topics = data(await client.call_tool("list_topics", {}))["topics"]
            first = topics[0]
            gone = data(await client.call_tool("forget_topic", {"topic_id": first["id"]}))
            assert gone == {"forgotten": first["size"]}
            after = data(await client.call_tool("list_topics", {}))["topics"]
            assert first["id"] not in [t["id"] for t in after]
            bad = await client.call_tool("forget_topic", {"topic_id": other_topic})
            assert bad.is_error and "no topic with id" in bad.content[0].text
            return first["size"]

    forgotten = anyio.run(session)
    with open_store(path) as s:
        assert len(s.memories(namespace="agent", limit=1000).items) == 120 - forgotten
        assert len(s.memories(namespace="other", limit=1000).items) == 40
