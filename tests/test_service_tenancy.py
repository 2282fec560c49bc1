"""API keys and namespaces: a key for namespace A never sees, counts or deletes B's data
through any endpoint; missing, unknown and expired keys get 401; whole-store operations need
an admin key."""

from __future__ import annotations

import hashlib

import httpx
import pytest

import clag_fast
from clag_fast.errors import ServiceForbidden, ServiceUnauthorized
from service_helpers import ServiceProcess
from store_helpers import topic_vectors

KEY_A = "tenant-a-key-0123456789"
KEY_B = "tenant-b-key-0123456789"
KEY_ADMIN = "admin-key-0123456789abc"
KEY_EXPIRED = "expired-key-0123456789a"
KEY_READER = "reader-key-0123456789ab"

KEYS_TOML = f"""
[[keys]]
name = "a"
key = "{KEY_A}"
write = ["a"]

[[keys]]
name = "b"
key = "{KEY_B}"
write = ["b", "b/*"]

[[keys]]
name = "admin"
key = "{KEY_ADMIN}"
admin = true

[[keys]]
name = "old"
key = "{KEY_EXPIRED}"
write = ["a"]
expires = 2020-01-01T00:00:00Z

[[keys]]
name = "reader"
key_sha256 = "{hashlib.sha256(KEY_READER.encode()).hexdigest()}"
read = ["a"]
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tenancy")
    keys = root / "keys.toml"
    keys.write_text(KEYS_TOML)
    with ServiceProcess(root / "store", keys=keys) as service:
        shared, _ = topic_vectors(120, 3, seed=4)       # the same topics in both namespaces
        own, _ = topic_vectors(40, 1, seed=99)          # a topic only A has
        a = clag_fast.connect(service.url, api_key=KEY_A)
        b = clag_fast.connect(service.url, api_key=KEY_B)
        admin = clag_fast.connect(service.url, api_key=KEY_ADMIN)
        a_ids = a.add_many([f"a-note {i}" for i in range(60)], embeddings=shared[:60], namespaces="a")
        a_ids += a.add_many([f"a-own {i}" for i in range(40)], embeddings=own, namespaces="a")
        b_ids = b.add_many([f"secret-b {i}" for i in range(60)], embeddings=shared[60:], namespaces="b")
        b_ids += b.add_many([f"secret-b sub {i}" for i in range(5)], embeddings=shared[:5], namespaces="b/sub")
        admin.organize()
        yield dict(service=service, a=a, b=b, admin=admin, a_ids=a_ids, b_ids=b_ids, shared=shared, own=own)
        for c in (a, b, admin):
            c.close()


def test_missing_unknown_and_expired_keys_get_401(world):
    url = world["service"].url
    for headers, fragment in (({}, "missing API key"), ({"Authorization": "Bearer nope-nope-nope"}, "unknown API key"),
                              ({"X-API-Key": KEY_EXPIRED}, "expired")):
        for method, path in (("GET", "/v1/stats"), ("POST", "/v1/search"), ("GET", "/v1/memories/1"),
                             ("GET", "/v1/clusters"), ("POST", "/v1/memories")):
            r = httpx.request(method, url + path, headers=headers, json={"vector": [0.0]})
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["code"] == "unauthorized" and fragment in r.json()["error"]["message"]
    assert httpx.get(url + "/healthz").status_code == 200
    with pytest.raises(ServiceUnauthorized):
        clag_fast.connect(url, api_key="wrong-key-wrong-key").stats()


def test_a_cannot_name_b(world):
    a, v = world["a"], world["shared"]
    for call in (lambda: a.search(v[0], k=5, namespace="b"),
                 lambda: a.search_many(v[:2], k=5, namespace="b/sub"),
                 lambda: a.add("intrude", embedding=v[0], namespace="b"),
                 lambda: a.memories(namespace="b"),
                 lambda: a.delete_namespace("b"),
                 lambda: a.get(key="k", namespace="b"),
                 lambda: a.delete_many(keys=["k"], namespace="b")):
        with pytest.raises(ServiceForbidden):
            call()


def test_a_sees_only_a_in_searches_and_listings(world):
    a, v = world["a"], world["shared"]
    hits = a.search(v[60], k=50)  # no namespace: the key's own
    assert hits and all(h.namespace == "a" and h.text.startswith("a-") for h in hits)
    assert hits.candidates == 100
    for many in a.search_many(v[60:63], k=10):
        assert all(h.namespace == "a" for h in many)
    assert a.namespaces() == ["a"]
    page, seen = a.memories(limit=30), []
    while True:
        seen += page.items
        if page.next_cursor is None:
            break
        page = a.memories(limit=30, cursor=page.next_cursor)
    assert sorted(m.memory_id for m in seen) == sorted(world["a_ids"])
    assert a.stats() == {"memories": 100, "namespaces": {"a": 100}}


def test_b_ids_look_unknown_to_a_and_stay_intact(world):
    a, admin = world["a"], world["admin"]
    for mid in world["b_ids"][:5]:
        with pytest.raises(KeyError) as e:
            a.get(mid)
        assert str(mid) in str(e.value) and "secret" not in str(e.value)
        with pytest.raises(KeyError):
            a.update(mid, text="overwritten by a")
        with pytest.raises(KeyError):
            a.delete(mid)
    assert a.get_many(world["b_ids"]) == []
    assert a.delete_many(world["b_ids"]) == 0
    assert [m.text for m in admin.get_many(world["b_ids"][:3])] == ["secret-b 0", "secret-b 1", "secret-b 2"]
    assert admin.stats()["memories"] == 165


def test_labels_of_mixed_clusters_are_hidden_from_a(world):
    a, admin = world["a"], world["admin"]
    every = admin.clusters()
    mine = a.clusters()
    assert every and len(mine) < len(every)
    for c in mine:  # every cluster A sees holds only A's memories
        page = admin.memories(cluster=c.id, limit=1000)
        assert page.items and all(m.namespace == "a" for m in page.items)
    visible = {c.id for c in mine}
    hits = a.search(world["shared"][70], k=20)
    for h in hits:
        assert h.cluster_id is None or h.cluster_id in visible
        if h.cluster_id is None:
            assert h.cluster_summary == "" and h.cluster_tags == []
    own_hits = a.search(world["own"][0], k=5)
    assert own_hits[0].cluster_id in visible  # A's own topic keeps its label


def test_whole_store_operations_need_admin(world):
    a, reader = world["a"], clag_fast.connect(world["service"].url, api_key=KEY_READER)
    for call in (a.organize, a.forget, a.flush):
        with pytest.raises(ServiceForbidden, match="admin"):
            call()
    assert "clusters" not in a.stats()
    assert reader.search(world["shared"][0], k=3)[0].namespace == "a"
    with pytest.raises(ServiceForbidden, match="may not write"):
        reader.add("read-only key", embedding=world["shared"][0], namespace="a")
    b = world["b"]
    assert b.search(world["shared"][0], k=3, namespace="b/sub")[0].text.startswith("secret-b sub")
    reader.close()


def test_nothing_of_b_appears_in_any_answer_to_a(world):
    """Every GET and POST that A can make, with every id of B: no text, id or count of B."""
    url, v = world["service"].url, world["shared"]
    h = {"Authorization": f"Bearer {KEY_A}"}
    bodies = []
    for path in ("/v1/stats", "/v1/clusters", "/v1/namespaces", "/v1/memories?limit=1000"):
        bodies.append(httpx.get(url + path, headers=h).text)
    bodies.append(httpx.post(url + "/v1/search", headers=h, json={"vector": v[61].tolist(), "k": 1000}).text)
    bodies.append(httpx.post(url + "/v1/search/batch", headers=h,
                             json={"vectors": [v[61].tolist()], "k": 1000, "mode": "flat"}).text)
    bodies.append(httpx.post(url + "/v1/memories/get", headers=h, json={"ids": world["b_ids"]}).text)
    for mid in world["b_ids"][:10]:
        bodies.append(httpx.get(f"{url}/v1/memories/{mid}", headers=h).text)
    text = "\n".join(bodies)
    assert "secret-b" not in text and '"b"' not in text and "b/sub" not in text



def test_a_cluster_stops_showing_its_label_once_b_joins_it(world):
    """Runs last: B writes into A's own topic; without any re-organisation the cluster is no
    longer A's alone, so A stops seeing its label at once."""
    a, b, own = world["a"], world["b"], world["own"]
    before = a.search(own[0], k=1)[0].cluster_id
    assert before is not None and before in {c.id for c in a.clusters()}
    b.add_many([f"secret-b joins {i}" for i in range(10)], embeddings=own[:10], namespaces="b")
    assert before not in {c.id for c in a.clusters()}
    hit = a.search(own[0], k=1)[0]
    assert hit.cluster_id is None and hit.cluster_summary == "" and hit.cluster_tags == []
    # a re-organisation moves memories between clusters: the table is rebuilt, A still sees
    # only clusters of its own
    world["admin"].organize()
    for c in a.clusters():
        page = world["admin"].memories(cluster=c.id, limit=1000)
        assert all(m.namespace == "a" for m in page.items)
