"""``clag-fast mcp``: the tools over stdio, driven by the official MCP SDK's own client in a
real subprocess, with the real text embedder; scoped to one namespace."""

from __future__ import annotations

import json
import sys

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from clag_fast.store import MemoryStore
from clag_fast.config import StoreConfig
from service_helpers import ROOT, child_env
from store_helpers import topic_vectors


def _data(result):
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def test_mcp_tools_over_stdio_stay_in_their_namespace(tmp_path):
    path = tmp_path / "store"
    with MemoryStore.open(path, config=StoreConfig(slm="off"), embedder=False, slm=False) as store:
        other_ids = store.add_many(["other tenant secret"] * 3, embeddings=topic_vectors(3, 1, seed=5)[0],
                                   namespaces="other")
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=child_env(),
                                   args=["-m", "clag_fast.cli", "mcp", "--store", str(path), "--namespace", "agent"])

    async def session():
        async with Client(params, read_timeout_seconds=120) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == {"add_memories", "search_memory", "list_memories", "delete_memories", "list_topics",
                             "forget_topic"}
            added = _data(await client.call_tool("add_memories", {"memories": [
                "The user is allergic to seafood.",
                "The user's flight to Tokyo leaves on May 3.",
                "The user prefers aisle seats on long flights."]}))["ids"]
            assert len(added) == 3
            found = _data(await client.call_tool("search_memory", {"query": "what food must the user avoid?", "k": 2}))
            assert found["results"][0]["memory"] == "The user is allergic to seafood."
            assert all(r["id"] in added for r in found["results"])
            listed = _data(await client.call_tool("list_memories", {"limit": 10}))
            assert [m["id"] for m in listed["memories"]] == added and listed["next_cursor"] is None
            gone = _data(await client.call_tool("delete_memories", {"ids": [added[2], other_ids[0]]}))
            assert gone == {"deleted": 1}  # the other namespace's id is not this tool's to delete
            topics = _data(await client.call_tool("list_topics", {}))
            assert isinstance(topics["topics"], list)
            bad = await client.call_tool("search_memory", {"query": "x", "k": 0})
            assert bad.is_error and "k must be" in bad.content[0].text
            return added

    added = anyio.run(session)
    with MemoryStore.open(path, config=StoreConfig(slm="off"), embedder=False, slm=False) as store:
        assert [m.text for m in store.get_many(other_ids)] == ["other tenant secret"] * 3
        assert store.get(added[0]).namespace == "agent"
        with pytest.raises(KeyError):
            store.get(added[2])


def test_mcp_over_streamable_http(tmp_path):
    import subprocess
    import time

    import httpx

    from service_helpers import free_port

    port = free_port()
    log = open(tmp_path / "mcp.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "clag_fast.cli", "mcp", "--store", str(tmp_path / "store"),
                             "--namespace", "agent", "--http", "--port", str(port)],
                            cwd=str(ROOT), env=child_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "mcp.log").read_text()
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)

        async def session():
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=120) as client:
                ids = _data(await client.call_tool("add_memories", {"memories": ["The user's dog is called Miso."]}))["ids"]
                found = _data(await client.call_tool("search_memory", {"query": "what is the dog's name?", "k": 1}))
                return ids, found

        ids, found = anyio.run(session)
        assert found["results"][0]["id"] == ids[0]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_mcp_http_refuses_a_public_address(tmp_path):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "clag_fast.cli", "mcp", "--store", str(tmp_path / "s"), "--http",
                        "--host", "0.0.0.0"], cwd=str(ROOT), env=child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "loopback only" in r.stderr
