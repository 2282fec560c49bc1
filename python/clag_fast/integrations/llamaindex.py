"""LlamaIndex vector store backed by a clag_fast ``MemoryStore`` (extra ``llamaindex``).

    from clag_fast.integrations.llamaindex import ClagVectorStore, MiniLMEmbedding
    vector_store = ClagVectorStore(path="mem/")
    ctx = StorageContext.from_defaults(vector_store=vector_store)
    index = VectorStoreIndex.from_documents(docs, storage_context=ctx, embed_model=MiniLMEmbedding())
    nodes = index.as_retriever(similarity_top_k=3).retrieve("what does the user drink?")

Each node is one memory: its key is the node id (adding a node id again replaces it), its
text the node's text, its metadata the node's metadata plus ``ref_doc_id`` / ``doc_id`` /
``document_id`` (as LlamaIndex's other stores write them) and the rest of the node (``__li_*``
fields; its relationships, templates, ...). Vectors are the nodes' own embeddings, any width.
``MetadataFilters`` run inside the store before top-k: ``==``, ``!=``, ``>``, ``>=``, ``<``,
``<=``, ``in``, ``nin`` under ``and``/``or``; other operators raise ValueError.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
try:  # name the extra to install rather than the missing module
    import llama_index.core  # noqa: F401
except ImportError as e:
    raise ImportError(f"clag_fast.integrations.llamaindex needs llama-index-core: pip install 'clag_fast[llamaindex]' ({e})") from e
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import BaseModel, PrivateAttr
from llama_index.core.schema import BaseNode, ImageNode, IndexNode, Node, TextNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)

from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import StoreConfig
from clag_fast.integrations.storehandle import StoreHandle, query_vector
from clag_fast.store import MemoryStore

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "llamaindex"
NODE_ID_FIELD = "__li_node_id"
NODE_FIELD = "__li_node"  # the node's other fields (a dict), read back without another JSON parse
TYPE_FIELD = "__li_type"
_NODE_TYPES = {cls.class_name(): cls for cls in (TextNode, IndexNode, ImageNode, Node)}
PAGE = 1000
_OPERATORS = {
    FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt", FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte", FilterOperator.IN: "$in", FilterOperator.NIN: "$nin",
}


class ClagVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store on a clag_fast ``MemoryStore``.

    store / path / config / slm: the ``MemoryStore`` (see ``StoreHandle``): an open store, or
      a directory (None = a temporary one, removed at ``close()``), the ``StoreConfig`` for a
      new store and the SLM (False = vector-only organisation; ``llm`` is its deprecated
      spelling).
    namespace: the store namespace holding the nodes.
    search_mode: "two_stage" or "flat" (exact).
    """

    stores_text: bool = True
    namespace: str = DEFAULT_NAMESPACE
    search_mode: str = "two_stage"
    _handle: StoreHandle = PrivateAttr()

    @renamed_kwargs(llm="slm")
    def __init__(self, *, store: MemoryStore | None = None, path: str | Path | None = None,
                 config: StoreConfig | None = None, slm: Any = False, namespace: str = DEFAULT_NAMESPACE,
                 search_mode: str = "two_stage") -> None:
        if search_mode not in ("two_stage", "flat"):
            raise ValueError(f"search_mode must be 'two_stage' or 'flat', got {search_mode!r}")
        super().__init__(namespace=namespace, search_mode=search_mode)
        self._handle = StoreHandle(store, path=path, config=config, slm=slm)

    @classmethod
    def class_name(cls) -> str:
        return "ClagVectorStore"

    @property
    def client(self) -> MemoryStore | None:
        """The ``MemoryStore`` (None until the first node is added to a new store)."""
        return self._handle.store

    def close(self) -> None:
        """Close the store (when this object opened it) and remove a temporary directory."""
        self._handle.close()

    # -- writing -------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Upsert nodes (they must carry embeddings); returns their ids. A node id repeated
        within the call keeps the last node."""
        nodes = list(nodes)
        if not nodes:
            return []
        vectors = []
        for i, node in enumerate(nodes):
            if node.embedding is None:
                raise ValueError(f"node {i} ({node.node_id}) has no embedding: embed nodes before adding them")
            vectors.append(node.embedding)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim != 2:
            raise ValueError("node embeddings have different widths")
        texts = [node.get_content() for node in nodes]
        for i, t in enumerate(texts):
            if not t or not t.strip():
                raise ValueError(f"node {i} ({nodes[i].node_id}) has no text: the store keeps a text per memory")
        metadata = [_node_metadata(node) for node in nodes]
        keys = [node.node_id for node in nodes]
        store = self._handle.ensure(vecs.shape[1])
        store.add_many(texts, embeddings=vecs, namespaces=self.namespace, metadata=metadata, keys=keys)
        return keys

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the source document ``ref_doc_id``."""
        self._delete_where({"ref_doc_id": ref_doc_id})

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete these nodes (unknown ids ignored), or those matching ``filters``, or both
        conditions together."""
        if node_ids is None and filters is None:
            return
        self._delete_where(_and(_ids_where(node_ids), filters_to_where(filters)))

    def clear(self) -> None:
        """Delete every node of this store's namespace."""
        store = self._handle.store
        if store is not None:
            store.delete_namespace(self.namespace)

    def _delete_where(self, where: dict | None) -> None:
        store = self._handle.store
        if store is None:
            return
        keys = [m.key for m in self._listing(where)]
        if keys:
            store.delete_many(keys=keys, namespace=self.namespace)

    # -- reading -------------------------------------------------------------------------
    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None) -> list[BaseNode]:
        """Nodes by id (in the order asked, missing ones skipped) and/or by filters."""
        store = self._handle.store
        if store is None:
            return []
        if node_ids is not None and filters is None:
            return [_node(m) for m in store.get_many(keys=list(node_ids), namespace=self.namespace)]
        return [_node(m) for m in self._listing(_and(_ids_where(node_ids), filters_to_where(filters)))]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The ``similarity_top_k`` nodes nearest ``query.query_embedding`` that pass its
        filters (``filters``, and ``doc_ids`` / ``node_ids`` when not empty), with cosine
        similarities."""
        if query.mode != VectorStoreQueryMode.DEFAULT:
            raise ValueError(f"query mode {query.mode.value!r} is not supported (only 'default')")
        store = self._handle.store
        if store is None:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        if query.query_embedding is None:
            raise ValueError("the query has no query_embedding")
        # Empty id lists mean "no restriction" (VectorIndexRetriever passes node_ids=[]), as in
        # SimpleVectorStore.
        where = _and(filters_to_where(query.filters), _ids_where(query.node_ids or None),
                     {"ref_doc_id": {"$in": list(query.doc_ids)}} if query.doc_ids else None)
        hits = store.search(query_vector(query.query_embedding, store.config.dim), query.similarity_top_k,
                            namespace=self.namespace, where=where, mode=self.search_mode)
        nodes = [_node(h) for h in hits]
        return VectorStoreQueryResult(nodes=nodes, similarities=[float(h.score) for h in hits],
                                      ids=[h.key for h in hits])

    def _listing(self, where: dict | None) -> list[Any]:
        store = self._handle.store
        out: list[Any] = []
        cursor = None
        while True:
            page = store.memories(namespace=self.namespace, where=where, limit=PAGE, cursor=cursor)
            out += page.items
            cursor = page.next_cursor
            if cursor is None:
                return out


class MiniLMEmbedding(BaseEmbedding):
    """clag_fast's ONNX all-MiniLM-L6-v2 (384 dims) as a LlamaIndex embedding model."""

    _embedder: Any = PrivateAttr()

    def __init__(self, embedder: Any = None, **kwargs: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", **kwargs)
        if embedder is None:
            from clag_fast.embed import Embedder

            embedder = Embedder()
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "ClagMiniLMEmbedding"

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return np.asarray(self._embedder.encode(list(texts)), dtype=np.float32).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


# -- filters ---------------------------------------------------------------------------
def filters_to_where(filters: MetadataFilters | None) -> dict | None:
    """LlamaIndex ``MetadataFilters`` as the store's ``where=`` filter (ValueError naming an
    operator or condition the store cannot apply)."""
    if filters is None or not filters.filters:
        return None
    parts = []
    for f in filters.filters:
        if isinstance(f, MetadataFilters):
            sub = filters_to_where(f)
            if sub is not None:
                parts.append(sub)
            continue
        parts.append(_filter_to_where(f))
    condition = filters.condition or FilterCondition.AND
    if condition == FilterCondition.AND:
        return parts[0] if len(parts) == 1 else {"$and": parts}
    if condition == FilterCondition.OR:
        return parts[0] if len(parts) == 1 else {"$or": parts}
    raise ValueError(f"filter condition {getattr(condition, 'value', condition)!r} is not supported "
                     "(supported: 'and', 'or')")


def _filter_to_where(f: MetadataFilter) -> dict:
    op = _OPERATORS.get(f.operator)
    if op is None:
        raise ValueError(f"filter operator {f.operator.value!r} on {f.key!r} is not supported "
                         f"(supported: {', '.join(o.value for o in _OPERATORS)})")
    value = list(f.value) if isinstance(f.value, (list, tuple)) else f.value
    if op in ("$in", "$nin") and not isinstance(value, list):
        value = [value]
    return {f.key: {op: value}}


def _ids_where(node_ids: list[str] | None) -> dict | None:
    return None if node_ids is None else {NODE_ID_FIELD: {"$in": list(node_ids)}}


def _and(*conds: dict | None) -> dict | None:
    parts = [c for c in conds if c is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else {"$and": parts}


def _node_metadata(node: BaseNode) -> dict:
    # Only the fields that differ from their defaults: a smaller JSON body for the store to
    # decode per hit, and fewer fields to validate when the node is rebuilt (same node back).
    # The memory holds text and vector: excluded here, not serialised and dropped (a 384-float
    # embedding was most of a node's serialisation cost).
    body = node.model_dump(mode="json", exclude_defaults=True, exclude=_NOT_IN_BODY)
    body.pop("class_name", None)  # added by LlamaIndex's serializer whatever is excluded
    meta = dict(node.metadata)
    ref = node.ref_doc_id or "None"
    meta.update({"ref_doc_id": ref, "doc_id": ref, "document_id": ref, NODE_ID_FIELD: node.node_id,
                 NODE_FIELD: body, TYPE_FIELD: node.class_name()})
    return meta


def _node(m: Any) -> BaseNode:
    meta = m.metadata or {}
    cls = _NODE_TYPES.get(meta.get(TYPE_FIELD), TextNode)
    body = dict(meta[NODE_FIELD])
    if cls in _PLAIN_INIT:
        # Validated as ``TextNode(**body)`` validates, by pydantic's ``BaseModel.__init__`` on a
        # bare instance: ``TextNode.__init__`` only renames a ``text_resource`` argument (there
        # is none here), and calling it runs validation twice. Half a hit's conversion cost.
        body["text"] = m.text
        node = cls.__new__(cls)
        _init_model(node, **body)
        return node
    # A node rebuilt from its fields (pydantic validation of a dict) costs about half of
    # LlamaIndex's metadata_dict_to_node, which parses a JSON string inside the metadata.
    node = cls.model_validate(body)
    node.set_content(m.text)
    return node


# Node classes built without their __init__: TextNode's (llama-index-core 0.14) and IndexNode,
# which inherits it. ImageNode has an __init__ of its own and goes through model_validate.
_NOT_IN_BODY = {"embedding", "text", "text_resource"}
_PLAIN_INIT = {TextNode} | ({IndexNode} if IndexNode.__init__ is TextNode.__init__ else set())
_init_model = BaseModel.__init__


__all__ = ["ClagVectorStore", "MiniLMEmbedding", "filters_to_where"]
