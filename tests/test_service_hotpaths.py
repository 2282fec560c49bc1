"""``hotpaths.HotPaths`` answers POST /v1/search and POST /v1/memories without FastAPI's
request machinery: every answer (status, error body, headers) must be the one FastAPI's own
routes give for the same request. Each request is sent to the service's app and to the same
FastAPI app without the hot paths, in one process (real FastAPI, pydantic and store)."""

from __future__ import annotations

import asyncio
import json

import pytest

from clag_fast.server.app import create_app
from clag_fast.server.http_errors import BodyLimit
from clag_fast.server.settings import Limits, ServeConfig
from store_helpers import DIM, topic_vectors

KEY_A = "hot-key-a-0123456789abc"
KEY_READER = "hot-reader-0123456789ab"
KEYS = f"""
[[keys]]
name = "a"
key = "{KEY_A}"
write = ["a"]

[[keys]]
name = "reader"
key = "{KEY_READER}"
read = ["a"]
"""

V = topic_vectors(3, 2, seed=4)[0][0].tolist()
BODIES = [
    # writes
    ("/v1/memories", {"text": "likes green tea", "vector": V, "namespace": "a"}),
    ("/v1/memories", {"items": [{"text": "one", "vector": V, "namespace": "a"},
                                {"text": "two", "vector": V, "namespace": "a", "key": "k2", "metadata": {"x": 1}}]}),
    ("/v1/memories", {"text": "x", "vector": V, "namespace": "b"}),  # another namespace: 403
    ("/v1/memories", {"text": "x", "vector": V[:-1], "namespace": "a"}),
    ("/v1/memories", {"text": "x", "namespace": "a"}),  # a text to a store without an embedder
    ("/v1/memories", {"text": 12, "vector": V}),
    ("/v1/memories", {"items": []}),
    ("/v1/memories", {"items": [{"text": "a", "vector": V}, {"text": "b"}]}),
    ("/v1/memories", {"text": "x" * 300, "vector": V, "namespace": "a"}),  # over max_text_chars
    ("/v1/memories", b'{"text": "x", "vector": [NaN]}'),
    ("/v1/memories", b'{"text": "x", '),
    ("/v1/memories", b""),
    ("/v1/memories", b"null"),
    ("/v1/memories", b"[1, 2]"),
    ("/v1/memories", b"\xff\xfe\x00"),
    ("/v1/memories", b"[" * 50_000 + b"]" * 50_000),
    # reads
    ("/v1/search", {"vector": V, "k": 3, "namespace": "a"}),
    ("/v1/search", {"vector": V, "k": 3, "namespace": "b"}),  # not readable: 403
    ("/v1/search", {"vector": V, "k": 3}),  # no namespace, restricted key
    ("/v1/search", {"vector": V, "k": 0, "namespace": "a"}),
    ("/v1/search", {"vector": V, "k": 10**6, "namespace": "a"}),
    ("/v1/search", {"query": "tea", "vector": V, "namespace": "a"}),
    ("/v1/search", {"query": "   ", "namespace": "a"}),
    ("/v1/search", {"vector": V, "namespace": "a", "mode": "sideways"}),
    ("/v1/search", {"vector": V, "namespace": "a", "where": {"$and": [1]}}),
    ("/v1/search", {"vector": V, "namespace": "a", "colour": "red"}),
    ("/v1/search", b"{}"),
    ("/v1/search", b'"text"'),
]
KEYS_SENT = [None, KEY_A, KEY_READER, "unknown-key-0123456789a"]


async def _call(app, path: str, body: bytes, key: str | None) -> tuple[int, bytes, dict[bytes, bytes]]:
    headers = [(b"host", b"test"), (b"content-length", str(len(body)).encode())]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "path": path,
             "raw_path": path.encode(), "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "scheme": "http", "root_path": "", "state": {}}
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the answer is written
        return {}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], payload, {k: v for k, v in start["headers"] if k != b"content-length"}


def _comparable(status: int, payload: bytes) -> object:
    """An answer without what differs between two correct answers: fresh ids, timings."""
    data = json.loads(payload)
    if status == 200 and "ids" in data:
        return len(data["ids"])
    if status == 200 and "hits" in data:
        return [(h["text"], round(h["score"], 5), h["namespace"]) for h in data["hits"]]
    return data


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    root = tmp_path_factory.mktemp("hot")
    keys = root / "keys.toml"
    keys.write_text(KEYS)
    # Two stores with the same writes, so both apps' searches see the same memories.
    made = []
    for name in ("hot", "plain"):
        config = ServeConfig(store=root / name, keys=keys, embedder=False, dim=DIM,
                             limits=Limits(max_text_chars=200))
        made.append(create_app(config))
    hot, plain_wrapped = made
    # The second: the same FastAPI app (routes, handlers, errors) behind the same body guard,
    # without the hot paths in front.
    plain = BodyLimit(plain_wrapped.fastapi, plain_wrapped.max_bytes)
    loop = asyncio.new_event_loop()
    stops = [loop.run_until_complete(_start(app.fastapi)) for app in made]
    yield loop, hot, plain
    for stop in stops:
        loop.run_until_complete(stop())
    loop.close()


async def _start(app):
    """Run the app's lifespan startup; returns the coroutine function that shuts it down."""
    inbox: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                     inbox.get, outbox.put))
    assert (await outbox.get())["type"] == "lifespan.startup.complete"

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await task

    return stop


def test_hot_paths_answer_as_fastapi_routes(apps):
    loop, hot, plain = apps
    checked = set()
    for path, body in BODIES:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        for key in KEYS_SENT:
            a = loop.run_until_complete(_call(hot, path, raw, key))
            b = loop.run_until_complete(_call(plain, path, raw, key))
            where = f"{path} {raw[:60]!r} key={key}"
            assert a[0] == b[0], f"{where}: status {a[0]} (hot path) vs {b[0]} (FastAPI): {a[1][:200]!r} / {b[1][:200]!r}"
            assert a[2] == b[2], f"{where}: headers {a[2]} vs {b[2]}"
            if a[0] == 200:
                assert _comparable(*a[:2]) == _comparable(*b[:2]), where
            else:
                assert a[1] == b[1], f"{where}: {a[1][:300]!r} vs {b[1][:300]!r}"
            checked.add(a[0])
    # The cases reach every kind of answer: success, bad input, auth, rights, limits.
    assert {200, 400, 401, 403, 413} <= checked, checked


def test_hot_path_answers_are_the_response_models(apps):
    loop, hot, _ = apps
    status, payload, headers = loop.run_until_complete(_call(
        hot, "/v1/search", json.dumps({"vector": V, "k": 2, "namespace": "a"}).encode(), KEY_A))
    assert status == 200 and headers[b"content-type"] == b"application/json"
    from clag_fast.server.models import HitsOut

    hits = HitsOut.model_validate_json(payload)
    assert 1 <= len(hits.hits) <= 2 and all(h.namespace == "a" for h in hits.hits)
