"""A reflection that matches a query lifts the earlier turns it restates."""

from __future__ import annotations

import json

import pytest

from clag_fast import MemoryStore, RankingConfig, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.locomo import REFLECTION_SPEAKER, Turn, load_dataset, parse_samples

SOURCE = "User: my sister finally chose the blue bicycle at the corner shop"
REFLECTION = "[reflection] birthday gift decided: sister chose the blue bicycle at the corner shop"
# A conversation: the source, small talk, the reflection at the end; a second thread whose
# turns share the query's words and nothing with the source.
THREAD = [SOURCE, "Agent: lovely", "User: the weather is cold today", "Agent: bring a coat then",
          "User: yes tomorrow too", "Agent: sounds good", REFLECTION]
OTHERS = ["User: a cake for her party", "Agent: a gift card works for anyone",
          "User: the party is on friday", "Agent: cards are a classic",
          "User: wrap it nicely", "Agent: a birthday song then"]
QUERY = "what birthday gift was decided"


def open_store(path, **ranking):
    config = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=1000, ranking=RankingConfig(**ranking))
    return MemoryStore.open(path, config=config, embedder=HashingEmbedder(), slm=False)


def fill(store, thread=THREAD):
    kinds = ["reflection" if t.startswith("[reflection]") else "dialogue" for t in thread]
    ids = store.add_many(thread, kinds=kinds, thread="trip")
    store.add_many(OTHERS, thread="party")
    return ids


def ranked(store, k=5):
    return [h.text for h in store.search(QUERY, k=k)]


def test_a_reflection_lifts_the_turn_it_restates(tmp_path):
    with open_store(tmp_path / "on") as on, open_store(tmp_path / "off", reflection_share=0.0) as off:
        fill(on)
        fill(off)
        with_rule, without = ranked(on), ranked(off)
    assert with_rule[0] == REFLECTION and without[0] == REFLECTION
    # The source shares no word with the query: without the rule nothing brings it up.
    assert SOURCE not in without
    assert SOURCE in with_rule


def test_the_lift_is_the_share_of_the_reflections_score(tmp_path):
    with open_store(tmp_path / "s", reflection_share=0.25) as s:
        fill(s)
        hits = {h.text: h.score for h in s.search(QUERY, k=len(THREAD) + len(OTHERS))}
    with open_store(tmp_path / "off", reflection_share=0.0, expand=len(THREAD) + len(OTHERS)) as s:
        fill(s)
        base = {h.text: h.score for h in s.search(QUERY, k=len(THREAD) + len(OTHERS))}
    assert hits[SOURCE] - base[SOURCE] == pytest.approx(0.25 * hits[REFLECTION], abs=1e-5)


def test_only_the_kind_named_restates(tmp_path):
    with open_store(tmp_path / "s", reflection_kind="summary") as s:
        fill(s)  # its reflections are of kind "reflection", not "summary"
        assert SOURCE not in ranked(s)


def test_a_source_beyond_the_window_is_not_lifted(tmp_path):
    with open_store(tmp_path / "s", reflection_window=len(THREAD) - 2) as s:
        fill(s)
        assert SOURCE not in ranked(s)


def test_a_reflection_restates_no_other_reflection(tmp_path):
    older = "[reflection] sister chose the blue bicycle at the corner shop"
    thread = [older] + THREAD[1:]
    with open_store(tmp_path / "s", reflection_sources=1) as s:
        fill(s, thread)
        got = {h.text: h.score for h in s.search(QUERY, k=len(thread) + len(OTHERS))}
    with open_store(tmp_path / "off", reflection_share=0.0) as s:
        fill(s, thread)
        base = {h.text: h.score for h in s.search(QUERY, k=len(thread) + len(OTHERS))}
    # The older reflection is the turn most like the newer one, yet gains nothing; the one
    # source taken is a dialogue turn.
    assert got[older] == pytest.approx(base[older])
    assert sum(got[t] > base[t] + 1e-6 for t in thread) == 1


def test_sources_follow_deletions_and_turns_given_later(tmp_path):
    with open_store(tmp_path / "s", reflection_sources=1) as s:
        ids = fill(s)
        assert SOURCE in ranked(s)
        s.delete(ids[0])
        assert SOURCE not in ranked(s)
        # A turn given a place before the reflection: its sources are found again.
        closer = "User: sister chose the blue bicycle at the corner shop for the birthday"
        s.add(closer, thread="trip", turn=0.5)
        assert closer in ranked(s, k=len(THREAD) + len(OTHERS))
        hits = {h.text: h.score for h in s.search(QUERY, k=len(THREAD) + len(OTHERS))}
    with open_store(tmp_path / "off", reflection_share=0.0) as s:
        ids = fill(s)
        s.delete(ids[0])
        s.add(closer, thread="trip", turn=0.5)
        base = {h.text: h.score for h in s.search(QUERY, k=len(THREAD) + len(OTHERS))}
    assert hits[closer] > base[closer]


def test_a_reopened_store_finds_the_sources_again(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s)
        before = ranked(s)
    with open_store(tmp_path / "s") as s:
        assert ranked(s) == before


@pytest.mark.parametrize("field, value", [
    ("reflection_share", -0.1), ("reflection_share", float("nan")), ("reflection_sources", 0),
    ("reflection_window", 0), ("reflection_window", 2.5), ("reflection_pool", -1), ("reflection_kind", ""),
])
def test_bad_reflection_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RankingConfig(**{field: value})


def test_plain_ranking_passes_nothing():
    assert RankingConfig.plain().reflection_share == 0.0


def test_a_turns_kind_comes_from_its_text():
    def kind(text):
        return Turn("D1:1", "Agent", text, 1, "").kind
    assert kind("[tool: booking] ok") == "tool_result"
    assert kind("[reflection] noted") == "reflection"
    assert kind("Sure, sounds good") == "dialogue"


def _sample(observation):
    return {"sample_id": "s", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bo",
        "session_1_date_time": "1 May", "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I got a bike."},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Nice!"}],
        "session_2_date_time": "2 May", "session_2": [
            {"speaker": "Ann", "dia_id": "D2:1", "text": "It is blue."}]},
        "observation": observation,
        "qa": [{"question": "What did Ann get?", "answer": "a bike", "evidence": ["D1:1"], "category": 1}]}


def test_observations_become_reflections_after_their_session():
    obs = {"session_1_observation": {"Ann": [["Ann got a bike.", "D1:1"]], "Bo": [["Bo likes it.", "D1:2"]]},
           "session_2_observation": {"Ann": [["Ann's bike is blue.", "D2:1"]]}}
    (plain,) = parse_samples([_sample(obs)])
    (s,) = parse_samples([_sample(obs)], reflections=True)
    assert [t.dia_id for t in plain.turns] == ["D1:1", "D1:2", "D2:1"]
    assert [t.dia_id for t in s.turns] == ["D1:1", "D1:2", "R1:1", "R1:2", "D2:1", "R2:1"]
    refl = [t for t in s.turns if t.dia_id.startswith("R")]
    assert {t.kind for t in refl} == {"reflection"} and {t.speaker for t in refl} == {REFLECTION_SPEAKER}
    assert refl[0].text == "[reflection] Ann got a bike." and refl[2].session == 2
    # No evidence id names a reflection.
    assert s.resolve_evidence(s.qa[0]) == {"D1:1"}


def test_a_dataset_without_observations_has_no_reflections(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([_sample(None)]))
    (s,) = load_dataset(p, reflections=True)
    assert [t.dia_id for t in s.turns] == ["D1:1", "D1:2", "D2:1"]


def test_bad_observations_name_the_field(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([_sample(["not", "an", "object"])]))
    with pytest.raises(ValueError, match="observation"):
        load_dataset(p, reflections=True)
    assert len(load_dataset(p)[0].turns) == 3  # read only when asked for
