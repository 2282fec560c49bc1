"""LangChain ``VectorStore`` backed by a clag_fast ``MemoryStore`` (extra ``langchain``).

    from clag_fast.integrations.langchain import ClagVectorStore
    store = ClagVectorStore(embedding=my_embeddings, path="mem/")   # or embedding=None: MiniLM
    store.add_documents([Document("The user likes tea", metadata={"user": "u1"})], ids=["t1"])
    docs = store.similarity_search("what does the user drink?", k=3, filter={"user": "u1"})

Document ids are the store's keys (one namespace per collection), so adding a document whose
id exists replaces it. Within one batch a repeated id keeps the last document (both positions
return that id). Scores are cosine similarities of the ``Embeddings`` vectors; ``filter`` is
the store's ``where=`` grammar (``{"field": value}``, ``$eq``/``$ne``/``$gt``/``$gte``/``$lt``/
``$lte``/``$in``/``$nin``, ``$and``/``$or``) applied before top-k, or a callable on a
``Document`` (applied after, with over-fetching).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
try:  # name the extra to install rather than the missing module
    import langchain_core  # noqa: F401
except ImportError as e:
    raise ImportError(f"clag_fast.integrations.langchain needs langchain-core: pip install 'clag_fast[langchain]' ({e})") from e
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance
from pydantic import BaseModel

from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import StoreConfig
from clag_fast.integrations.storehandle import StoreHandle, query_vector
from clag_fast.store import MemoryStore

log = logging.getLogger(__name__)

DEFAULT_COLLECTION = "langchain"


class EmbeddingsEncoder:
    """A LangChain ``Embeddings`` seen as a clag_fast embedder (``encode`` + ``name``), so the
    store records which model wrote it and refuses to be reopened with another."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings
        self.name = f"langchain:{type(embeddings).__name__}"

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.embeddings.embed_documents(list(texts)), dtype=np.float32)


class MiniLMEmbeddings(Embeddings):
    """clag_fast's ONNX all-MiniLM-L6-v2 (384 dims) as a LangChain ``Embeddings``."""

    def __init__(self, embedder: Any = None) -> None:
        if embedder is None:
            from clag_fast.embed import Embedder

            embedder = Embedder()
        self.embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return np.asarray(self.embedder.encode(list(texts)), dtype=np.float32).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class ClagVectorStore(VectorStore):
    """A LangChain vector store on a clag_fast ``MemoryStore``.

    embedding: any LangChain ``Embeddings`` (any width), or None for clag_fast's MiniLM.
    store / path / config / slm: the store to use (see ``StoreHandle``): an open
      ``MemoryStore``, or a directory (None = a temporary one, removed at ``close()``), the
      ``StoreConfig`` for a new store and the SLM (False = vector-only organisation; ``llm`` is
      its deprecated spelling).
    collection_name: the store namespace holding this collection's documents.
    search_mode: "two_stage" (clusters, then their members; exact while the store is small)
      or "flat" (always exact).

    Async methods embed with the ``Embeddings``' async API and run the store call in the
    default executor (the native search releases the GIL).
    """

    @renamed_kwargs(llm="slm")
    def __init__(
        self,
        embedding: Embeddings | None = None,
        *,
        store: MemoryStore | None = None,
        path: str | Path | None = None,
        config: StoreConfig | None = None,
        slm: Any = False,
        collection_name: str = DEFAULT_COLLECTION,
        search_mode: str = "two_stage",
    ) -> None:
        if search_mode not in ("two_stage", "flat"):
            raise ValueError(f"search_mode must be 'two_stage' or 'flat', got {search_mode!r}")
        if not isinstance(collection_name, str) or not collection_name:
            raise ValueError(f"collection_name must be a non-empty string, got {collection_name!r}")
        self.embedding = embedding if embedding is not None else MiniLMEmbeddings()
        self.collection_name = collection_name
        self.search_mode = search_mode
        self._handle = StoreHandle(store, path=path, config=config,
                                   encoder=EmbeddingsEncoder(self.embedding), slm=slm)

    # -- plumbing ------------------------------------------------------------------------
    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    @property
    def store(self) -> MemoryStore | None:
        """The ``MemoryStore`` (None until the first document is added to a new store)."""
        return self._handle.store

    def close(self) -> None:
        """Close the store (when this object opened it) and remove a temporary directory."""
        self._handle.close()

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        # Cosine similarity in [-1, 1] mapped onto LangChain's [0, 1] relevance.
        return lambda score: (1.0 + score) / 2.0

    # -- writing -------------------------------------------------------------------------
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Embed and upsert ``texts``; returns their ids (generated where None)."""
        texts = list(texts)
        return self._write(texts, self.embedding.embed_documents(texts) if texts else [], metadatas, ids)

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        vectors = await self.embedding.aembed_documents(texts) if texts else []
        return await _in_thread(self._write, texts, vectors, metadatas, ids)

    def _write(self, texts: list[str], vectors: Any, metadatas: list[dict] | None,
               ids: Sequence[str | None] | None) -> list[str]:
        n = len(texts)
        if metadatas is not None and len(metadatas) != n:
            raise ValueError(f"metadatas has {len(metadatas)} items for {n} texts")
        if ids is not None and len(ids) != n:
            raise ValueError(f"ids has {len(ids)} items for {n} texts")
        keys = [i if i is not None else str(uuid.uuid4()) for i in (ids or [None] * n)]
        if n == 0:
            return []
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or len(vecs) != n:
            raise ValueError(f"the embeddings returned {vecs.shape} for {n} texts")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"document {i} (id {keys[i]!r}) has empty page_content: the store "
                                 "keeps a text per memory")
        store = self._handle.ensure(vecs.shape[1])
        metadata = [dict(m) if m else {} for m in (metadatas or [None] * n)]
        store.add_many(texts, embeddings=vecs, namespaces=self.collection_name, metadata=metadata, keys=keys)
        return keys

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Delete these ids (unknown ones ignored); ``ids=None`` empties the collection."""
        store = self._handle.store
        if store is None:
            return True
        if ids is None:
            store.delete_namespace(self.collection_name)
        elif ids:
            store.delete_many(keys=list(ids), namespace=self.collection_name)
        return True

    async def adelete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        return await _in_thread(self.delete, ids)

    # -- reading -------------------------------------------------------------------------
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in the order asked; missing ids are skipped."""
        store = self._handle.store
        if store is None or not ids:
            return []
        return [_document(m.key, m.text, m.metadata) for m in
                store.get_many(keys=list(ids), namespace=self.collection_name)]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return await _in_thread(self.get_by_ids, ids)

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    async def asimilarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Any = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` documents nearest ``query`` with their cosine similarities, best first."""
        if self._handle.store is None:
            return []
        return self._search(self.embedding.embed_query(query), k, filter)

    async def asimilarity_search_with_score(self, query: str, k: int = 4, filter: Any = None,
                                            **kwargs: Any) -> list[tuple[Document, float]]:
        if self._handle.store is None:
            return []
        vector = await self.embedding.aembed_query(query)
        return await _in_thread(self._search, vector, k, filter)

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                    **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter)]

    async def asimilarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                           **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in await _in_thread(self._search, embedding, k, filter)]

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4, filter: Any = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        return self._search(embedding, k, filter)

    def _search(self, vector: Any, k: int, filter: Any) -> list[tuple[Document, float]]:
        store = self._handle.store
        if store is None:
            return []
        q = query_vector(vector, store.config.dim)
        if filter is None or isinstance(filter, dict):
            hits = store.search(q, k, namespace=self.collection_name, where=filter or None, mode=self.search_mode)
            return [(_document(h.key, h.text, h.metadata), float(h.score)) for h in hits]
        if not callable(filter):
            raise TypeError(f"filter must be a dict (the store's where= grammar) or a callable, got {type(filter).__name__}")
        # A Python predicate cannot run inside the store: fetch more until k pass it or the
        # collection is exhausted.
        fetch = max(4 * k, 16)
        while True:
            hits = store.search(q, fetch, namespace=self.collection_name, mode=self.search_mode)
            out = [(doc, float(h.score)) for h in hits
                   if filter(doc := _document(h.key, h.text, h.metadata))]
            if len(out) >= k or len(hits) < fetch:
                return out[:k]
            fetch *= 4

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: Any = None, **kwargs: Any) -> list[Document]:
        if self._handle.store is None:
            return []
        return self.max_marginal_relevance_search_by_vector(self.embedding.embed_query(query), k, fetch_k,
                                                            lambda_mult, filter=filter)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: Any = None,
                                                **kwargs: Any) -> list[Document]:
        """MMR over the ``fetch_k`` nearest documents. The store does not hand out stored
        vectors, so the candidates are re-embedded with the ``Embeddings``."""
        candidates = self._search(embedding, fetch_k, filter)
        if not candidates:
            return []
        docs = [doc for doc, _ in candidates]
        vectors = np.asarray(self.embedding.embed_documents([d.page_content for d in docs]), dtype=np.float32)
        chosen = maximal_marginal_relevance(np.asarray(embedding, dtype=np.float32), vectors,
                                            lambda_mult=lambda_mult, k=k)
        return [docs[i] for i in chosen]

    async def amax_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                             lambda_mult: float = 0.5, **kwargs: Any) -> list[Document]:
        if self._handle.store is None:
            return []
        vector = await self.embedding.aembed_query(query)
        return await _in_thread(self.max_marginal_relevance_search_by_vector, vector, k, fetch_k, lambda_mult,
                                kwargs.get("filter"))

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> "ClagVectorStore":
        """A new store (keyword arguments as in the constructor) holding ``texts``."""
        vs = cls(embedding, **kwargs)
        vs.add_texts(texts, metadatas, ids=ids)
        return vs

    @classmethod
    async def afrom_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> "ClagVectorStore":
        vs = cls(embedding, **kwargs)
        await vs.aadd_texts(texts, metadatas, ids=ids)
        return vs


def _document(key: str | None, text: str, metadata: dict | None) -> Document:
    """A ``Document`` of a stored memory; its validation copies ``metadata`` into a new dict.

    Built by pydantic's validating ``BaseModel.__init__`` on a bare instance: the same
    validation as ``Document(...)``, without ``Document.__init__`` and ``Serializable.__init__``,
    which only forward their arguments (a third of a hit's conversion; benches/bench_adapters.py)."""
    doc = _new_document(Document)
    _init_model(doc, page_content=text, metadata=metadata or {}, id=key)
    return doc


_new_document = Document.__new__
_init_model = BaseModel.__init__


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


__all__ = ["ClagVectorStore", "EmbeddingsEncoder", "MiniLMEmbeddings"]
