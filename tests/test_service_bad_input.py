"""Bad requests to ``clag-fast serve``: each gets a 4xx with a JSON error naming the problem,
the store is untouched, and the service keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from service_helpers import ServiceProcess
from store_helpers import DIM, topic_vectors


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(tmp_path_factory.mktemp("bad") / "store") as s:
        v = topic_vectors(5, 2, seed=1)[0]
        r = httpx.post(s.url + "/v1/memories", json={"items": [
            {"text": f"seed {i}", "vector": v[i].tolist(), "namespace": "n"} for i in range(5)]})
        assert r.status_code == 200, r.text
        s.seed_ids = r.json()["ids"]
        s.vector = v[0].tolist()
        yield s


def _snapshot(url):
    page = httpx.post(url + "/v1/search", json={"vector": [1.0] + [0.0] * (DIM - 1), "k": 100, "mode": "flat"}).json()
    return httpx.get(url + "/v1/stats").json()["memories"], sorted((h["memory_id"], h["text"]) for h in page["hits"])


V = [0.1] * DIM
CASES = [
    # (method, path, raw body or json, status, code fragment, message fragment)
    ("POST", "/v1/memories", b'{"text": "x", ', 400, "malformed_json", "not valid JSON"),
    ("POST", "/v1/memories", b"not json at all", 400, "malformed_json", "not valid JSON"),
    ("POST", "/v1/memories", {"text": 12, "vector": V}, 400, "invalid_request", "text"),
    ("POST", "/v1/memories", {"text": "x", "vector": "abc"}, 400, "invalid_request", "vector"),
    ("POST", "/v1/memories", b'{"text": "x", "vector": [NaN, 1.0]}', 400, "invalid_request", "finite"),
    ("POST", "/v1/memories", b'{"text": "x", "vector": [Infinity]}', 400, "invalid_request", "finite"),
    ("POST", "/v1/memories", {"text": "x", "vector": [0.1] * 7}, 400, "wrong_dimension", "7 dimensions"),
    ("POST", "/v1/memories", {"text": "", "vector": V}, 400, "invalid_request", "text"),
    ("POST", "/v1/memories", {"text": "   ", "vector": V}, 400, "invalid", "empty"),
    ("POST", "/v1/memories", {"text": "x" * 40_000, "vector": V}, 413, "text_too_long", "limit"),
    ("POST", "/v1/memories", {"text": "x" * (10 * 1024 * 1024), "vector": V}, 413, "too_large", "limit"),
    ("POST", "/v1/memories", {"text": "x", "vector": V, "colour": "red"}, 400, "invalid_request", "colour"),
    ("POST", "/v1/memories", b'{"text": "x", "vector": %s, "metadata": %s1%s}' % (str(V).encode(), b'{"a": ' * 40, b"}" * 40),
     400, "invalid", "nests deeper than 32"),
    ("POST", "/v1/search", b'{"vector": %s, "where": %s{"a": 1}%s}' % (str(V).encode(), b'{"$and": [' * 600, b"]}" * 600),
     400, "malformed_json", "parsing the body"),
    ("POST", "/v1/search", b'{"vector": %s, "where": {"$and": [1]}}' % str(V).encode(), 400, "invalid", "$and"),
    ("POST", "/v1/search", b"[" * 100_000 + b"]" * 100_000, 400, "malformed_json", "parsing the body"),
    ("POST", "/v1/memories", {"items": []}, 400, "invalid_request", "items"),
    ("POST", "/v1/memories", {"items": [{"text": "a", "vector": V}, {"text": "b"}]}, 400, "invalid_request",
     "every item"),
    ("POST", "/v1/memories", {"items": [{"text": "a", "vector": V}] * 1001}, 413, "batch_too_large", "1001"),
    ("POST", "/v1/search", {"vector": V, "k": 0}, 400, "invalid_request", "k"),
    ("POST", "/v1/search", {"vector": V, "k": 10**9}, 400, "invalid_request", "k must be at most"),
    ("POST", "/v1/search", {"vector": V, "k": "five"}, 400, "invalid_request", "k"),
    ("POST", "/v1/search", {"vector": V, "mode": "sideways"}, 400, "invalid_request", "mode"),
    ("POST", "/v1/search", {"k": 3}, 400, "invalid_request", "exactly one"),
    ("POST", "/v1/search", {"query": "a", "vector": V}, 400, "invalid_request", "exactly one"),
    ("POST", "/v1/search", {"vector": [0.1] * 3}, 400, "wrong_dimension", "3 dimensions"),
    ("POST", "/v1/search", {"query": "no embedder here"}, 400, "invalid", "embedder=False"),
    ("POST", "/v1/search/batch", {"vectors": [V, [0.1] * 5]}, 400, "wrong_dimension", "vectors[1]"),
    ("GET", "/v1/memories/999999", None, 404, "not_found", "999999"),
    ("GET", "/v1/memories/abc", None, 400, "invalid_request", "memory_id"),
    ("PATCH", "/v1/memories/999999", {"text": "new"}, 404, "not_found", "999999"),
    ("PATCH", "/v1/memories/1", {}, 400, "invalid", "text= and/or metadata="),
    ("DELETE", "/v1/memories/999999", None, 404, "not_found", "999999"),
    ("GET", "/v1/no-such-endpoint", None, 404, "not_found", "Not Found"),
    ("PUT", "/v1/search", {"vector": V}, 405, "method_not_allowed", "Method Not Allowed"),
    ("GET", "/v1/memories?limit=0", None, 400, "invalid_request", "limit"),
]


@pytest.mark.parametrize("method, path, body, status, code, fragment", CASES,
                         ids=[f"{c[0]} {c[1]} {c[3]} {c[4]}" for c in CASES])
def test_bad_request_is_a_clear_4xx_and_changes_nothing(service, method, path, body, status, code, fragment):
    before = _snapshot(service.url)
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    r = httpx.request(method, service.url + path, timeout=60, **kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert fragment in err["message"]
    assert "Traceback" not in r.text
    assert _snapshot(service.url) == before
    assert httpx.get(service.url + "/healthz").status_code == 200


def test_a_bad_request_in_a_batch_of_concurrent_adds_fails_alone(service):
    """Adds that arrive together are committed together; one the store refuses (a text of
    spaces: only the store checks it) fails alone, the others are stored."""
    import concurrent.futures as cf

    import threading

    v = topic_vectors(100, 2, seed=9)[0]
    # Requests leave together (a barrier per round of 20): the server answers one add faster
    # than a client thread sends the next, so unsynchronised threads may never share a batch.
    # On a busy machine even a round may arrive spread out, so rounds repeat (at most five)
    # until one shared batches; every round's answers are checked.
    start = threading.Barrier(20)

    def add(i):
        item = {"text": f"batch {i}", "vector": v[i].tolist(), "namespace": "batch"}
        if i % 10 == 3:
            item["text"] = "   "  # refused by add_many, after the batch was formed
        body = json.dumps(item).encode()
        start.wait(timeout=60)
        return httpx.post(service.url + "/v1/memories", content=body, timeout=60)

    stored = 0
    for round_ in range(5):
        batches = httpx.get(service.url + "/v1/stats", timeout=60).json()["service"]["add_batches"]
        numbers = range(20 * round_, 20 * round_ + 20)
        with cf.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(add, numbers))
        shared = httpx.get(service.url + "/v1/stats", timeout=60).json()["service"]["add_batches"] - batches < 20
        good = [(i, r) for i, r in zip(numbers, answers) if i % 10 != 3]
        bad = [r for i, r in zip(numbers, answers) if i % 10 == 3]
        assert all(r.status_code == 200 for _, r in good), [r.text for _, r in good if r.status_code != 200]
        assert all(r.status_code == 400 and "whitespace" in r.json()["error"]["message"] for r in bad)
        for i, r in good:
            assert httpx.get(f"{service.url}/v1/memories/{r.json()['ids'][0]}", timeout=60).json()["text"] == f"batch {i}"
        stored += len(good)
        if shared:
            break
    # the adds shared batches, so refused ones were in batches with good ones
    assert shared, "no round of 20 concurrent adds shared a batch"
    hits = httpx.post(service.url + "/v1/search", json={"vector": v[0].tolist(), "k": 100, "namespace": "batch",
                                                       "mode": "flat"}, timeout=60).json()
    assert hits["candidates"] == stored


def test_non_loopback_without_keys_is_refused(tmp_path):
    import subprocess
    import sys

    from service_helpers import ROOT, child_env

    r = subprocess.run([sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(tmp_path / "s"),
                        "--host", "0.0.0.0", "--port", "1"], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2
    assert "without a keys file" in r.stderr
    assert not (tmp_path / "s").exists()  # refused before the store was created


def test_a_store_locked_by_another_writer_is_a_clear_start_error(tmp_path):
    import subprocess
    import sys

    from clag_fast.config import StoreConfig
    from clag_fast.store import MemoryStore
    from service_helpers import ROOT, child_env

    with MemoryStore.open(tmp_path / "s", config=StoreConfig(slm="off"), embedder=False, slm=False):
        r = subprocess.run([sys.executable, "-m", "clag_fast.cli", "serve", "--store", str(tmp_path / "s"),
                            "--no-embedder", "--port", "1"], capture_output=True, text=True, env=child_env(), cwd=ROOT,
                           timeout=120)
    assert r.returncode == 2
    assert "clag-fast serve: error:" in r.stderr and "read_only=True" in r.stderr
