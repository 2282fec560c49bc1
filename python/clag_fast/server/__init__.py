"""``clag-fast serve``: the store as an HTTP service (FastAPI on uvicorn) and as MCP tools.

    from clag_fast.server import ServeConfig, serve
    serve(ServeConfig(store="mem/", port=8420))

Modules: ``settings`` (ServeConfig, Limits), ``auth`` (keys file, namespace rights),
``models`` (request/response bodies), ``batching`` (coalescing concurrent requests),
``service`` (the open store and shared work), ``routes`` (the /v1 API), ``hotpaths`` (the two
busiest routes answered without FastAPI's per-request machinery), ``http_errors`` (error
answers, body limit), ``app`` (the ASGI app, ``serve``), ``blas`` (numpy on one BLAS thread in
the serve process), ``mcp_tools`` (MCP server).
"""

from __future__ import annotations

from clag_fast.server.app import create_app, serve
from clag_fast.server.settings import Limits, ServeConfig

__all__ = ["Limits", "ServeConfig", "create_app", "serve"]
