"""clag_fast: a fast adaptive memory store for SLM agents (CLAG, agent-driven clustering).

    from clag_fast import MemoryStore
    with MemoryStore.open("mem/") as store:
        store.add("The user is allergic to seafood", namespace="user-42")
        hits = store.search("what can the user eat?", k=5, namespace="user-42")

Subpackages: ``store`` (MemoryStore and the state it owns), ``slm`` (client, managed server,
organiser), ``embed`` (the ONNX MiniLM embedder), ``eval`` (LoCoMo evaluation); ``index`` is
the facade over the native core, ``config`` every setting, ``errors`` every exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clag_fast._clag_fast import __version__
from clag_fast.config import RankingConfig, SLMConfig, StoreConfig
from clag_fast.decay import ForgettingPolicy
from clag_fast.errors import (
    DimensionMismatchError,
    FilterError,
    LLMError,
    LLMHTTPError,
    LLMInvalidOutput,
    LLMTimeout,
    LLMUnreachable,
    MalformedRecordError,
    ModelFilesError,
    SchemaError,
    ServerUnavailable,
    ServiceBusy,
    ServiceError,
    ServiceForbidden,
    ServiceUnauthorized,
    ShardUnavailable,
    StoreFormatError,
    StoreLockedError,
)
from clag_fast.index import VectorIndex
from clag_fast.results import ClusterInfo, ClusterPage, Hit, Hits, Memory, MemoryPage, Turn
from clag_fast.store import MemoryStore

if TYPE_CHECKING:
    from clag_fast.client import AsyncClient, Client, connect, connect_async
    from clag_fast.embed import Embedder
    from clag_fast.slm.client import LLMClient
    from clag_fast.slm.organizer import Organizer, OrganizerConfig
    from clag_fast.slm.server import ManagedServer

# ONNX Runtime loads on first use, so `import clag_fast` stays fast for users who bring their
# own vectors.
_LAZY = {
    "Embedder": "clag_fast.embed",
    "LLMClient": "clag_fast.slm.client",
    "ManagedServer": "clag_fast.slm.server",
    "Organizer": "clag_fast.slm.organizer",
    "OrganizerConfig": "clag_fast.slm.organizer",
    # httpx loads only for users of the service client.
    "AsyncClient": "clag_fast.client",
    "Client": "clag_fast.client",
    "connect": "clag_fast.client",
    "connect_async": "clag_fast.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clag_fast' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AsyncClient",
    "Client",
    "ClusterInfo",
    "ClusterPage",
    "DimensionMismatchError",
    "Embedder",
    "FilterError",
    "ForgettingPolicy",
    "Hit",
    "Hits",
    "LLMClient",
    "LLMError",
    "LLMHTTPError",
    "LLMInvalidOutput",
    "LLMTimeout",
    "LLMUnreachable",
    "MalformedRecordError",
    "ManagedServer",
    "Memory",
    "MemoryPage",
    "MemoryStore",
    "ModelFilesError",
    "Organizer",
    "OrganizerConfig",
    "RankingConfig",
    "SLMConfig",
    "SchemaError",
    "ServerUnavailable",
    "ServiceBusy",
    "ServiceError",
    "ServiceForbidden",
    "ServiceUnauthorized",
    "ShardUnavailable",
    "StoreConfig",
    "StoreFormatError",
    "StoreLockedError",
    "Turn",
    "VectorIndex",
    "__version__",
    "connect",
    "connect_async",
]
