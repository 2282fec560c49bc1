"""Every tunable of a store, each defined once: ``StoreConfig(..., slm=SLMConfig(...))``.

Both are frozen dataclasses; ``MemoryStore.open(path, config=...)`` takes the whole tree, and
``config.replace(...)`` / ``dataclasses.replace`` derive variants.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from clag_fast.decay import ForgettingPolicy

__all__ = ["RankingConfig", "SLMConfig", "StoreConfig"]


def valid_embed_cache(value: object) -> bool:
    """Whether ``value`` is a size for the store's cache of texts' vectors (an int >= 0):
    ``StoreConfig``, ``ServeConfig`` and ``embed.vector_cache.VectorCache`` all check it so."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check(owner: str, checks: list[tuple[bool, str]]) -> None:
    for ok, message in checks:
        if not ok:
            raise ValueError(f"{owner}: {message}")


@dataclass(frozen=True)
class SLMConfig:
    """What the store asks its small language model, and when (the organiser's knobs).

    Similarities are cosines between a memory and a cluster centre with all-MiniLM-L6-v2:
    related sentences score about 0.4-0.7, unrelated ones 0.0-0.2; a centre scores higher
    than a typical member does.

    Connection:
      mode: "auto" (managed SmolLM2 llama.cpp server, started on first need, when installed)
        or "off" (vector-only organisation). ``MemoryStore.open(slm=...)`` overrides it.
      background: SLM work (ambiguous routes, profiles, re-organisation) runs in a worker
        thread, so ``add()`` returns after vector routing; ``flush()``/``close()`` wait for it.
        Off: that work runs inside the ``add()`` that triggers it (seconds with SmolLM2).
      vector_in_background: without an SLM, the periodic (and drift, confusion) vector-only
        re-organisations run in that worker too, so the ``add()`` that triggers one returns
        before it. Off by default: they are bounded (``StoreConfig.organize_period``) and,
        inline, happen at the same points for the same adds. The service turns it on: there
        the order of concurrent requests varies anyway, and the requests committed with the
        add that triggered one would otherwise wait for it (its latency tail).
    Routing:
      route_candidates: nearest clusters (by centre) considered for a new memory.
      slm_window: the SLM is asked only when a runner-up is within this much of the best.
      assign_threshold, assign_margin: even inside the window, a best similarity at or above
        ``assign_threshold`` that leads by ``assign_margin`` is taken without asking.
      slm_max_options: at most this many candidates per memory in a routing prompt.
      new_cluster_threshold: below this even the nearest cluster is unrelated: the memory
        opens a new cluster (vector routing uses it too), while the store holds fewer than
        max(1,024, memories / target size) clusters (``store.placement``). None = never.
      route_batch: ambiguous memories routed in one SLM prompt.
      route_note_chars: a memory's text is cut to this many characters in a routing prompt.
    Triggers (re-organisation besides ``StoreConfig.organize_every``):
      confusion_window / confusion_threshold: the last ``window`` searches all had a best
        score below the threshold.
      drift_window / drift_drop: the mean affinity of the last ``window`` assignments fell by
        ``drop`` versus the ``window`` before it.
    Profiles and topics:
      profile_examples: member texts (nearest the centre) shown when writing a profile, each
        cut to ``profile_note_chars`` characters (the candidate phrases carry the rest).
      profile_drift_share: rewrite a profile when this share of the members changed since it
        was written (inertia).
      profile_centre_similarity: ... or when the centre moved below this cosine.
      profile_min_size: smaller clusters keep a vector profile (their distinctive keyphrases)
        until they grow: an SLM call per 4-memory cluster costs more than it gives.
      profile_candidates: keyphrases offered to the SLM, which picks the label among them.
      profile_batch: clusters per profile call (one prompt, one pick list per cluster).
      profile_budget_s: ``organize()`` writes SLM profiles for at most this long before it
        returns; the rest are written in the background (vector profiles meanwhile).
      topic_samples, min_topics, max_topics: topic proposal from a sample of memories.
    Other:
      evolution: localized evolution (the paper's): the SLM links each new memory to related
        neighbours in its cluster and tags it (one call per memory; off for speed).
      updates: the SLM judges, with a constrained yes/no, whether a new memory updates the most
        similar older memory of its namespace in its cluster (a changed fact: "the flight moved
        to April 10"); a yes marks the older one superseded, as ``add(supersedes=...)`` does.
        Asked only when that older memory is at least ``update_similarity`` alike (one call
        per such memory; off by default).
      select_clusters: query-time cluster selection by the SLM (one call per text search).
      max_note_chars / max_group_chars: memory texts / cluster descriptions are cut to this
        many characters in the other prompts (prompt evaluation is most of the SLM's time).
    """

    mode: str = "auto"
    background: bool = True
    vector_in_background: bool = False
    # Measured on LoCoMo conversation 2 (BENCHMARKS.md, "SLM organiser cost"): these send 18%
    # of the routed turns to the SLM.
    route_candidates: int = 5
    assign_threshold: float = 0.6
    assign_margin: float = 0.01
    slm_window: float = 0.03
    slm_max_options: int = 3
    new_cluster_threshold: float | None = 0.2
    # Eight notes per call: half the calls of four, and the groups they share listed once
    # (the demo conversation: 17 -> 9 routing calls, 6.6k -> 5.3k prompt tokens with notes of
    # 120 characters; 4.3k with 80, the same choices: ``slm.organizer``'s routing prompt).
    route_batch: int = 8
    route_note_chars: int = 80
    confusion_window: int = 5
    confusion_threshold: float = 0.3
    # Two drift windows must fit inside organize_every, or periodic always fires first.
    drift_window: int = 15
    drift_drop: float = 0.1
    # Three notes of 100 characters beside the candidate phrases: replaying the demo
    # conversation's 25 profile requests, the SLM's first pick was the same as with five notes
    # of 160 for 19, at 44% fewer prompt tokens and half the time (BENCHMARKS.md, "SLM organiser").
    profile_examples: int = 3
    profile_note_chars: int = 100
    profile_drift_share: float = 0.5
    profile_centre_similarity: float = 0.95
    profile_min_size: int = 6
    profile_budget_s: float = 10.0
    profile_candidates: int = 8
    # Five clusters per call: prompts of about 800 tokens with three short notes each (a third
    # of the calls of one per cluster at three per call; BENCHMARKS.md, "Cluster labels").
    profile_batch: int = 5
    topic_samples: int = 12
    min_topics: int = 3
    max_topics: int = 5
    evolution: bool = False
    updates: bool = False
    update_similarity: float = 0.6
    select_clusters: bool = False
    max_note_chars: int = 160
    max_group_chars: int = 80

    def __post_init__(self) -> None:
        positive = ("route_candidates", "slm_max_options", "route_batch", "confusion_window",
                    "drift_window", "profile_examples", "profile_min_size", "profile_candidates", "profile_batch", "topic_samples",
                    "min_topics", "max_topics", "max_note_chars", "max_group_chars", "route_note_chars",
                    "profile_note_chars")
        checks = [(isinstance(getattr(self, n), int) and getattr(self, n) >= 1, f"{n} must be an int >= 1, "
                   f"got {getattr(self, n)!r}") for n in positive]
        checks += [
            (self.mode in ("auto", "off"), f"mode must be 'auto' or 'off', got {self.mode!r}"),
            (self.min_topics <= self.max_topics, f"min_topics ({self.min_topics}) > max_topics ({self.max_topics})"),
            (0.0 < self.profile_drift_share <= 1.0, "profile_drift_share must be in (0, 1]"),
            (self.profile_budget_s >= 0, "profile_budget_s must be >= 0"),
            (0 < self.update_similarity < 1, "update_similarity must be in (0, 1)"),
        ]
        _check("SLMConfig", checks)

    def replace(self, **changes: object) -> "SLMConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RankingConfig:
    """How hybrid text search ranks its candidates beyond the fused lexical + vector score
    (``store.context``). Chosen on LoCoMo conversations 1-5 and checked on conversations 6-10,
    the demo conversation and standard-library docstrings (BENCHMARKS.md, "Retrieval quality").

      expand: the best this-many first-stage hits bring their thread neighbours into the
        candidates (the turn that answers a question is often next to the one the query
        matches; 0 = no neighbours join).
      neighbour_weights: per distance in turns (1, 2, ...), the share of a neighbour's score a
        candidate receives, from the turns both before and after it (() = none).
      question_boost: a neighbour before the candidate that asks a question passes this many
        times its share (its answer follows it).
      question_weight: a candidate that asks a question keeps this share of its own score
        (the query's own words asked back rank below the turns that answer them).
      length_prior, length_cap: ``length_prior * log(1 + min(words, length_cap))`` is added to
        every candidate: a few words ("Haha, yes!") rarely hold the fact asked for.
      speaker_boost: added to the memories of the one speaker a query names (``speaker=``).
      superseded_weight: a memory updated by a newer eligible one (``supersedes=``) keeps this
        share of its score, and the newer one scores at least what the older one had.
      date_boost, number_boost, name_boost: added to the best ``answer_pool`` candidates whose
        text holds a date (a number, a name) when the query asks for one ("When ...?", "How
        many ...?", "Which ...?"; ``store.answer_kind``).
      novelty_bonus, novelty_turns: every candidate gains ``novelty_bonus`` * (1 - its highest
        cosine with the ``novelty_turns`` turns before it in its thread): a turn that says
        something new ranks above one that repeats what was just said (a confirmation, an echo).
      reflection_kind: the kind of the memories that restate earlier turns (an agent's
        reflections; ``store.reflections``).
      reflection_share: a memory of that kind among the best ``reflection_pool`` candidates passes
        this share of its score to its sources: the ``reflection_sources`` turns most similar to
        it among the ``reflection_window`` turns before it in its thread (0 = none).
    """

    expand: int = 5
    neighbour_weights: tuple[float, ...] = (0.3, 0.1)
    question_boost: float = 1.5
    question_weight: float = 0.8
    length_prior: float = 0.15
    length_cap: int = 40
    speaker_boost: float = 0.1
    superseded_weight: float = 0.9
    date_boost: float = 0.3
    number_boost: float = 0.3
    name_boost: float = 0.2
    answer_pool: int = 30
    novelty_bonus: float = 0.2
    novelty_turns: int = 2
    reflection_kind: str = "reflection"
    reflection_share: float = 0.3
    reflection_sources: int = 1
    reflection_window: int = 60
    reflection_pool: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "neighbour_weights", tuple(float(w) for w in self.neighbour_weights))
        _check("RankingConfig", [
            (isinstance(self.expand, int) and self.expand >= 0, f"expand must be an int >= 0, got {self.expand!r}"),
            (all(math.isfinite(w) and w >= 0 for w in self.neighbour_weights),
             "neighbour_weights must be finite and >= 0"),
            (math.isfinite(self.question_boost) and self.question_boost >= 0, "question_boost must be >= 0"),
            (0 <= self.question_weight <= 1, "question_weight must be in [0, 1]"),
            (math.isfinite(self.length_prior) and self.length_prior >= 0, "length_prior must be >= 0"),
            (isinstance(self.length_cap, int) and self.length_cap >= 1, "length_cap must be an int >= 1"),
            (math.isfinite(self.speaker_boost) and self.speaker_boost >= 0, "speaker_boost must be >= 0"),
            (0 <= self.superseded_weight <= 1, "superseded_weight must be in [0, 1]"),
            (math.isfinite(self.date_boost) and self.date_boost >= 0, "date_boost must be >= 0"),
            (math.isfinite(self.number_boost) and self.number_boost >= 0, "number_boost must be >= 0"),
            (math.isfinite(self.name_boost) and self.name_boost >= 0, "name_boost must be >= 0"),
            (isinstance(self.answer_pool, int) and self.answer_pool >= 0, "answer_pool must be an int >= 0"),
            (math.isfinite(self.novelty_bonus) and self.novelty_bonus >= 0, "novelty_bonus must be >= 0"),
            (isinstance(self.novelty_turns, int) and self.novelty_turns >= 0, "novelty_turns must be an int >= 0"),
            (isinstance(self.reflection_kind, str) and self.reflection_kind != "",
             f"reflection_kind must be a non-empty string, got {self.reflection_kind!r}"),
            (math.isfinite(self.reflection_share) and self.reflection_share >= 0, "reflection_share must be >= 0"),
            (isinstance(self.reflection_sources, int) and self.reflection_sources >= 1,
             "reflection_sources must be an int >= 1"),
            (isinstance(self.reflection_window, int) and self.reflection_window >= 1,
             "reflection_window must be an int >= 1"),
            (isinstance(self.reflection_pool, int) and self.reflection_pool >= 0,
             "reflection_pool must be an int >= 0"),
        ])

    @classmethod
    def plain(cls) -> "RankingConfig":
        """The fused score alone: no neighbours, priors or boosts (newer memories still rank
        above the ones they supersede)."""
        return cls(expand=0, neighbour_weights=(), question_weight=1.0, length_prior=0.0, speaker_boost=0.0,
                   date_boost=0.0, number_boost=0.0, name_boost=0.0, novelty_bonus=0.0, reflection_share=0.0)

    def replace(self, **changes: object) -> "RankingConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class StoreConfig:
    """Settings of a store. ``dim`` is fixed once and for all; the rest may change between
    opens.

    Vectors:
      dim: their width. None (the default): the width the embedder states (384 for the default
        MiniLM) or, when none states one (``embedder=False``, vectors brought on the first
        add), the width of the first vectors written (``store.dimension``). An integer fixes
        it at creation. Either way it is recorded and enforced from then on.

    Clustering:
      soft_k: clusters kept per memory with their affinities (soft assignment; 1 = hard).
      spill_margin: a secondary cluster also lists the memory for search when its affinity is
        within this margin of the best one (widens stage 2 only where a memory sits on a
        border, so recall rises without scanning every memory K times).
      n_probe: clusters searched in stage 2 by default; None = automatic: ``probe_fraction``
        of the clusters (at least 4 and at most ``max_probe``), so the share of memories a
        search scans stays put as the store grows from hundreds to a few thousand memories.
      probe_gap, min_probe: adaptive probing when ``n_probe`` is None: of the automatic count
        (the cap), probe the best ``min_probe`` clusters and then each further one whose centre
        score is within ``probe_gap`` of the best; None = always the full automatic count.
        Clustered data whose query stands out from all but its own clusters then scans only
        those (blob vectors: ~1-2 of 64), while close-together centre scores (conversation
        stores) still probe up to the cap (BENCHMARKS.md, Search).
      min_memories_to_cluster: the store stays flat (exact search) below this many memories,
        then clusters itself (the paper's cold start).
      target_cluster_size: k-means picks k = memories / target_cluster_size at cold start.
        Clusters of 8 (at most 32) keep hybrid search's LoCoMo Recall@10 where clusters of 4
        (at most 16) had it, and a conversation reads as one cluster per subject rather than
        per exchange (BENCHMARKS.md, "Retrieval quality and QA"); above ~4,000 memories both
        sizes grow with sqrt(memories) / 8 (``cluster_sizes_for``).
      max_cluster_size: a cluster larger than this is split in two at the next organisation,
        unless it is one coherent group (``coherence``).
      coherence: two groups of vectors are one when the mean similarity between them is at
        least this share of the mean similarity within them (``store.organize.cohesion``): an
        oversized cluster whose halves are one stays whole (up to 8x max_cluster_size), and a
        new or changed cluster merges with its nearest neighbour when the two are one, so
        vectors drawn around 20 centres end in about 20 clusters. 1 = always split at the
        cap, never merge on it.
      min_cluster_size: smaller clusters that survived an organisation are merged away.
      merge_threshold: clusters whose centres are at least this similar are merged.
      topic_weight: weight of an SLM topic's (or template label's) embedding in its cluster
        centre, in member-equivalents: the inertia that keeps a topic cluster on topic.
      labels: templated-labels mode: a fixed label set to organise by (no invented topics).
    Organisation:
      organize_every: periodic re-organisation every N new memories (0 = never); in a large
        store the period grows with it (``organize_period``), so its cost per memory stays
        bounded.
      slm: the SLM organiser's settings (``SLMConfig``).
    Hybrid search (text queries):
      lexical_weight: weight of BM25 against vector similarity for text queries (0 = vectors
        only; ``MemoryStore.search(lexical_weight=...)`` overrides it per call). Chosen by
        cross-validation on LoCoMo and checked on standard-library docstrings
        (benches/eval_hybrid.py, BENCHMARKS.md "Hybrid retrieval").
      lexical_fusion: how the two scores are combined ("minmax", "zscore", "bound", "rrf";
        see ``store.lexical.fuse``).
      ranking: what else ranks the candidates: thread neighbours, questions, length, speakers,
        updates (``RankingConfig``; ``RankingConfig.plain()``: the fused score alone).
    Other:
      forgetting: decay / pruning policy (off by default).
      cache_size: retrieval cache entries (0 = off); invalidated by any write.
      embed_cache: vectors of recently embedded texts kept (0 = off; ``embed.vector_cache``):
        a repeated query or label phrase is not embedded again; writes do not clear it.
      fsync: sync vectors and the database to disk on every write (power-loss safety);
        without it a process crash (SIGKILL) still loses nothing that add() returned.
    """

    dim: int | None = None
    soft_k: int = 3
    spill_margin: float = 0.03
    n_probe: int | None = None
    probe_fraction: float = 0.22
    max_probe: int = 64
    probe_gap: float | None = 0.4
    min_probe: int = 1
    min_memories_to_cluster: int = 100
    target_cluster_size: int = 8
    max_cluster_size: int = 32
    min_cluster_size: int = 2
    merge_threshold: float = 0.92
    # Pieces of one blob score 0.95-1.0, neighbouring clusters of conversation turns 0.55-0.93,
    # of isotropic vectors 0.2-0.6 (BENCHMARKS.md, "Cluster labels").
    coherence: float = 0.95
    topic_weight: float = 8.0
    labels: tuple[str, ...] | None = None
    organize_every: int = 50
    slm: SLMConfig = field(default_factory=SLMConfig)
    # 0.5 minmax won the tune half of LoCoMo and gains on every set (BENCHMARKS.md).
    lexical_weight: float = 0.5
    lexical_fusion: str = "minmax"
    ranking: RankingConfig = field(default_factory=RankingConfig)
    forgetting: ForgettingPolicy = field(default_factory=ForgettingPolicy)
    cache_size: int = 1024
    embed_cache: int = 4096
    fsync: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.slm, str):  # StoreConfig(slm="off"): the common switch, spelt short
            object.__setattr__(self, "slm", SLMConfig(mode=self.slm))
        _check("StoreConfig", [
            (self.dim is None or (isinstance(self.dim, int) and not isinstance(self.dim, bool) and self.dim > 0),
             f"dim must be a positive int or None, got {self.dim!r}"),
            (self.soft_k >= 1, "soft_k must be >= 1"),
            (self.spill_margin >= 0, "spill_margin must be >= 0"),
            (self.n_probe is None or self.n_probe >= 1, "n_probe must be >= 1 or None"),
            (0 < self.probe_fraction <= 1, "probe_fraction must be in (0, 1]"),
            (self.max_probe >= 1, "max_probe must be >= 1"),
            (self.probe_gap is None or (math.isfinite(self.probe_gap) and self.probe_gap >= 0),
             "probe_gap must be finite and >= 0, or None"),
            (self.min_probe >= 1, "min_probe must be >= 1"),
            (self.min_memories_to_cluster >= 2, "min_memories_to_cluster must be >= 2"),
            (self.target_cluster_size >= 2, "target_cluster_size must be >= 2"),
            (self.max_cluster_size > self.target_cluster_size,
             "max_cluster_size must be > target_cluster_size"),
            (self.min_cluster_size >= 1, "min_cluster_size must be >= 1"),
            (0 < self.merge_threshold <= 1, "merge_threshold must be in (0, 1]"),
            (0 < self.coherence <= 1, "coherence must be in (0, 1]"),
            (self.topic_weight >= 0, "topic_weight must be >= 0"),
            (self.organize_every >= 0, "organize_every must be >= 0"),
            (self.cache_size >= 0, "cache_size must be >= 0"),
            (valid_embed_cache(self.embed_cache),
             f"embed_cache must be a non-negative number of vectors, got {self.embed_cache!r}"),
            (0 <= self.lexical_weight <= 1, "lexical_weight must be in [0, 1]"),
            (self.lexical_fusion in ("minmax", "zscore", "bound", "rrf"),
             f"lexical_fusion must be 'minmax', 'zscore', 'bound' or 'rrf', got {self.lexical_fusion!r}"),
            (isinstance(self.slm, SLMConfig), f"slm must be an SLMConfig or 'auto'/'off', got {self.slm!r}"),
            (isinstance(self.ranking, RankingConfig), f"ranking must be a RankingConfig, got {self.ranking!r}"),
        ])
        if self.labels is not None:
            labels = tuple(self.labels)
            if not labels or any(not isinstance(s, str) or not s.strip() for s in labels):
                raise ValueError("StoreConfig: labels must be non-empty strings")
            object.__setattr__(self, "labels", tuple(s.strip() for s in labels))

    def cluster_sizes_for(self, n_memories: int) -> tuple[int, int]:
        """(target, max) cluster size for a store of ``n_memories``: the configured sizes,
        scaled by sqrt(n) / 8 once that is larger (IVF's sqrt(n) lists, kept 8x finer because
        probing many small clusters measured better than few large ones)."""
        scale = max(1.0, math.sqrt(max(n_memories, 0)) / 8.0 / self.target_cluster_size)
        return round(self.target_cluster_size * scale), round(self.max_cluster_size * scale)

    def organize_period(self, n_memories: int) -> int:
        """New memories between periodic re-organisations: ``organize_every``, or 5% of the
        store once that is more, so periodic organisation costs O(1) per memory however
        large the store grows (each pass touches the whole cluster table)."""
        if self.organize_every == 0:
            return 0
        return max(self.organize_every, n_memories // 20)

    def replace(self, **changes: object) -> "StoreConfig":
        return dataclasses.replace(self, **changes)
