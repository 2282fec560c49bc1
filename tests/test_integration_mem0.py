"""clag_fast.compat.mem0.Memory: mem0's interface and result shapes, a chat loop written as in
mem0's README with Memory swapped in, scoped deletes, paging, history, bad input."""

from __future__ import annotations

import pytest
from adapter_helpers import HashEncoder

from clag_fast.compat.mem0 import Memory


@pytest.fixture()
def m(tmp_path):
    memory = Memory(path=tmp_path / "m0", embedder=HashEncoder())
    yield memory
    memory.close()


def chat_with_memories(memory, message: str, user_id: str) -> tuple[str, list[str]]:
    """mem0's README loop: retrieve, answer (a canned reply stands in for the LLM), remember."""
    relevant = memory.search(query=message, user_id=user_id, limit=3)
    recalled = [entry["memory"] for entry in relevant["results"]]
    answer = f"noted ({len(recalled)} memories)"
    memory.add([{"role": "user", "content": message}, {"role": "assistant", "content": answer}], user_id=user_id)
    return answer, recalled


def test_readme_chat_loop_with_minilm(tmp_path):
    memory = Memory(path=tmp_path / "chat")  # clag_fast's MiniLM
    try:
        chat_with_memories(memory, "I am allergic to peanuts", "alice")
        chat_with_memories(memory, "My flight to Lisbon leaves on Friday", "alice")
        chat_with_memories(memory, "I love peanut butter sandwiches", "bob")
        _, recalled = chat_with_memories(memory, "Which foods should I avoid?", "alice")
        assert recalled[0] == "I am allergic to peanuts"
        assert "I love peanut butter sandwiches" not in recalled  # bob's memory stays bob's
        everything = memory.get_all(user_id="alice", limit=100)["results"]
        assert {e["role"] for e in everything} == {"user", "assistant"} and len(everything) == 6
    finally:
        memory.close()


def test_result_shapes(m):
    added = m.add("I like green tea", user_id="u1", agent_id="a1", metadata={"source": "chat"}, infer=False)
    [entry] = added["results"]
    assert set(entry) == {"id", "memory", "event", "actor_id", "role"} and entry["event"] == "ADD"
    item = m.get(entry["id"])
    assert item["memory"] == "I like green tea" and item["user_id"] == "u1" and item["agent_id"] == "a1"
    assert item["metadata"] == {"source": "chat"} and item["role"] == "user" and item["score"] is None
    assert {"id", "memory", "hash", "metadata", "created_at", "updated_at"} <= set(item)
    hit = m.search("I like green tea", filters={"user_id": "u1"}, top_k=5)["results"][0]
    assert hit["id"] == entry["id"] and isinstance(hit["score"], float)
    assert "score" not in m.get_all(filters={"user_id": "u1"})["results"][0]
    assert m.get("no-such-id") is None


def test_filters_scope_and_metadata(m):
    for i in range(6):
        m.add(f"note {i}", user_id="u1" if i < 4 else "u2", metadata={"n": i, "kind": "even" if i % 2 == 0 else "odd"},
              infer=False)
    texts = lambda r: sorted(e["memory"] for e in r["results"])  # noqa: E731
    assert texts(m.search("note", user_id="u1", filters={"kind": "even"})) == ["note 0", "note 2"]
    assert texts(m.search("note", user_id="u1", filters={"n": {"gte": 2}})) == ["note 2", "note 3"]
    assert texts(m.search("note", filters={"user_id": "u2", "OR": [{"n": 4}, {"n": {"in": [5]}}]})) == \
        ["note 4", "note 5"]
    assert m.search("note", user_id="u1", filters={"absent": "x"})["results"] == []


def test_get_all_pages(m):
    m.add([{"role": "user", "content": f"fact {i}"} for i in range(7)], user_id="u1", infer=False)
    first = m.get_all(user_id="u1", limit=3)
    second = m.get_all(user_id="u1", limit=3, cursor=first["next_cursor"])
    third = m.get_all(user_id="u1", limit=3, cursor=second["next_cursor"])
    got = [e["memory"] for page in (first, second, third) for e in page["results"]]
    assert got == [f"fact {i}" for i in range(7)] and third["next_cursor"] is None


def test_history_of_a_memory_never_updated_and_of_one_stored_with_its_add_event(m):
    mid = m.add("I like tea", user_id="u1", infer=False)["results"][0]["id"]
    first, again = m.history(mid), m.history(mid)
    assert [(h["event"], h["old_memory"], h["new_memory"], h["memory_id"]) for h in first] == \
        [("ADD", None, "I like tea", mid)]
    assert first == again and first[0]["created_at"] == m.get(mid)["created_at"]
    # A memory whose metadata holds its ADD event (as adds once wrote it) is not given a second.
    from clag_fast.compat import mem0 as mem0_mod

    event = {"id": "e1", "memory_id": "old1", "old_memory": None, "new_memory": "I like coffee", "event": "ADD",
             "created_at": "2026-01-01T00:00:00+00:00", "updated_at": "2026-01-01T00:00:00+00:00", "is_deleted": 0}
    m.store.add("I like coffee", key="old1", namespace=m.namespace,
                metadata={"user_id": "u1", "hash": "h", "created_at": event["created_at"],
                          "updated_at": event["created_at"], mem0_mod.HISTORY_FIELD: [event]})
    assert m.history("old1") == [event]


def test_update_history_delete(m):
    mid = m.add("I live in Berlin", user_id="u1", metadata={"k": 1}, infer=False)["results"][0]["id"]
    before = m.get(mid)
    assert m.update(mid, text="I live in Porto", metadata={"k": 2}) == {"message": "Memory updated successfully!"}
    after = m.get(mid)
    assert after["memory"] == "I live in Porto" and after["metadata"] == {"k": 2} and after["user_id"] == "u1"
    assert after["created_at"] == before["created_at"] and after["hash"] != before["hash"]
    assert [(h["event"], h["old_memory"], h["new_memory"]) for h in m.history(mid)] == \
        [("ADD", None, "I live in Berlin"), ("UPDATE", "I live in Berlin", "I live in Porto")]
    assert m.delete(mid) == {"message": "Memory deleted successfully!"}
    assert m.get(mid) is None and m.history(mid) == []
    with pytest.raises(ValueError, match="not found"):
        m.delete(mid)
    with pytest.raises(ValueError, match="not found"):
        m.update(mid, text="x")


def test_delete_all_is_never_wider_than_asked(m):
    m.add("a", user_id="u1", agent_id="a1", infer=False)
    m.add("b", user_id="u1", agent_id="a2", infer=False)
    m.add("c", user_id="u2", agent_id="a1", infer=False)
    with pytest.raises(ValueError, match="At least one filter"):
        m.delete_all()
    m.delete_all(user_id="u1", agent_id="a1")
    assert [e["memory"] for e in m.get_all(user_id="u1")["results"]] == ["b"]
    assert [e["memory"] for e in m.get_all(agent_id="a1")["results"]] == ["c"]
    m.delete_all(agent_id="a2")
    assert m.get_all(user_id="u1")["results"] == [] and len(m.get_all(user_id="u2")["results"]) == 1
    m.reset()
    assert m.get_all(user_id="u2")["results"] == []


def test_infer_skips_exact_repeats_in_the_same_scope(m):
    first = m.add("I like green tea", user_id="u1")["results"]
    again = m.add("I like green tea", user_id="u1")["results"]
    other = m.add("I like green tea", user_id="u2")["results"]
    assert first[0]["event"] == "ADD" and again[0]["event"] == "NONE" and other[0]["event"] == "ADD"
    assert len(m.get_all(user_id="u1")["results"]) == 1


def test_bad_input(m):
    with pytest.raises(ValueError, match="user_id"):
        m.add("no scope")
    with pytest.raises(ValueError, match="user_id"):
        m.search("no scope")
    with pytest.raises(ValueError, match="different values"):
        m.search("q", user_id="u1", filters={"user_id": "u2"})
    with pytest.raises(ValueError, match="regex"):
        m.search("q", user_id="u1", filters={"k": {"regex": "x"}})
    with pytest.raises(ValueError, match="NOT"):
        m.search("q", user_id="u1", filters={"NOT": [{"k": 1}]})
    with pytest.raises(ValueError, match="reserved"):
        m.add("x", user_id="u1", metadata={"hash": "forged"})
    assert m.get_all(user_id="u1")["results"] == []
