"""LabelBudget: how much label work the write path may do, counted in texts handled.

Labelling inside ``add_many`` (a new cluster's first label, the periodic passes' profiles) costs
about the same whatever the memories are, while an add costs very different amounts: a
memory whose text the store embeds takes milliseconds, one whose vector is given a few
hundredths of one. Without a bound, data that opens a cluster for most memories (isotropic
vectors) spent nearly all of ``add_many`` labelling. So every memory added earns credit in
proportion to what adding it cost, and label work spends it: a text ranked for a cluster's
phrases counts one unit, a text read for the first time (a new member, a row new to the
namespace's sample: about once per row) one more, a phrase embedded ``EMBED_COST``, a new
cluster's first label ``FIRST_LABEL_COST``, a pass that labels ``PASS_COST`` besides.

Label work never runs ahead of the credit. A pass takes a cluster only where the credit covers
the most it can cost (every member read for the first time), and reads the rows of the
namespace's sample it has not counted yet with what is left: the rest are read by later
passes, and a label ranked against part of the sample is redone by the next pass that gets to
it. Work the credit does not cover waits: a new cluster keeps an empty label and a periodic pass
labels fewer clusters (unlabelled first) until later adds pay for it. ``MemoryStore.organize()``
labels everything, and the cold start its clusters (so a small store has every cluster
labelled), unbudgeted.

The units are counts, not seconds, so a store labels the same clusters whatever the machine's
load; the constants say what a unit costs next to an add (BENCHMARKS.md, "Labelling inside
add_many"; ``benches/bench_labelling.py``).
"""

from __future__ import annotations

import threading

__all__ = ["LabelBudget", "VECTOR_CREDIT", "TEXT_CREDIT", "EMBED_COST", "FIRST_LABEL_COST", "CALL_CREDIT",
           "PASS_COST"]

# One unit: one member text ranked for a cluster's phrases, or one text's phrases extracted,
# 0.03-0.05 ms on 2 cores (BENCHMARKS.md, "Labelling inside add_many").
#: Credit a memory added with its vector given earns. An add with its vector given costs about
#: 0.04-0.2 ms of which labelling is to take at most a fifth: 0.25 units, with the call's own
#: credit, holds the labelling share to 12-18% by data shape (the same topic).
VECTOR_CREDIT = 0.25
#: A new cluster's first label (its first member's phrases ranked alone, about 0.2 ms).
FIRST_LABEL_COST = 8.0
#: Credit every write call earns besides its memories': a call costs a transaction (about a
#: millisecond), and this lets each pay for a first label, so small writes keep every cluster
#: labelled.
CALL_CREDIT = FIRST_LABEL_COST
#: A pass that labels: its reads and the transaction that writes its labels (about 3 ms).
PASS_COST = 64.0
#: A label phrase embedded (a few tokens through the embedder, about 1 ms on 2 cores).
EMBED_COST = 25.0
#: Credit a memory whose text the store embeds earns (its embedding, 5-20 ms): a fifth of it.
TEXT_CREDIT = 40.0


class LabelBudget:
    """The label work the write path has earned and spent (thread-safe: the worker spends,
    writers earn)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.earned = 0.0
        self.spent = 0.0

    @property
    def credit(self) -> float:
        """Units earned and not spent yet (negative after a pass that cost more than it had)."""
        with self._lock:
            return self.earned - self.spent

    def earn(self, vectors: int = 0, texts: int = 0) -> None:
        """Credit for one write call of ``vectors`` memories added with their vectors given
        and ``texts`` whose text the store embedded."""
        with self._lock:
            self.earned += CALL_CREDIT + vectors * VECTOR_CREDIT + texts * TEXT_CREDIT

    def spend(self, units: float) -> None:
        with self._lock:
            self.spent += units

    def affordable(self, costs: list[float]) -> int:
        """How many of ``costs``, taken in order, the credit covers now (nothing is spent)."""
        left = self.credit
        n = 0
        for c in costs:
            if c > left:
                break
            left -= c
            n += 1
        return n

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {"earned": round(self.earned, 1), "spent": round(self.spent, 1)}
