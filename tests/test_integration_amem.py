"""clag_fast.compat.amem.AgenticMemorySystem: A-MEM's interface and result shapes, the usage
from A-MEM's README with the system swapped in, links as neighbours, bad input."""

from __future__ import annotations

import pytest
from adapter_helpers import HashEncoder

from clag_fast.compat.amem import AgenticMemorySystem, MemoryNote


@pytest.fixture()
def mem(tmp_path):
    system = AgenticMemorySystem(path=tmp_path / "am", embedder=HashEncoder())
    yield system
    system.close()


def test_readme_usage_with_minilm(tmp_path):
    memory_system = AgenticMemorySystem(model_name="all-MiniLM-L6-v2", llm_backend="openai",
                                        llm_model="gpt-4o-mini", path=tmp_path / "readme")
    try:
        memory_system.add_note("Deep learning neural networks")
        memory_system.add_note("The bakery on Main Street sells rye bread")
        memory_id = memory_system.add_note(content="Machine learning project notes", tags=["ml", "project"],
                                           category="Research", timestamp="202503021500")
        memory = memory_system.read(memory_id)
        assert (memory.content, memory.tags, memory.category, memory.timestamp) == \
            ("Machine learning project notes", ["ml", "project"], "Research", "202503021500")
        related = memory_system.search_agentic("neural networks", k=2)
        assert related[0]["content"] == "Deep learning neural networks"
        assert "rye" not in " ".join(r["content"] for r in related)
        assert memory_system.update(memory_id, content="Updated content about deep learning")
        assert memory_system.read(memory_id).content == "Updated content about deep learning"
        assert memory_system.delete(memory_id) and memory_system.read(memory_id) is None
    finally:
        memory_system.close()


def test_result_shapes_and_scores(mem):
    ids = [mem.add_note(t, keywords=[t.split()[0]], context="ctx") for t in ["alpha note", "beta note", "gamma"]]
    results = mem.search("alpha note", k=2)
    assert [set(r) for r in results] == [{"id", "content", "context", "keywords", "score"}] * 2
    assert results[0]["id"] == ids[0] and results[0]["keywords"] == ["alpha"] and results[0]["context"] == "ctx"
    assert results[0]["score"] <= results[1]["score"]  # distances: lower is closer
    agentic = mem.search_agentic("alpha note", k=1)
    assert set(agentic[0]) == {"id", "content", "context", "keywords", "tags", "timestamp", "category",
                               "is_neighbor", "score"} and agentic[0]["is_neighbor"] is False
    text, indices = mem.find_related_memories("alpha note", k=2)
    assert indices == [0, 1] and "memory content: alpha note" in text
    note = mem.read(ids[1])
    assert isinstance(note, MemoryNote) and note.retrieval_count == 0 and note.category == "Uncategorized"


def test_links_follow_a_mems_neighbour_rule(mem):
    # As in A-MEM: the found notes' links are appended as neighbours, then the list is cut to
    # k, so a linked note shows up once, as a hit when the search found it.
    far = mem.add_note("the tide tables for the harbour")
    near = mem.add_note("sailing lessons on Saturday", links=[far])
    found = mem.search_agentic("sailing lessons on Saturday", k=5)
    assert [r["id"] for r in found] == [near, far] and not any(r["is_neighbor"] for r in found)
    assert mem.read(near).links == [far]
    assert [r["id"] for r in mem.search_agentic("sailing lessons on Saturday", k=1)] == [near]


def test_memories_mapping_update_delete(mem):
    a = mem.add_note("first")
    b = mem.add_note("second", id="fixed-id")
    assert b == "fixed-id" and set(mem.memories) == {a, b} and len(mem.memories) == 2
    assert mem.memories[b].content == "second" and b in mem.memories and "nope" not in mem.memories
    assert mem.update(b, tags=["x"], not_a_field=1) and mem.read(b).tags == ["x"]
    assert mem.update("nope", content="x") is False
    assert mem.delete(a) and not mem.delete(a) and list(mem.memories) == [b]


def test_bad_input(mem, tmp_path):
    with pytest.raises(ValueError, match="model_name"):
        AgenticMemorySystem(model_name="text-embedding-3-small", path=tmp_path / "x")
    with pytest.raises(ValueError, match="query"):
        mem.search("  ")
    with pytest.raises(ValueError, match="k must"):
        mem.search("q", k=0)
    with pytest.raises(ValueError):
        mem.add_note("bad id", id="k" * 600)
    assert mem.read("") is None and not mem.delete("") and len(mem.memories) == 0
