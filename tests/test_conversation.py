"""Conversation structure: threads, turns, speakers and updates, as a user of MemoryStore
sees them (``add_many(thread=, turns=, speakers=, supersedes=)``, ``search(as_of=, context=)``)."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest

from clag_fast import MemoryStore, RankingConfig, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store.catalog import SCHEMA_VERSION


def open_store(path, **cfg):
    config = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=1000, **cfg)
    return MemoryStore.open(path, config=config, embedder=HashingEmbedder(), slm=False)


def context_ids(hit):
    return [(t.offset, t.memory_id) for t in hit.context]


FILLER = [f"Filler remark number {i} about gardening, weather and {w}." for i, w in
          enumerate(["tulips", "rain", "soil", "compost", "sunlight", "roses", "frost", "seeds"])]


def test_neighbours_follow_threads_and_turns(tmp_path):
    with open_store(tmp_path / "s") as s:
        a = s.add_many(["a one", "a two", "a three"], thread="A")
        b = s.add_many(["b one", "b two"], thread="B")
        # Turns given out of order: the thread follows the turns, not the insertion order.
        c = s.add_many(["c third", "c first", "c second"], thread="C", turns=[3, 1, 2])
        hits = s.search("a two", k=1, context=1)
        assert hits[0].memory_id == a[1]
        assert context_ids(hits[0]) == [(-1, a[0]), (1, a[2])]
        hits = s.search("b one", k=1, context=2)
        assert context_ids(hits[0]) == [(1, b[1])]  # threads do not run into each other
        hits = s.search("c first", k=1, context=1)
        assert hits[0].memory_id == c[1]
        assert context_ids(hits[0]) == [(1, c[2])]
        assert context_ids(s.search("c third", k=1, context=2)[0]) == [(-2, c[1]), (-1, c[2])]
        # A turn arriving later but placed in the middle of its thread.
        mid = s.add("c between", thread="C", turn=1.5)
        assert context_ids(s.search("c first", k=1, context=1)[0]) == [(1, mid)]
        assert s.get(mid).thread == "C" and s.get(mid).turn == 1.5


def test_memories_without_a_thread_follow_their_namespace_in_insertion_order(tmp_path):
    with open_store(tmp_path / "s") as s:
        x = s.add("x first", namespace="n1")
        s.add("other namespace", namespace="n2")
        y = s.add("y second", namespace="n1")
        hit = s.search("x first", k=1, namespace="n1", context=1)[0]
        assert context_ids(hit) == [(1, y)]
        assert s.get(x).thread is None


def test_links_survive_deletes_updates_upserts_and_reopening(tmp_path):
    path = tmp_path / "s"
    with open_store(path) as s:
        ids = s.add_many([f"turn {i} of the talk" for i in range(5)], thread="t",
                         keys=[None, None, "k2", None, None])
        s.delete(ids[1])
        s.update(ids[3], text="turn 3 of the talk, corrected")
        s.add("turn 2 of the talk, replaced", key="k2", thread="t")  # an upsert keeps its place
        hit = s.search("turn 2 of the talk, replaced", k=1, context=1)[0]
        assert hit.memory_id == ids[2]
        assert context_ids(hit) == [(-1, ids[0]), (1, ids[3])]
        before = context_ids(s.search("turn 3 of the talk, corrected", k=1, context=2)[0])
        assert before == [(-2, ids[0]), (-1, ids[2]), (1, ids[4])]
    with open_store(path) as s:
        assert context_ids(s.search("turn 3 of the talk, corrected", k=1, context=2)[0]) == before


def test_the_answer_after_a_matching_question_ranks_with_it(tmp_path):
    """The query matches the turn that asks; the turn that answers shares none of its words."""
    with open_store(tmp_path / "s") as s:
        s.add_many(FILLER[:4], thread="t")
        s.add_many(["What total budget do we have for the whole trip?",
                    "We agreed on nine thousand Canadian dollars, flights included."],
                   thread="t", speakers=["Agent", "User"])
        s.add_many(FILLER[4:], thread="t")
        answer = "We agreed on nine thousand Canadian dollars, flights included."
        hits = s.search("What is the total budget for the trip?", k=3)
        assert answer in [h.text for h in hits]
    with open_store(tmp_path / "plain", ranking=RankingConfig.plain()) as s:
        s.add_many(FILLER[:4] + ["What total budget do we have for the whole trip?", answer] + FILLER[4:], thread="t")
        assert answer not in [h.text for h in s.search("What is the total budget for the trip?", k=3)]


def test_a_query_naming_a_speaker_favours_their_memories(tmp_path):
    with open_store(tmp_path / "s") as s:
        s.add_many(FILLER, thread="t")
        ids = s.add_many(["I adopted a puppy from the shelter last week.",
                          "I adopted a puppy from the shelter last week."],
                         threads=["t1", "t2"], speakers=["Audrey", "Andrew"])
        assert s.search("What did Andrew adopt?", k=1)[0].memory_id == ids[1]
        assert s.search("What did Audrey adopt?", k=1)[0].memory_id == ids[0]
        assert s.get(ids[1]).speaker == "Andrew"


def test_a_newer_memory_ranks_first_and_the_older_says_it_was_superseded(tmp_path):
    with open_store(tmp_path / "s") as s:
        s.add_many(FILLER)
        old = s.add("The flight to Tokyo leaves on April 3.")
        t_between = time.time()
        time.sleep(0.01)
        new = s.add("Moved: the flight leaves on April 10.", supersedes=old)
        hits = s.search("When does the flight to Tokyo leave?", k=3)
        ids = [h.memory_id for h in hits]
        assert ids.index(new) < ids.index(old)
        assert hits[ids.index(old)].superseded_by == new
        assert hits[ids.index(new)].superseded_by is None
        assert s.get(old).superseded_by == new
        # As of before the update: the old fact stands, the newer memory did not exist yet.
        then = s.search("When does the flight to Tokyo leave?", k=3, as_of=t_between)
        assert old in [h.memory_id for h in then] and new not in [h.memory_id for h in then]
        assert all(h.superseded_by is None for h in then)
        # A vector query sees the update too.
        vec = HashingEmbedder().encode(["The flight to Tokyo leaves on April 3."])[0]
        by_vector = s.search(vec, k=len(s))
        assert {h.memory_id: h.superseded_by for h in by_vector}[old] == new
    with open_store(tmp_path / "s") as s:  # kept across a reopen
        assert s.get(old).superseded_by == new
        hits = s.search("When does the flight to Tokyo leave?", k=3)
        assert [h.memory_id for h in hits].index(new) < [h.memory_id for h in hits].index(old)


@pytest.mark.parametrize("kwargs, error, names", [
    ({"thread": 7}, TypeError, "thread"),
    ({"thread": " "}, ValueError, "thread"),
    ({"thread": "a", "threads": ["a", "b"]}, ValueError, "thread"),
    ({"threads": ["a"]}, ValueError, "threads"),
    ({"threads": ["a", "b\x00"]}, ValueError, "threads[1]"),
    ({"turns": [1, float("nan")]}, ValueError, "turns[1]"),
    ({"turns": [1, "2"]}, TypeError, "turns[1]"),
    ({"turns": [True, 2]}, TypeError, "turns[0]"),
    ({"turns": 3}, TypeError, "turns"),
    ({"speakers": ["Ann", 5]}, TypeError, "speakers[1]"),
    ({"speaker": "x" * 600}, ValueError, "speaker"),
    ({"supersedes": [None, 10_000]}, KeyError, "supersedes[1]"),
    ({"supersedes": [None, "1"]}, TypeError, "supersedes[1]"),
])
def test_bad_conversation_arguments_name_the_field_and_write_nothing(tmp_path, kwargs, error, names):
    with open_store(tmp_path / "s") as s:
        s.add("kept memory")
        with pytest.raises(error, match=names.replace("[", r"\[").replace("]", r"\]")):
            s.add_many(["one", "two"], **kwargs)
        assert len(s) == 1
        assert [m.text for m in s.memories().items] == ["kept memory"]


def test_supersedes_stays_in_its_namespace(tmp_path):
    with open_store(tmp_path / "s") as s:
        other = s.add("a fact in another namespace", namespace="b")
        with pytest.raises(ValueError, match=r"supersedes\[0\].*namespace"):
            s.add("an update", namespace="a", supersedes=other)
        assert len(s) == 1


@pytest.mark.parametrize("kwargs, names", [
    ({"as_of": "yesterday"}, "as_of"),
    ({"as_of": float("nan")}, "as_of"),
    ({"as_of": -5.0}, "as_of"),
    ({"context": -1}, "context"),
    ({"context": 1000}, "context"),
    ({"context": True}, "context"),
])
def test_bad_search_arguments_name_the_field(tmp_path, kwargs, names):
    with open_store(tmp_path / "s") as s:
        s.add("something")
        with pytest.raises(ValueError, match=names):
            s.search("something", **kwargs)
        with pytest.raises(ValueError, match=names):
            s.search_many(["something"], **kwargs)


def test_a_store_of_the_previous_schema_gains_the_structure_on_open(tmp_path):
    path = tmp_path / "old"
    with open_store(path) as s:
        ids = s.add_many(["first old memory", "second old memory", "third old memory"])
    con = sqlite3.connect(path / "memories.db")
    for column in ("thread", "turn", "speaker", "superseded_by"):
        con.execute(f"ALTER TABLE memories DROP COLUMN {column}")
    con.execute("PRAGMA user_version=4")
    con.commit()
    con.close()
    with pytest.raises(Exception, match="migration"):
        MemoryStore.open(path, embedder=HashingEmbedder(), slm=False, read_only=True)
    with open_store(path) as s:
        hit = s.search("second old memory", k=1, context=1)[0]
        assert hit.memory_id == ids[1]
        assert context_ids(hit) == [(-1, ids[0]), (1, ids[2])]  # the namespace's own thread
        new = s.add("fourth memory, an update", thread="t", speaker="Ann", supersedes=ids[2])
        assert s.get(ids[2]).superseded_by == new
    con = sqlite3.connect(path / "memories.db")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_ranking_config_checks_its_values():
    with pytest.raises(ValueError, match="question_weight"):
        RankingConfig(question_weight=1.5)
    with pytest.raises(ValueError, match="neighbour_weights"):
        RankingConfig(neighbour_weights=(0.3, -1))
    with pytest.raises(ValueError, match="expand"):
        RankingConfig(expand=-1)
    assert RankingConfig.plain().expand == 0
    with pytest.raises(ValueError, match="ranking"):
        StoreConfig(ranking="plain")


def test_hits_are_the_same_with_every_context_size(tmp_path):
    """context only adds turns to the hits: their ids and order do not change."""
    rng = np.random.default_rng(3)
    with open_store(tmp_path / "s") as s:
        words = ["apple", "river", "stone", "cloud", "lamp", "forest", "violin", "harbor"]
        texts = [" ".join(rng.choice(words, 5)) + f" {i}" for i in range(60)]
        s.add_many(texts, threads=[f"t{i // 7}" for i in range(60)])
        for q in ("apple river", "violin harbor lamp", "stone"):
            base = [h.memory_id for h in s.search(q, k=5)]
            for n in (1, 2, 3):
                assert [h.memory_id for h in s.search(q, k=5, context=n)] == base
