"""clag_fast: a fast adaptive memory store for SLM agents (CLAG, agent-driven clustering).

    from clag_fast import MemoryStore
    with MemoryStore.open("mem/") as store:
        store.add("The user is allergic to seafood", namespace="user-42")
        hits = store.search("what can the user eat?", k=5, namespace="user-42")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clag_fast._clag_fast import __version__
from clag_fast.config import StoreConfig
from clag_fast.forgetting import ForgettingPolicy
from clag_fast.index import VectorIndex
from clag_fast.results import ClusterInfo, Hit, Hits, Memory
from clag_fast.store import MemoryStore

if TYPE_CHECKING:
    from clag_fast.embed import Embedder
    from clag_fast.llm import LLMClient, LLMError
    from clag_fast.organizer import Organizer, OrganizerConfig
    from clag_fast.server import ManagedServer

# Heavier parts (ONNX Runtime, HTTP client) load on first use, so `import clag_fast` stays
# fast for users who bring their own vectors.
_LAZY = {
    "Embedder": "clag_fast.embed",
    "LLMClient": "clag_fast.llm",
    "LLMError": "clag_fast.llm",
    "ManagedServer": "clag_fast.server",
    "Organizer": "clag_fast.organizer",
    "OrganizerConfig": "clag_fast.organizer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clag_fast' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ClusterInfo",
    "Embedder",
    "ForgettingPolicy",
    "Hit",
    "Hits",
    "LLMClient",
    "LLMError",
    "ManagedServer",
    "Memory",
    "MemoryStore",
    "Organizer",
    "OrganizerConfig",
    "StoreConfig",
    "VectorIndex",
    "__version__",
]
