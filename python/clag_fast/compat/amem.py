"""A-MEM's ``AgenticMemorySystem`` interface on a clag_fast ``MemoryStore`` (no extra package).

    from clag_fast.compat.amem import AgenticMemorySystem
    memory = AgenticMemorySystem(path="mem/")
    note_id = memory.add_note("Met Bob at the conference", tags=["work"], category="people")
    results = memory.search_agentic("who did I meet?", k=5)
    note = memory.read(note_id)

Shapes follow agiresearch/A-mem ``agentic_memory/memory_system.py``: ``add_note`` returns the
note id; ``read`` a ``MemoryNote`` or None; ``update`` / ``delete`` a bool; ``search`` a list
of ``{"id", "content", "context", "keywords", "score"}``; ``search_agentic`` a list of
``{"id", "content", "context", "keywords", "tags", "timestamp", "category", "is_neighbor",
"score"}`` (neighbors, from the notes' ``links``, have ``is_neighbor=True`` and no score).
As in A-MEM (Chroma distances) ``score`` is a distance, lower is closer: here
``1 - similarity`` of clag_fast's search. ``memories`` is a read-only mapping id -> note.

A-MEM asks its LLM for each note's keywords, context and tags and to evolve neighbours;
here notes keep the fields they are given, and clag_fast's SLM (``slm=``) organises them
into clusters instead. With ``slm=False`` organisation is vector-only.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import StoreConfig
from clag_fast.integrations.storehandle import StoreHandle
from clag_fast.store import MemoryStore

log = logging.getLogger(__name__)

FIELDS = ("keywords", "links", "retrieval_count", "timestamp", "last_accessed", "context",
          "evolution_history", "category", "tags")
PAGE = 1000


class MemoryNote:
    """A memory note with A-MEM's fields (content, id, keywords, links, retrieval_count,
    timestamp, last_accessed, context, evolution_history, category, tags)."""

    def __init__(self, content: str, id: str | None = None, keywords: list[str] | None = None,
                 links: list[str] | None = None, retrieval_count: int | None = None,
                 timestamp: str | None = None, last_accessed: str | None = None, context: str | None = None,
                 evolution_history: list | None = None, category: str | None = None,
                 tags: list[str] | None = None) -> None:
        self.content = content
        self.id = id or str(uuid.uuid4())
        self.keywords = keywords or []
        self.links = links or []
        self.context = context or "General"
        self.category = category or "Uncategorized"
        self.tags = tags or []
        now = datetime.now().strftime("%Y%m%d%H%M")
        self.timestamp = timestamp or now
        self.last_accessed = last_accessed or now
        self.retrieval_count = retrieval_count or 0
        self.evolution_history = evolution_history or []

    def fields(self) -> dict[str, Any]:
        """The note's fields other than content and id (stored as the memory's metadata)."""
        return {f: getattr(self, f) for f in FIELDS}

    def __repr__(self) -> str:
        return f"MemoryNote(id={self.id!r}, content={self.content!r})"


class AgenticMemorySystem:
    """A-MEM's memory system on clag_fast.

    model_name: only "all-MiniLM-L6-v2" (clag_fast's ONNX copy) unless ``embedder`` is given.
    llm_backend / llm_model / api_key: accepted for A-MEM's signature and unused; clag_fast's
      SLM is chosen with ``slm=`` (False: vector-only organisation; ``llm=`` is its
      deprecated spelling).
    evo_threshold: accepted and unused (clag_fast re-organises on its own triggers).
    store / path / config / embedder / namespace: the ``MemoryStore`` (see ``StoreHandle``; a
      temporary directory without either), an embedder object with ``encode`` (its ``dim``
      attribute or ``config.dim`` gives the width) and the store namespace of the notes.
    """

    @renamed_kwargs(llm="slm")
    def __init__(self, model_name: str = "all-MiniLM-L6-v2", llm_backend: str = "openai",
                 llm_model: str = "gpt-4o-mini", evo_threshold: int = 100, api_key: str | None = None, *,
                 store: MemoryStore | None = None, path: str | Path | None = None,
                 config: StoreConfig | None = None, embedder: Any = None, slm: Any = False,
                 namespace: str = "amem") -> None:
        if embedder is None and model_name != "all-MiniLM-L6-v2":
            raise ValueError(f"model_name {model_name!r} is not available: clag_fast ships all-MiniLM-L6-v2; "
                             "pass embedder= for another model")
        self.model_name = model_name
        self.evo_threshold = evo_threshold
        self.namespace = namespace
        dim = (config.dim if config is not None else None) or getattr(embedder, "dim", None) or 384
        self._handle = StoreHandle(store, path=path, config=config, encoder=embedder, slm=slm)
        self._store = self._handle.open_now(int(dim))
        self.memories = NoteView(self)

    @property
    def store(self) -> MemoryStore:
        """The ``MemoryStore`` holding the notes."""
        return self._store

    def close(self) -> None:
        """Close the store (when this object opened it) and remove a temporary directory."""
        self._handle.close()

    # -- notes ---------------------------------------------------------------------------
    def add_note(self, content: str, time: str | None = None, **kwargs: Any) -> str:
        """Store a new note (``time``: its timestamp, YYYYMMDDHHMM); returns its id. A note
        id that exists is replaced."""
        if time is not None:
            kwargs["timestamp"] = time
        note = MemoryNote(content=content, **kwargs)
        self._store.add(note.content, key=note.id, namespace=self.namespace, metadata=note.fields())
        return note.id

    def read(self, memory_id: str) -> MemoryNote | None:
        """The note with this id, or None."""
        found = self._store.get_many(keys=[memory_id], namespace=self.namespace) if _is_id(memory_id) else []
        return _note(found[0]) if found else None

    def update(self, memory_id: str, **kwargs: Any) -> bool:
        """Change a note's fields (content is re-embedded); False when there is no such note.
        Unknown field names are ignored, as in A-MEM."""
        note = self.read(memory_id)
        if note is None:
            return False
        for key, value in kwargs.items():
            if hasattr(note, key) and key != "id":
                setattr(note, key, value)
        text = note.content if "content" in kwargs else None
        self._store.update(key=memory_id, namespace=self.namespace, text=text, metadata=note.fields())
        return True

    def delete(self, memory_id: str) -> bool:
        """Delete a note; False when there is none with this id."""
        if not _is_id(memory_id):
            return False
        return self._store.delete_many(keys=[memory_id], namespace=self.namespace) > 0

    # -- search --------------------------------------------------------------------------
    def search(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` notes nearest ``query``: id, content, context, keywords, score (distance)."""
        return [{"id": h.key, "content": h.text, "context": (h.metadata or {}).get("context", "General"),
                 "keywords": (h.metadata or {}).get("keywords", []), "score": 1.0 - float(h.score)}
                for h in self._hits(query, k)]

    def search_agentic(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """``search`` with tags, timestamp and category, followed by the found notes' linked
        notes (``is_neighbor=True``), at most ``k`` results in all."""
        results: list[dict[str, Any]] = []
        seen: set[str] = set()
        hits = self._hits(query, k)
        for h in hits:
            d = _agentic(h.key, h.text, h.metadata or {}, False)
            d["score"] = 1.0 - float(h.score)
            results.append(d)
            seen.add(h.key)
        neighbours: list[str] = []
        for h in hits:
            for link in (h.metadata or {}).get("links", []) or []:
                if isinstance(link, str) and link not in seen and link not in neighbours:
                    neighbours.append(link)
        wanted = neighbours[: max(0, k - len(results))]
        if wanted:
            for m in self._store.get_many(keys=wanted, namespace=self.namespace):
                results.append(_agentic(m.key, m.text, m.metadata or {}, True))
        return results[:k]

    def find_related_memories(self, query: str, k: int = 5) -> tuple[str, list[int]]:
        """A-MEM's prompt-ready listing of the ``k`` nearest notes and their indices."""
        lines, indices = [], []
        for i, h in enumerate(self._hits(query, k)):
            m = h.metadata or {}
            lines.append(f"memory index:{i}\ttalk start time:{m.get('timestamp', '')}\tmemory content: {h.text}\t"
                         f"memory context: {m.get('context', '')}\tmemory keywords: {m.get('keywords', [])}\t"
                         f"memory tags: {m.get('tags', [])}\n")
            indices.append(i)
        return "".join(lines), indices

    def _hits(self, query: str, k: int) -> list[Any]:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        return list(self._store.search(query, k, namespace=self.namespace, lexical_weight=0.0))


class NoteView(Mapping):
    """``AgenticMemorySystem.memories``: a read-only mapping note id -> ``MemoryNote``, read
    from the store on each access (A-MEM keeps a dict; code that reads it keeps working)."""

    def __init__(self, system: AgenticMemorySystem) -> None:
        self.system = system

    def __getitem__(self, memory_id: str) -> MemoryNote:
        note = self.system.read(memory_id)
        if note is None:
            raise KeyError(memory_id)
        return note

    def __iter__(self) -> Iterator[str]:
        cursor = None
        while True:
            page = self.system.store.memories(namespace=self.system.namespace, limit=PAGE, cursor=cursor)
            yield from (m.key for m in page.items)
            cursor = page.next_cursor
            if cursor is None:
                return

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _is_id(memory_id: Any) -> bool:
    return isinstance(memory_id, str) and bool(memory_id)


def _note(m: Any) -> MemoryNote:
    meta = m.metadata or {}
    return MemoryNote(content=m.text, id=m.key, **{f: meta.get(f) for f in FIELDS})


def _agentic(key: str, text: str, meta: dict, neighbour: bool) -> dict[str, Any]:
    return {"id": key, "content": text, "context": meta.get("context", ""), "keywords": meta.get("keywords", []),
            "tags": meta.get("tags", []), "timestamp": meta.get("timestamp", ""),
            "category": meta.get("category", "Uncategorized"), "is_neighbor": neighbour}


__all__ = ["AgenticMemorySystem", "MemoryNote", "NoteView"]
