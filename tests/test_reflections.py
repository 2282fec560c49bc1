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


@pytest.mark.parametrize("window, lifted", [(len(THREAD) - 1, True), (len(THREAD) - 2, False)])
def test_the_window_counts_the_turns_before_the_reflection(tmp_path, window, lifted):
    with open_store(tmp_path / "s", reflection_window=window) as s:
        fill(s)
        assert (SOURCE in ranked(s)) == lifted


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


ALL = len(THREAD) + len(OTHERS) + 1


def lifted(on, off):
    """The texts that score higher with the rule than without it."""
    with_rule = {h.text: h.score for h in on.search(QUERY, k=ALL)}
    without = {h.text: h.score for h in off.search(QUERY, k=ALL)}
    return {t for t in with_rule if t in without and with_rule[t] > without[t] + 1e-6}


def test_sources_follow_deletions_updates_and_turns_given_later(tmp_path):
    closer = "User: sister chose the blue bicycle at the corner shop for the birthday"
    with open_store(tmp_path / "on", reflection_sources=1) as on, \
            open_store(tmp_path / "off", reflection_share=0.0) as off:
        ids = [fill(on), fill(off)]
        assert lifted(on, off) == {SOURCE}
        # The source gone, the next most similar turn is the source.
        for s, i in zip((on, off), ids):
            s.delete(i[0])
        second = lifted(on, off)
        assert len(second) == 1 and SOURCE not in second
        # A turn given a place before the reflection that restates it better takes over.
        for s in (on, off):
            s.add(closer, thread="trip", turn=0.5)
        assert lifted(on, off) == {closer}
        # A new text is a new row: the old one's place is taken by the new one.
        renamed = "User: my sister chose the blue bicycle, the corner shop had it, for the birthday"
        for s in (on, off):
            (mid,) = [h.memory_id for h in s.search(QUERY, k=ALL) if h.text == closer]
            s.update(mid, text=renamed)
        assert lifted(on, off) == {renamed}


def test_a_filter_takes_the_best_source_it_leaves(tmp_path):
    with open_store(tmp_path / "on", reflection_sources=1) as on, \
            open_store(tmp_path / "off", reflection_share=0.0) as off:
        for s in (on, off):
            kinds = ["note" if t == SOURCE else "reflection" if t.startswith("[reflection]") else "dialogue"
                     for t in THREAD]
            s.add_many(THREAD, kinds=kinds, thread="trip")
        # Without a filter the best source is the "note"; a kind filter leaves it out, and
        # the reflection with it: nothing is lifted then.
        assert lifted(on, off) == {SOURCE}
        got = {h.text: h.score for h in on.search(QUERY, k=ALL, kind="dialogue")}
        base = {h.text: h.score for h in off.search(QUERY, k=ALL, kind="dialogue")}
        assert got == pytest.approx(base)
        # A where= filter on the source's memory leaves the reflection and the next source.
        for s in (on, off):
            (mid,) = [h.memory_id for h in s.search(QUERY, k=ALL) if h.text == SOURCE]
            s.update(mid, metadata={"hidden": True})
        def scores(s, **kw):
            return {h.text: h.score for h in s.search(QUERY, k=ALL, **kw)}
        with_rule, without = scores(on, where={"hidden": {"$ne": True}}), scores(off, where={"hidden": {"$ne": True}})
        assert SOURCE not in with_rule
        up = {t for t in with_rule if with_rule[t] > without[t] + 1e-6}
        assert len(up) == 1 and up <= set(THREAD)


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


@pytest.mark.parametrize("observation", [["not", "an", "object"], {"session_1_observation": ["x"]},
                                         {"session_1_observation": {"Ann": "not a list"}}])
def test_bad_observations_name_the_field(tmp_path, observation):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([_sample(observation)]))
    with pytest.raises(ValueError, match="observation"):
        load_dataset(p, reflections=True)
    assert len(load_dataset(p)[0].turns) == 3  # read only when asked for
