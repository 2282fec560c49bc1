"""A question that asks for a date, a number or a name favours the memories that hold one."""

from __future__ import annotations

import pytest

from clag_fast import MemoryStore, RankingConfig, StoreConfig
from clag_fast.eval.runner import HashingEmbedder
from clag_fast.store import answer_kind
from clag_fast.store.answer_kind import DATE, NAME, NUMBER


@pytest.mark.parametrize("query, kind", [
    ("When does the user now leave Toronto for Japan?", DATE),
    ("what date and time are the tickets for?", DATE),
    ("Which year did she move?", DATE),
    ("How many tickets did they buy?", NUMBER),
    ("What is the total budget for the trip?", NUMBER),
    ("How long did the flight take?", NUMBER),
    ("Why were the dates changed?", 0),
    ("Where will they stay, and when?", NAME),  # asks for a place first
    ("Which hotel will they stay at in Kyoto?", NAME),
    ("What kind of restaurant is safest?", NAME),
    ("Who did she meet?", NAME),
    ("Whenever you like", 0),
])
def test_the_kind_a_question_asks_for(query, kind):
    assert answer_kind.asked(query) == kind


@pytest.mark.parametrize("text, kinds", [
    ("Could we leave April 10 instead?", DATE | NUMBER | NAME),
    ("We got 12:00.", DATE | NUMBER),
    ("We leave on Saturday.", DATE | NAME),
    ("Two weeks ago, on Mondays.", DATE | NUMBER | NAME),
    ("Three of them came.", NUMBER),
    ("Sounds lovely, thanks!", 0),
    ("Mayonnaise on the side, monthly dues aside.", 0),  # words that only start like one
    ("Booked: the Kamogawa Residence.", NAME),
    ("Yes. Sure! I think I'm in. I’ll go", 0),  # capitals that start sentences, and "I"
])
def test_the_kinds_a_text_holds(text, kinds):
    assert answer_kind.holds(text) == kinds


def test_the_speakers_names_are_no_answer():
    text = "Caroline: Hey Mel, good to see you."
    assert answer_kind.holds(text) == NAME
    assert answer_kind.holds(text, frozenset({"Mel"})) == 0


def open_store(path, **ranking):
    config = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=1000, ranking=RankingConfig(**ranking))
    return MemoryStore.open(path, config=config, embedder=HashingEmbedder(), slm=False)


TEXTS = ["We leave Toronto for Japan together, the whole family.",
         "We leave on Saturday, the flight is booked.",
         "We leave with 3 suitcases and a backpack.",
         "The garden needs water before we leave."]


def scores(store, query):
    return {h.text: h.score for h in store.search(query, k=len(TEXTS))}


@pytest.mark.parametrize("query, boosted", [
    ("When do we leave Toronto for Japan?", {TEXTS[1], TEXTS[2]}),
    ("How many bags do we leave with?", {TEXTS[2]}),
    ("Which city do we leave?", {TEXTS[0], TEXTS[1]}),
    ("Why do we leave?", set()),
])
def test_the_memories_that_hold_the_asked_kind_gain_the_boost(tmp_path, query, boosted):
    with open_store(tmp_path / "on", date_boost=0.3, number_boost=0.2, name_boost=0.25) as on, \
            open_store(tmp_path / "off", date_boost=0.0, number_boost=0.0, name_boost=0.0) as off:
        on.add_many(TEXTS, thread="t")
        off.add_many(TEXTS, thread="t")
        with_boost, without = scores(on, query), scores(off, query)
    boost = {DATE: 0.3, NUMBER: 0.2, NAME: 0.25, 0: 0.0}[answer_kind.asked(query)]
    for text in TEXTS:
        gained = boost if text in boosted else 0.0
        assert with_boost[text] - without[text] == pytest.approx(gained, abs=1e-5), text


def test_a_reopened_store_reads_the_kinds_off_its_texts(tmp_path):
    query = "When do we leave Toronto for Japan?"
    with open_store(tmp_path / "s") as s:
        s.add_many(TEXTS, thread="t")
        before = scores(s, query)
    with open_store(tmp_path / "s") as s:
        assert scores(s, query) == pytest.approx(before)
        # Read off the texts by the first search after the open (none were known).
        holds = s._state.rows.holds[: len(TEXTS)].tolist()
        assert holds == [NAME, DATE | NAME, DATE | NUMBER, 0]


def test_the_answer_pool_bounds_the_boost(tmp_path):
    with open_store(tmp_path / "one", answer_pool=1) as s:
        s.add_many(TEXTS, thread="t")
        got = scores(s, "When do we leave Toronto for Japan?")
    with open_store(tmp_path / "off", date_boost=0.0) as s:
        s.add_many(TEXTS, thread="t")
        plain = scores(s, "When do we leave Toronto for Japan?")
    best = max(plain, key=plain.get)
    # Only the best candidate could gain; it holds no date, so nothing changes.
    assert best == TEXTS[0] and got == pytest.approx(plain)


def test_bad_boosts_name_the_field():
    for field, value in (("date_boost", -0.1), ("number_boost", float("nan")), ("name_boost", -1.0),
                         ("answer_pool", -1), ("answer_pool", 2.5)):
        with pytest.raises(ValueError, match=field):
            RankingConfig(**{field: value})
    plain = RankingConfig.plain()
    assert plain.date_boost == plain.number_boost == plain.name_boost == 0.0


def test_a_store_does_not_count_its_speakers_as_names(tmp_path):
    texts = ["Caroline: Hey Mel, how was the trip?", "Mel: Lovely, we saw Kyoto.", "Caroline: Nice, glad to hear."]
    with open_store(tmp_path / "s") as s:
        s.add_many(texts, thread="t", speakers=["Caroline", "Mel", "Caroline"])
        s.search("Which city did Mel see?", k=3)
        assert s._state.rows.holds[:3].tolist() == [0, NAME, 0]
