"""Triggers: periodic, confusion, drift, explicit; thread safety."""

from __future__ import annotations

import threading

import pytest

from clag_fast.slm.organizer import OrganizerConfig
from clag_fast.slm.triggers import Triggers


def trig(**kw) -> Triggers:
    every = kw.pop("organize_every", 0)
    base = dict(confusion_window=3, confusion_threshold=0.3, drift_window=4, drift_drop=0.1)
    base.update(kw)
    return Triggers(OrganizerConfig(**base), organize_every=every)


def test_nothing_due_initially():
    t = Triggers()
    assert t.due() is None
    assert t.snapshot()["adds_since_organize"] == 0


def test_periodic_every_n_adds_and_reset():
    t = trig(organize_every=5)
    for _ in range(4):
        t.on_add(0.5)
    assert t.due() is None
    t.on_add(0.5)
    assert t.due() == "periodic"
    assert t.due() == "periodic"  # due() only looks
    t.reset()
    assert t.due() is None
    t.on_add(None, n=5)  # batch add, no affinity (before clustering)
    assert t.due() == "periodic"


def test_periodic_off_with_zero():
    t = trig(organize_every=0)
    t.on_add(None, n=10_000)
    assert t.due() is None


def test_confusion_needs_a_full_window_of_low_scores():
    t = trig()
    t.on_search(0.1)
    t.on_search(0.2)
    assert t.due() is None  # window not full
    t.on_search(0.5)
    assert t.due() is None  # one good search in the window
    t.on_search(0.1)
    t.on_search(None)  # nothing found counts as confused
    assert t.due() is None  # 0.5 still in the window
    t.on_search(0.29)
    assert t.due() == "confusion"
    t.reset()
    assert t.due() is None


def test_on_search_says_exactly_when_confusion_holds():
    # The search path polls due() only when on_search returns True: the two must agree on
    # every sequence, resets included.
    import random

    rng = random.Random(3)
    t = trig()
    agreed = 0
    for step in range(2_000):
        if rng.random() < 0.01:
            t.reset()
        holds = t.on_search(rng.choice([0.1, 0.2, 0.29, 0.3, 0.6, None]))
        assert holds == (t.due() == "confusion"), step
        agreed += holds
    assert agreed > 10  # the sequence did reach the trigger


def test_drift_when_recent_affinity_falls():
    t = trig()
    for a in (0.6, 0.6, 0.6, 0.6):
        t.on_add(a)
    assert t.due() is None  # only one window so far
    for a in (0.55, 0.55, 0.55, 0.55):
        t.on_add(a)
    assert t.due() is None  # fell 0.05 < drift_drop
    for a in (0.45, 0.45, 0.45, 0.45):
        t.on_add(a)
    # Windows now (0.55 x4) then (0.45 x4): drop 0.10 >= 0.1.
    assert t.due() == "drift"
    t.reset()
    assert t.due() is None


def test_drift_ignores_rising_affinity():
    t = trig()
    for a in [0.3] * 4 + [0.7] * 4:
        t.on_add(a)
    assert t.due() is None


def test_priority_explicit_first():
    t = trig(organize_every=1)
    for _ in range(3):
        t.on_search(0.0)
    t.on_add(0.5)
    assert t.due() == "periodic"
    t.request()
    assert t.due() == "explicit"
    t.reset()
    assert t.due() is None


def test_bad_inputs():
    t = trig()
    with pytest.raises(ValueError, match="finite"):
        t.on_add(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        t.on_search(float("nan"))
    with pytest.raises(ValueError, match="n must be"):
        t.on_add(0.5, n=-1)


def test_thread_safe_counting():
    t = trig(organize_every=10**9)

    def work():
        for _ in range(2000):
            t.on_add(0.5)
            t.on_search(0.9)
            t.due()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.snapshot()["adds_since_organize"] == 8000
