"""The decay policy: weights against a direct per-row computation, and validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import math

from clag_fast.decay import DAY, ForgettingPolicy


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(0, 300),
    half_life=st.floats(0.01, 1000),
    boost=st.floats(0, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_weights_match_the_definition(n, half_life, boost, seed):
    rng = np.random.default_rng(seed)
    now = 1.8e9
    created = now - rng.uniform(-DAY, 400 * DAY, n)  # some in the future (clock skew)
    last = np.where(rng.random(n) < 0.4, np.nan, created + rng.uniform(0, DAY, n))
    count = rng.integers(0, 50, n).astype(np.float64)
    strength = rng.uniform(0, 2, n).astype(np.float32)
    p = ForgettingPolicy(half_life_days=half_life, access_boost=boost)
    got = p.weights(now, created, last, count, strength)
    want = []
    for c, la, a, sv in zip(created, last, count, strength):
        t = c if math.isnan(la) else la
        want.append(sv * 0.5 ** (max(now - t, 0.0) / (half_life * DAY)) * (1 + boost * math.log1p(a)))
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=2e-6, atol=1e-30)


def test_half_life_halves_and_access_boosts():
    p = ForgettingPolicy(half_life_days=2.0, access_boost=0.5)
    now = 1e9
    created = np.array([now, now - 2 * DAY, now - 4 * DAY, now - 4 * DAY])
    last = np.array([np.nan, np.nan, np.nan, now])
    count = np.array([0.0, 0.0, 0.0, 3.0])
    w = p.weights(now, created, last, count, np.ones(4, np.float32))
    np.testing.assert_allclose(w[:3], [1.0, 0.5, 0.25], rtol=1e-6)
    assert w[3] == pytest.approx(1 + 0.5 * np.log1p(3.0), rel=1e-6)


def test_no_decay_returns_strength():
    w = ForgettingPolicy().weights(0.0, np.zeros(3), np.full(3, np.nan), np.zeros(3), np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(w, [1, 2, 3])


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"half_life_days": 0}, "half_life_days"),
        ({"access_boost": -1}, "access_boost"),
        ({"prune_action": "shred"}, "prune_action"),
        ({"prune_below": 0.1}, "needs half_life_days"),
    ],
)
def test_policy_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ForgettingPolicy(**kw)
