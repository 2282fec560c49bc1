"""``clag-fast mcp``: one namespace of a store as MCP tools (official ``mcp`` SDK, 2.x).

Tools, named as agent memory tools usually are: ``add_memories``, ``search_memory``,
``list_memories``, ``delete_memories``, ``list_topics`` (cluster labels) and ``forget_topic``
(archive or delete a topic's memories). Every tool reads
and writes only the namespace given at start-up; topics are shown only for clusters whose
members all lie in it (``tenancy``). Transports: stdio (an agent runtime starts this process)
or streamable HTTP on a loopback port (``--http``).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from clag_fast._deprecated import renamed_kwargs
from clag_fast.server import tenancy

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Long-term memory. Call search_memory before answering questions about the user or earlier "
    "work; call add_memories to store durable facts, preferences and decisions (one short "
    "statement each). list_topics shows how the memories are grouped.")


@contextmanager
def _told_to_agent() -> Iterator[None]:
    """Bad arguments become ToolError, whose message the SDK passes to the agent (it hides the
    message of any other exception)."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        yield
    except (ValueError, TypeError, KeyError) as e:
        raise ToolError(str(e)) from None


def build_mcp(service: Any, namespace: str) -> Any:
    """An ``MCPServer`` whose tools use the open store of ``service`` (a ``StoreService``,
    for its cluster table) within ``namespace``."""
    from mcp.server.mcpserver import MCPServer

    from clag_fast._clag_fast import __version__

    server = MCPServer(name="clag-fast memory", instructions=INSTRUCTIONS, version=__version__)
    store = service.store

    def topics_shown() -> set[int]:
        return tenancy.pure_clusters(service.cluster_namespaces(), lambda ns: ns == namespace)

    def own(memory_id: int) -> bool:
        try:
            return store.get(memory_id).namespace == namespace
        except KeyError:
            return False

    @server.tool(name="add_memories")
    def add_memories(memories: list[str], kind: str = "fact") -> dict[str, list[int]]:
        """Store memories (each a short self-contained statement); returns their ids."""
        with _told_to_agent():
            if not memories:
                raise ValueError("memories is empty: give one or more statements")
            ids = store.add_many(memories, kinds=kind, namespaces=namespace)
            service.rerouted(ids)
            return {"ids": ids}

    @server.tool(name="search_memory")
    def search_memory(query: str, k: int = 5) -> dict[str, Any]:
        """The k stored memories most relevant to the query, best first, with their topic."""
        with _told_to_agent():
            if not 1 <= k <= 100:
                raise ValueError(f"k must be between 1 and 100, got {k}")
            hits = store.search(query, k=k, namespace=namespace)
            pure = topics_shown()
            return {"results": [{"id": h.memory_id, "memory": h.text, "score": round(float(h.score), 4),
                                 "topic": h.cluster_summary if h.cluster_id in pure else ""} for h in hits]}

    @server.tool(name="list_memories")
    def list_memories(limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        """Stored memories, oldest first, a page at a time (pass next_cursor back)."""
        with _told_to_agent():
            if not 1 <= limit <= 1000:
                raise ValueError(f"limit must be between 1 and 1000, got {limit}")
            page = store.memories(namespace=namespace, limit=limit, cursor=cursor)
            return {"memories": [{"id": m.memory_id, "memory": m.text, "kind": m.kind} for m in page.items],
                    "next_cursor": page.next_cursor}

    @server.tool(name="delete_memories")
    def delete_memories(ids: list[int]) -> dict[str, int]:
        """Delete memories by id; returns how many were deleted (unknown ids are ignored)."""
        with _told_to_agent():
            mine = [i for i in ids if own(i)]
            for i in mine:
                store.delete(i)
            return {"deleted": len(mine)}

    @server.tool(name="forget_topic")
    def forget_topic(topic_id: int, delete: bool = False) -> dict[str, int]:
        """Forget a whole topic (an id from list_topics): its memories are archived (kept but
        never found again), or deleted with delete=true. Returns how many were forgotten."""
        with _told_to_agent():
            if topic_id not in topics_shown():
                raise ValueError(f"no topic with id {topic_id} (list_topics shows the ids)")
            n = store.forget_cluster(topic_id, action="delete" if delete else "archive", namespace=namespace)
            service.rerouted(None)
            return {"forgotten": n}

    @server.tool(name="list_topics")
    def list_topics() -> dict[str, Any]:
        """The topics (cluster labels) the memories are grouped into, largest first."""
        with _told_to_agent():
            pure = topics_shown()
            return {"topics": [{"id": c.id, "summary": c.summary, "tags": c.tags, "size": c.size}
                               for c in store.clusters() if c.id in pure]}

    return server


@renamed_kwargs(llm="slm")
def run_mcp(path: Path, namespace: str, *, http: bool = False, host: str = "127.0.0.1", port: int = 8421,
            slm: str = "off", embedder: bool = True, dim: int | None = None) -> None:
    """Open the store and serve the tools until the client hangs up (stdio) or SIGINT (HTTP).
    ``slm``: as ``ServeConfig.slm`` (``llm`` is its deprecated spelling)."""
    from clag_fast.server.service import StoreService
    from clag_fast.server.settings import ServeConfig, is_loopback

    if http and not is_loopback(host):
        raise ValueError(f"clag-fast mcp --http serves loopback only (it has no authentication), not {host!r}")
    service = StoreService(ServeConfig(store=path, slm=slm, embedder=embedder, dim=dim))
    store = service.open()
    try:
        server = build_mcp(service, namespace)
        if http:
            server.run("streamable-http", host=host, port=port)
        else:
            server.run("stdio")
    finally:
        store.close()
