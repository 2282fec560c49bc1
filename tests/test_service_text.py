"""The service with the real ONNX MiniLM embedder, through the async client: concurrent text
adds are coalesced into shared batches, text search finds them, /healthz reports the model."""

from __future__ import annotations

import asyncio
import time

import httpx

import clag_fast
from service_helpers import ServiceProcess

FACTS = [
    "The user is allergic to seafood.",
    "The user's flight to Tokyo leaves on May 3.",
    "The user prefers aisle seats on long flights.",
    "The hotel in Kyoto is near the station.",
    "The user's partner is vegetarian.",
    "The work call with the Vancouver team is on Thursday.",
] + [f"Filler note number {i} about the weather in city {i}." for i in range(24)]


def test_text_adds_are_batched_and_searchable(tmp_path):
    with ServiceProcess(tmp_path / "store", embedder=True) as service:
        deadline = time.monotonic() + 120
        while httpx.get(service.url + "/healthz").json()["embedder"] != "ready":
            assert time.monotonic() < deadline, service.output()
            time.sleep(0.1)

        async def run():
            async with clag_fast.connect_async(service.url) as client:
                ids = await asyncio.gather(*(client.add(t, namespace="trip") for t in FACTS))
                hits = await client.search("what food must the user avoid?", k=3, namespace="trip")
                many = await client.search_many(["which seat does the user like?", "when is the flight?"], k=1,
                                                namespace="trip")
                stats = await client.stats()
                got = await client.get(ids[0])
                return ids, hits, many, stats, got

        ids, hits, many, stats, got = asyncio.run(run())
    # SIGTERM: uvicorn finishes the requests, the store is closed, then the signal ends the process
    assert "store" in service.output() and "closed" in service.output(), service.output()
    assert len(set(ids)) == len(FACTS)
    assert got.text == FACTS[0]
    assert hits[0].text == "The user is allergic to seafood."
    assert [h[0].text for h in many] == ["The user prefers aisle seats on long flights.",
                                         "The user's flight to Tokyo leaves on May 3."]
    assert stats["memories"] == len(FACTS)
    assert stats["service"]["adds"] == len(FACTS)
    assert stats["service"]["add_batches"] < len(FACTS)  # concurrent adds shared commits
