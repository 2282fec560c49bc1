"""A turn that says something new ranks above one that repeats the turns just before it."""

from __future__ import annotations

import numpy as np
import pytest

from clag_fast import MemoryStore, RankingConfig, StoreConfig
from clag_fast.eval.runner import HashingEmbedder

THREAD = ["User: the museum opens at nine on sundays",
          "Agent: the museum opens at nine on sundays, when it opens",  # an echo of the turn before
          "User: and the garden cafe closes at five",
          "Agent: noted, the cafe closes at five, the museum at six"]
QUERY = "when does the museum open on sundays"


def open_store(path, **ranking):
    config = StoreConfig(slm="off", cache_size=0, min_memories_to_cluster=1000, ranking=RankingConfig(**ranking))
    return MemoryStore.open(path, config=config, embedder=HashingEmbedder(), slm=False)


def scores(store, query=QUERY):
    return {h.text: h.score for h in store.search(query, k=len(THREAD))}


def expected_novelty(texts, turns):
    v = HashingEmbedder().encode(texts)
    out = []
    for i in range(len(texts)):
        before = [float(v[i] @ v[j]) for j in range(max(0, i - turns), i)]
        out.append(1.0 - max([0.0] + before))
    return out


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_the_bonus_is_one_less_the_highest_cosine_with_the_turns_before(tmp_path, turns):
    with open_store(tmp_path / "on", novelty_bonus=0.3, novelty_turns=turns) as on, \
            open_store(tmp_path / "off", novelty_bonus=0.0) as off:
        on.add_many(THREAD, thread="t")
        off.add_many(THREAD, thread="t")
        got, base = scores(on), scores(off)
    for text, novelty in zip(THREAD, expected_novelty(THREAD, turns)):
        assert got[text] - base[text] == pytest.approx(0.3 * novelty, abs=1e-5), text


def test_an_echo_ranks_below_the_turn_it_repeats(tmp_path):
    with open_store(tmp_path / "on") as on, open_store(tmp_path / "off", novelty_bonus=0.0) as off:
        on.add_many(THREAD, thread="t")
        off.add_many(THREAD, thread="t")
        got, base = scores(on), scores(off)
    # The echo holds every word of the query and more: without the bonus it is first.
    assert base[THREAD[1]] > base[THREAD[0]]
    assert got[THREAD[0]] > got[THREAD[1]]


def test_turns_of_other_threads_are_no_repetition(tmp_path):
    with open_store(tmp_path / "s", novelty_bonus=0.3) as on, open_store(tmp_path / "o", novelty_bonus=0.0) as off:
        for s in (on, off):
            s.add_many(THREAD[:1], thread="a")
            s.add_many(THREAD[1:2], thread="b")  # the echo, alone in its thread
        got, base = scores(on), scores(off)
    assert got[THREAD[1]] - base[THREAD[1]] == pytest.approx(0.3, abs=1e-5)


def test_vector_search_is_unchanged(tmp_path):
    q = HashingEmbedder().encode([QUERY])[0]
    with open_store(tmp_path / "on") as on, open_store(tmp_path / "off", novelty_bonus=0.0) as off:
        on.add_many(THREAD, thread="t")
        off.add_many(THREAD, thread="t")
        a = [(h.text, round(h.score, 6)) for h in on.search(np.asarray(q), k=4)]
        b = [(h.text, round(h.score, 6)) for h in off.search(np.asarray(q), k=4)]
    assert a == b


@pytest.mark.parametrize("field, value", [("novelty_bonus", -0.1), ("novelty_bonus", float("inf")),
                                          ("novelty_turns", -1), ("novelty_turns", 1.5)])
def test_bad_novelty_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RankingConfig(**{field: value})
    assert RankingConfig.plain().novelty_bonus == 0.0
