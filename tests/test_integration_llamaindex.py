"""clag_fast behind LlamaIndex's vector store interface: real TextNode objects, a retrieval loop
written for LlamaIndex's SimpleVectorStore with the store swapped in, MetadataFilters, delete by
ref_doc_id, get_nodes, MiniLM, bad input."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
from llama_index.core import StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.schema import IndexNode, NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores import SimpleVectorStore  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from clag_fast.integrations.llamaindex import ClagVectorStore, MiniLMEmbedding  # noqa: E402

DIMS = 12


class HashEmbedding(BaseEmbedding):
    """A fixed random vector per text (seeded by its hash): deterministic and offline."""

    def _vec(self, text: str) -> list[float]:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(DIMS).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)


NOTES = [
    ("n0", "doc-a", "Dana is allergic to peanuts", {"topic": "health", "turn": 1}),
    ("n1", "doc-a", "Dana prefers window seats", {"topic": "travel", "turn": 2}),
    ("n2", "doc-b", "Dana's flight to Lisbon leaves on Friday", {"topic": "travel", "turn": 3}),
    ("n3", "doc-b", "Dana takes her coffee black", {"topic": "food", "turn": 4}),
    ("n4", "doc-c", "Dana's sister is called Mia", {"topic": "family", "turn": 5}),
]


def nodes(embed: BaseEmbedding | None = None) -> list[TextNode]:
    out = []
    for node_id, doc, text, meta in NOTES:
        # Metadata stays out of the embedded text, so a question equal to a note matches it.
        node = TextNode(text=text, id_=node_id, metadata=dict(meta), excluded_embed_metadata_keys=list(meta),
                        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=doc)})
        if embed is not None:
            node.embedding = embed.get_text_embedding(text)
        out.append(node)
    return out


def retrieval_loop(vector_store) -> list:
    """Index nodes, retrieve for a few questions, with a filter, after deleting a document."""
    embed = HashEmbedding()
    ctx = StorageContext.from_defaults(vector_store=vector_store)
    index = VectorStoreIndex(nodes(), storage_context=ctx, embed_model=embed)
    seen, scores = [], []
    for q in ["Dana is allergic to peanuts", "Dana takes her coffee black", "sister"]:
        found = index.as_retriever(similarity_top_k=2).retrieve(q)
        seen.append([(n.node.node_id, n.node.get_content()) for n in found])
        scores += [n.score for n in found]
    travel = MetadataFilters(filters=[MetadataFilter(key="topic", value="travel")])
    seen.append([n.node.node_id for n in index.as_retriever(similarity_top_k=3, filters=travel).retrieve("trip")])
    late = MetadataFilters(filters=[MetadataFilter(key="turn", value=3, operator=FilterOperator.GTE),
                                    MetadataFilter(key="topic", value="food")], condition=FilterCondition.OR)
    seen.append(sorted(n.node.node_id for n in index.as_retriever(similarity_top_k=5, filters=late).retrieve("x")))
    index.delete_ref_doc("doc-a")
    seen.append([n.node.node_id for n in index.as_retriever(similarity_top_k=5).retrieve("Dana is allergic to peanuts")])
    return seen, scores


def test_retrieval_loop_gives_the_same_nodes_as_simplevectorstore(tmp_path):
    want, want_scores = retrieval_loop(SimpleVectorStore())
    store = ClagVectorStore(path=tmp_path / "li")
    try:
        got, got_scores = retrieval_loop(store)
    finally:
        store.close()
    assert got == want
    assert np.allclose(got_scores, want_scores, atol=1e-5)
    assert want[0][0][0] == "n0" and want_scores[0] == pytest.approx(1.0)
    assert set(want[3]) == {"n1", "n2"}
    assert want[4] == ["n2", "n3", "n4"]
    assert set(want[5]) == {"n2", "n3", "n4"}


@pytest.fixture()
def li(tmp_path):
    store = ClagVectorStore(path=tmp_path / "q")
    store.add(nodes(HashEmbedding()))
    yield store
    store.close()


def test_query_get_nodes_and_delete(li):
    embed = HashEmbedding()
    q = VectorStoreQuery(query_embedding=embed.get_query_embedding("Dana's sister is called Mia"), similarity_top_k=2)
    result = li.query(q)
    assert result.ids[0] == "n4" and result.similarities[0] == pytest.approx(1.0, abs=1e-5)
    assert isinstance(result.nodes[0], TextNode) and result.nodes[0].metadata == {"topic": "family", "turn": 5}
    assert result.nodes[0].ref_doc_id == "doc-c"
    got = li.get_nodes(node_ids=["n3", "n0", "missing"])
    assert [n.node_id for n in got] == ["n3", "n0"] and got[0].get_content() == "Dana takes her coffee black"
    health = MetadataFilters(filters=[MetadataFilter(key="topic", value=["health", "food"], operator=FilterOperator.IN)])
    assert sorted(n.node_id for n in li.get_nodes(filters=health)) == ["n0", "n3"]
    li.delete("doc-b")
    assert sorted(n.node_id for n in li.get_nodes(filters=MetadataFilters(filters=[
        MetadataFilter(key="turn", value=0, operator=FilterOperator.GT)]))) == ["n0", "n1", "n4"]
    li.delete_nodes(node_ids=["n1"])
    assert [n.node_id for n in li.get_nodes(node_ids=["n0", "n1"])] == ["n0"]
    li.clear()
    assert li.get_nodes(node_ids=["n0", "n4"]) == []


def odd_nodes() -> list:
    """Nodes whose fields are not all defaults: relationships of each kind, templates,
    excluded keys, character offsets, an IndexNode."""
    a = TextNode(text="Dana's bag is blue", id_="x0", metadata={"topic": "travel", "tags": ["bag"]},
                 excluded_llm_metadata_keys=["tags"], metadata_separator=" | ", text_template="T: {content}",
                 start_char_idx=3, end_char_idx=21,
                 relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="doc-x", metadata={"p": 1}),
                                NodeRelationship.NEXT: RelatedNodeInfo(node_id="x1"),
                                NodeRelationship.CHILD: [RelatedNodeInfo(node_id="c1"), RelatedNodeInfo(node_id="c2")]})
    b = TextNode(text="Dana naps after lunch", id_="x1")
    c = IndexNode(text="summary of Dana's week", id_="x2", index_id="week-index", metadata={"topic": "summary"})
    embed = HashEmbedding()
    for n in (a, b, c):
        n.embedding = embed.get_text_embedding(n.get_content())
    return [a, b, c]


def test_nodes_come_back_equal_to_the_nodes_added(tmp_path):
    store = ClagVectorStore(path=tmp_path / "rt")
    try:
        added = odd_nodes()
        store.add(added)
        want = {n.node_id: n.model_dump(exclude={"embedding"}) for n in added}
        got = store.get_nodes(node_ids=list(want))
        assert [type(n) for n in got] == [TextNode, TextNode, IndexNode]
        assert {n.node_id: n.model_dump(exclude={"embedding"}) for n in got} == want
        assert [n.hash for n in got] == [n.hash for n in added]
        for n in added:
            result = store.query(VectorStoreQuery(query_embedding=n.embedding, similarity_top_k=1))
            assert result.ids == [n.node_id]
            assert result.nodes[0].model_dump(exclude={"embedding"}) == want[n.node_id]
            assert result.nodes[0].get_content(metadata_mode="llm") == n.get_content(metadata_mode="llm")
    finally:
        store.close()


def test_nodes_stored_with_every_field_read_back(tmp_path):
    """Stores written before nodes were stored without their default fields read back the same."""
    from clag_fast.integrations import llamaindex as li_mod

    store = ClagVectorStore(path=tmp_path / "old")
    try:
        node = odd_nodes()[0]
        store.add([node])
        body = node.model_dump(mode="json")
        body.pop("class_name")
        body.update(embedding=None, text="")
        meta = dict(node.metadata, ref_doc_id="doc-x", doc_id="doc-x", document_id="doc-x",
                    **{li_mod.NODE_ID_FIELD: node.node_id, li_mod.NODE_FIELD: body, li_mod.TYPE_FIELD: "TextNode"})
        store.client.add(node.get_content(), key=node.node_id, namespace=store.namespace, metadata=meta,
                         embedding=np.asarray(node.embedding, np.float32))
        [got] = store.get_nodes(node_ids=[node.node_id])
        assert got.model_dump(exclude={"embedding"}) == node.model_dump(exclude={"embedding"})
    finally:
        store.close()


def test_readding_a_node_id_replaces_it(li):
    node = TextNode(text="Dana moved to Porto", id_="n0", metadata={"topic": "home", "turn": 9},
                    embedding=HashEmbedding().get_text_embedding("Dana moved to Porto"))
    li.add([node])
    [got] = li.get_nodes(node_ids=["n0"])
    assert got.get_content() == "Dana moved to Porto" and got.metadata["topic"] == "home"
    assert len(li.get_nodes(filters=MetadataFilters(filters=[MetadataFilter(key="turn", value=0,
                                                                            operator=FilterOperator.GT)]))) == 5


def test_minilm_embedding(tmp_path):
    store = ClagVectorStore(path=tmp_path / "m")
    try:
        index = VectorStoreIndex(nodes(), storage_context=StorageContext.from_defaults(vector_store=store),
                                 embed_model=MiniLMEmbedding())
        top = index.as_retriever(similarity_top_k=1).retrieve("Which food could harm Dana?")
        assert top[0].node.node_id == "n0"
        assert store.client.config.dim == 384
    finally:
        store.close()


# -- bad input ---------------------------------------------------------------------------
def test_unsupported_operators_and_missing_fields(li):
    q = VectorStoreQuery(query_embedding=HashEmbedding().get_query_embedding("x"), similarity_top_k=3)
    q.filters = MetadataFilters(filters=[MetadataFilter(key="absent", value="x")])
    assert li.query(q).ids == []
    q.filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="trav", operator=FilterOperator.TEXT_MATCH)])
    with pytest.raises(ValueError, match="text_match"):
        li.query(q)
    q.filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")], condition=FilterCondition.NOT)
    with pytest.raises(ValueError, match="not"):
        li.query(q)


def test_nodes_without_embeddings_or_of_another_width_are_refused(li):
    with pytest.raises(ValueError, match="no embedding"):
        li.add([TextNode(text="plain", id_="p")])
    with pytest.raises(ValueError, match="width"):
        li.add([TextNode(text="wide", id_="w", embedding=[0.1] * (DIMS + 4))])
    assert li.get_nodes(node_ids=["p", "w"]) == []


def test_duplicate_node_ids_in_one_call_keep_the_last(tmp_path):
    store = ClagVectorStore(path=tmp_path / "d")
    try:
        e = HashEmbedding()
        store.add([TextNode(text="one", id_="x", embedding=e.get_text_embedding("one")),
                   TextNode(text="two", id_="x", embedding=e.get_text_embedding("two"))])
        assert [n.get_content() for n in store.get_nodes(node_ids=["x"])] == ["two"]
    finally:
        store.close()


def test_a_missing_framework_names_the_extra(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "llama_index.core", None)
    monkeypatch.delitem(sys.modules, "clag_fast.integrations.llamaindex")
    with pytest.raises(ImportError, match=r"clag_fast\[llamaindex\]"):
        importlib.import_module("clag_fast.integrations.llamaindex")
