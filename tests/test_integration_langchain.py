"""clag_fast behind LangChain's VectorStore interface: the standard suite from langchain-tests
(sync and async, nothing skipped), a retrieval loop written for InMemoryVectorStore with the
store swapped in, MiniLM by default, and bad input."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("langchain_core")
langchain_tests = pytest.importorskip("langchain_tests.integration_tests")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_core.language_models import FakeListLLM  # noqa: E402
from langchain_core.prompts import PromptTemplate  # noqa: E402
from langchain_core.runnables import RunnableLambda, RunnablePassthrough  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402

from clag_fast.integrations.langchain import ClagVectorStore  # noqa: E402

VectorStoreIntegrationTests = langchain_tests.VectorStoreIntegrationTests


class TestStandardSuite(VectorStoreIntegrationTests):
    """LangChain's own integration tests, run against ClagVectorStore."""

    # The suite's async tests carry no marker (LangChain runs pytest-asyncio in auto mode) and
    # the suite forbids overriding its tests: mark the class; its sync tests ignore the mark.
    pytestmark = [pytest.mark.asyncio, pytest.mark.filterwarnings(
        "ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async function")]

    @pytest.fixture()
    def vectorstore(self, tmp_path):
        store = ClagVectorStore(embedding=self.get_embeddings(), path=tmp_path / "lc")
        try:
            yield store
        finally:
            store.close()



def test_the_suite_runs_every_test_sync_and_async():
    async_tests = [n for n, f in inspect.getmembers(TestStandardSuite, inspect.iscoroutinefunction)
                   if n.startswith("test_")]
    assert len(async_tests) >= 10
    suite = TestStandardSuite()
    assert suite.has_sync and suite.has_async and suite.has_get_by_ids


# -- an agent loop written for LangChain's InMemoryVectorStore, store swapped -----------------
NOTES = [
    ("The user's name is Dana", {"topic": "profile", "turn": 1}),
    ("Dana is allergic to peanuts", {"topic": "health", "turn": 2}),
    ("Dana prefers window seats on flights", {"topic": "travel", "turn": 3}),
    ("Dana's flight to Lisbon leaves on Friday", {"topic": "travel", "turn": 4}),
    ("Dana takes her coffee black", {"topic": "food", "turn": 5}),
]
QUESTIONS = ["Dana is allergic to peanuts", "Dana's flight to Lisbon leaves on Friday", "coffee"]


def agent_loop(vectorstore) -> list[tuple[str, list[str]]]:
    """Remember each note, then answer questions with retrieved context (a LangChain RAG chain
    with a fake LLM; what is checked is what the retriever hands the prompt)."""
    seen: list[tuple[str, list[str]]] = []
    for i, (text, meta) in enumerate(NOTES):
        vectorstore.add_documents([Document(page_content=text, metadata=meta)], ids=[f"note-{i}"])
    retriever = vectorstore.as_retriever(search_kwargs={"k": 2})
    # InMemoryVectorStore filters with a predicate on the Document.
    travel = vectorstore.as_retriever(search_kwargs={"k": 2, "filter": lambda d: d.metadata["topic"] == "travel"})
    prompt = PromptTemplate.from_template("Context: {context}\nQuestion: {question}")
    llm = FakeListLLM(responses=["ok"] * 10)

    def record(docs):
        seen.append(("ctx", [d.id for d in docs]))
        return "\n".join(d.page_content for d in docs)

    chain = {"context": retriever | RunnableLambda(record), "question": RunnablePassthrough()} | prompt | llm
    for q in QUESTIONS:
        assert chain.invoke(q) == "ok"
    seen.append(("travel", [d.id for d in travel.invoke("flight")]))
    vectorstore.delete(["note-1"])
    seen.append(("after-delete", [d.id for d in retriever.invoke("Dana is allergic to peanuts")]))
    return seen


def test_agent_loop_gives_the_same_context_as_inmemoryvectorstore(tmp_path):
    emb = DeterministicFakeEmbedding(size=32)
    expected = agent_loop(InMemoryVectorStore(emb))
    store = ClagVectorStore(emb, path=tmp_path / "s")
    try:
        got = agent_loop(store)
    finally:
        store.close()
    assert got == expected
    assert expected[0] == ("ctx", ["note-1", expected[0][1][1]])  # the exact note ranks first
    assert all(i in ("note-2", "note-3") for i in expected[3][1])  # the filter kept travel notes only


def test_minilm_default_finds_the_related_note(tmp_path):
    store = ClagVectorStore(path=tmp_path / "m")  # embedding=None: clag_fast's MiniLM
    try:
        store.add_texts([t for t, _ in NOTES], [m for _, m in NOTES], ids=[f"n{i}" for i in range(len(NOTES))])
        assert store.store.config.dim == 384
        top = store.similarity_search_with_score("Which food could harm Dana?", k=1)
        assert top[0][0].id == "n1" and 0 < top[0][1] <= 1
        mmr = store.max_marginal_relevance_search("travel plans", k=2, fetch_k=5)
        assert {d.id for d in mmr} <= {f"n{i}" for i in range(5)} and len(mmr) == 2
    finally:
        store.close()


def test_reopening_the_directory_keeps_the_documents(tmp_path):
    emb = DeterministicFakeEmbedding(size=16)
    a = ClagVectorStore.from_texts(["alpha", "beta"], emb, ids=["a", "b"], path=tmp_path / "p")
    a.close()
    b = ClagVectorStore(emb, path=tmp_path / "p")
    try:
        assert [d.page_content for d in b.get_by_ids(["b", "a"])] == ["beta", "alpha"]
        assert b.similarity_search("alpha", k=1)[0].id == "a"
    finally:
        b.close()


# -- bad input ---------------------------------------------------------------------------
@pytest.fixture()
def small(tmp_path):
    store = ClagVectorStore(DeterministicFakeEmbedding(size=8), path=tmp_path / "b")
    yield store
    store.close()


def test_duplicate_ids_in_one_batch_keep_the_last(small):
    ids = small.add_texts(["first", "second"], [{"v": 1}, {"v": 2}], ids=["x", "x"])
    assert ids == ["x", "x"]
    docs = small.get_by_ids(["x"])
    assert docs == [Document(page_content="second", metadata={"v": 2}, id="x")]
    assert len(small.similarity_search("second", k=10)) == 1


@pytest.mark.parametrize("bad", ["", "k" * 513, "a\x00b"])
def test_bad_ids_are_refused_and_nothing_is_written(small, bad):
    small.add_texts(["kept"], ids=["ok"])
    with pytest.raises(ValueError):
        small.add_texts(["one", "two"], ids=["fine", bad])
    assert [d.id for d in small.similarity_search("one", k=10)] == ["ok"]


def test_filters_on_missing_fields_match_nothing_and_unknown_operators_raise(small):
    small.add_texts(["a", "b"], [{"n": 1}, {"n": 2}], ids=["a", "b"])
    assert small.similarity_search("a", k=5, filter={"absent": "x"}) == []
    assert [d.id for d in small.similarity_search("a", k=5, filter={"n": {"$gt": 1}})] == ["b"]
    assert [d.id for d in small.similarity_search("a", k=5, filter=lambda d: d.metadata["n"] == 1)] == ["a"]
    with pytest.raises(ValueError, match=r"\$regex"):
        small.similarity_search("a", k=5, filter={"n": {"$regex": "1"}})


def test_mixing_dimensions_is_refused_and_nothing_is_written(small):
    small.add_texts(["eight dims"], ids=["e"])
    other = ClagVectorStore(DeterministicFakeEmbedding(size=12), store=small.store)
    with pytest.raises(ValueError, match="12"):
        other.add_texts(["twelve dims"], ids=["t"])
    with pytest.raises(ValueError, match="shape"):
        small.similarity_search_by_vector(list(np.ones(12)), k=1)
    assert small.get_by_ids(["t"]) == [] and len(small.get_by_ids(["e"])) == 1


def test_empty_page_content_is_refused(small):
    with pytest.raises(ValueError, match="empty page_content"):
        small.add_documents([Document(page_content="  ")])


def test_first_writes_from_several_threads_open_one_store(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    store = ClagVectorStore(DeterministicFakeEmbedding(size=8), path=tmp_path / "t")
    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: store.add_texts([f"text {i}"], ids=[f"t{i}"]), range(8)))
        assert sorted(d.id for d in store.get_by_ids([f"t{i}" for i in range(8)])) == [f"t{i}" for i in range(8)]
    finally:
        store.close()
    with pytest.raises(ValueError, match="closed"):
        store.add_texts(["after close"])


def test_a_missing_framework_names_the_extra(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "langchain_core", None)
    monkeypatch.delitem(sys.modules, "clag_fast.integrations.langchain")
    with pytest.raises(ImportError, match=r"clag_fast\[langchain\]"):
        importlib.import_module("clag_fast.integrations.langchain")
