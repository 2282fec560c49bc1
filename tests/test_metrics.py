"""Metric functions against hand-computed cases."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clag_fast.eval.metrics import (
    answer_tokens,
    bleu1,
    ndcg_at_k,
    normalize_answer,
    percentile,
    precision_at_k,
    recall_at_k,
    token_f1,
)

# --- normalisation ---------------------------------------------------------------------


def test_normalize_answer_lowercases_strips_punctuation_and_articles():
    assert normalize_answer("The  Cat, sat on a mat!") == "cat sat on mat"
    assert normalize_answer("An apple-pie.") == "applepie"
    # articles only as whole words: "theme" and "another" keep their letters
    assert normalize_answer("theme another") == "theme another"
    assert normalize_answer(2022) == "2022"
    assert answer_tokens("  ") == []


# --- token F1 --------------------------------------------------------------------------


def test_f1_exact_and_disjoint():
    assert token_f1("Paris", "paris.") == 1.0
    assert token_f1("London", "Paris") == 0.0
    assert token_f1("", "Paris") == 0.0
    assert token_f1("the", "a") == 0.0  # both empty after article removal


def test_f1_partial_overlap_by_hand():
    # pred tokens: [she, went, to, paris, in, may] (6), ref: [paris] (1); overlap 1
    # P = 1/6, R = 1, F1 = 2*(1/6)/(7/6) = 2/7
    assert token_f1("She went to Paris in May", "Paris") == pytest.approx(2 / 7)


def test_f1_counts_multisets_not_sets():
    # pred [dog, dog, cat] vs ref [dog, cat, cat]: Counter overlap = dog:1 + cat:1 = 2
    # P = 2/3, R = 2/3, F1 = 2/3. A set-based F1 would give 1.0.
    assert token_f1("dog dog cat", "dog cat cat") == pytest.approx(2 / 3)


# --- BLEU-1 ----------------------------------------------------------------------------


def test_bleu1_exact_match_is_one():
    assert bleu1("7 May 2023", "7 May 2023") == 1.0


def test_bleu1_longer_prediction_has_no_brevity_penalty():
    # pred [she, went, to, paris, in, may] (6), ref [paris, in, may] (3): 3 matches, c > r
    assert bleu1("She went to Paris in May", "Paris in May") == pytest.approx(3 / 6)


def test_bleu1_short_prediction_gets_brevity_penalty():
    # pred [paris] (1), ref [paris, in, may] (3): p1 = 1, BP = exp(1 - 3/1) = e^-2
    assert bleu1("Paris", "Paris in May") == pytest.approx(math.exp(-2))


def test_bleu1_clips_repeated_tokens():
    # pred [dog, dog, dog, dog] vs ref [dog, cat, cat, cat]: clipped matches 1, c == r -> BP 1
    assert bleu1("dog dog dog dog", "dog cat cat cat") == pytest.approx(1 / 4)


def test_bleu1_no_overlap_or_empty_is_zero():
    assert bleu1("London", "Paris") == 0.0
    assert bleu1("", "Paris") == 0.0
    assert bleu1("Paris", "") == 0.0


@given(st.text(max_size=40), st.text(max_size=40))
def test_qa_metrics_stay_in_unit_interval(a, b):
    assert 0.0 <= token_f1(a, b) <= 1.0
    assert 0.0 <= bleu1(a, b) <= 1.0
    assert token_f1(a, b) == token_f1(b, a)  # F1 is symmetric


# --- retrieval -------------------------------------------------------------------------


def test_recall_precision_by_hand():
    retrieved = ["D1:1", "D1:5", "D2:3", "D1:2", "D3:1"]
    relevant = {"D1:5", "D3:1", "D9:9"}
    assert recall_at_k(retrieved, relevant, 1) == 0.0
    assert recall_at_k(retrieved, relevant, 2) == pytest.approx(1 / 3)
    assert recall_at_k(retrieved, relevant, 5) == pytest.approx(2 / 3)
    assert precision_at_k(retrieved, relevant, 2) == pytest.approx(1 / 2)
    assert precision_at_k(retrieved, relevant, 5) == pytest.approx(2 / 5)
    # fewer retrieved than k: missing slots count as misses
    assert precision_at_k(retrieved, relevant, 10) == pytest.approx(2 / 10)


def test_duplicate_retrieved_ids_count_once():
    assert recall_at_k(["a", "a"], {"a", "b"}, 2) == 0.5
    assert precision_at_k(["a", "a"], {"a", "b"}, 2) == 0.5


def test_ndcg_by_hand():
    # relevant at ranks 2 and 4 of k=4, two relevant in total
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    idcg = 1 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at_k(["x", "a", "y", "b"], {"a", "b"}, 4) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["a", "b", "x"], {"a", "b"}, 3) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], {"a"}, 2) == 0.0
    # more relevant than k: the ideal list is k relevant items
    assert ndcg_at_k(["a"], {"a", "b", "c"}, 1) == pytest.approx(1.0)


def test_undefined_or_bad_arguments_raise():
    with pytest.raises(ValueError, match="without relevant"):
        recall_at_k(["a"], set(), 5)
    with pytest.raises(ValueError, match="without relevant"):
        ndcg_at_k(["a"], [], 5)
    with pytest.raises(ValueError, match="k must be positive"):
        precision_at_k(["a"], {"a"}, 0)


def test_percentile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)
