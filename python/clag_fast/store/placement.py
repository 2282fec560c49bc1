"""Placing new rows: vector routing of fresh memories into clusters (soft, top ``soft_k``),
opening clusters for memories far from every centre, and applying the SLM's later choices.

Runs under the store's write lock. Rows are routed in chunks: each chunk is soft-assigned
against every centre in the native core (so clusters opened by earlier chunks count), and
only the rows of a chunk that open clusters are compared with each other, through one matrix
product: no Python loop over clusters, and the cost per row does not grow with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import time

from clag_fast.store import routing
from clag_fast.labels.profiles import vector_profile
from clag_fast.store.label_budget import FIRST_LABEL_COST, LabelBudget
from clag_fast.store.state import StoreState

# Rows per routing chunk: rows of a chunk are routed against the centres as they stood at its
# start (those they join move once per chunk), and the rows of it that open clusters are
# grouped by one (m x m) similarity matrix, m <= CHUNK (64 MB at most). Every cluster a chunk
# touches has its centre and int8 codes recomputed once per chunk: 4096 against 1024 made
# add_many into a store growing to 1M 46.6k / 49.5k -> 52.2k / 52.9k per s (alternating, quiet).
CHUNK = 4096

# Clusters a store may hold per ``target`` memories (``StoreConfig.cluster_sizes_for``), and at
# least ``MIN_CLUSTER_ROOM``, before a far memory joins its nearest cluster instead of opening
# one. On vectors with no structure (isotropic) nearly every memory is far from every centre:
# clusters of a few members each made routing and organisation cost grow with the store
# (BENCHMARKS.md, "Labelling inside add_many"). Structured data stays well below the cap.
CLUSTERS_PER_TARGET = 1.0
MIN_CLUSTER_ROOM = 1024


@dataclass
class Placement:
    """Where a batch of new rows went.

    ``ids``/``scores``: (n, soft_k) clusters (best first, -1 = none) and affinities, what the
    assignments table records; ``candidates``/``scores_k``: the wider (n, route_candidates)
    lists the SLM chooses among.
    """

    ids: np.ndarray
    affin: np.ndarray
    new_clusters: list[tuple[int, str]] = field(default_factory=list)  # (cluster id, source)
    opened_rows: set[int] = field(default_factory=set)  # batch indices placed in new clusters
    candidates: np.ndarray | None = None  # (n, route_candidates) cluster ids, for the SLM
    scores: np.ndarray | None = None

    @property
    def affinities(self) -> list[list[tuple[int, float]]]:
        """Per row, its (cluster id, affinity) pairs, best first."""
        return routing.affinity_rows(self.ids, self.affin, self.ids.shape[1])


def new_cluster_threshold(state: StoreState) -> float | None:
    """Below this best-centre similarity a memory opens a cluster (never with fixed labels)."""
    return None if state.config.labels is not None else state.config.slm.new_cluster_threshold


def cluster_room(state: StoreState, n_new: int) -> int:
    """Clusters a batch of ``n_new`` memories may still open (``CLUSTERS_PER_TARGET``)."""
    n = state.rows.n_live + n_new  # kept by the row table: counting the live column is O(rows)
    target = state.config.cluster_sizes_for(n)[0]
    cap = max(MIN_CLUSTER_ROOM, int(np.ceil(CLUSTERS_PER_TARGET * n / target)))
    return max(0, cap - len(state.index.cluster_ids()))


def route_new_rows(state: StoreState, rows: np.ndarray, vectors: np.ndarray) -> Placement:
    """Assign fresh rows by vectors: nearest clusters (soft, top ``soft_k``), or a new cluster
    when even the nearest is below the new-cluster threshold. Before the cold start (no
    clusters yet) rows stay unassigned and search runs flat."""
    idx, cfg = state.index, state.config
    n = len(rows)
    placement = Placement(ids=np.full((n, cfg.soft_k), -1, np.int64),
                          affin=np.full((n, cfg.soft_k), -np.inf, np.float32))
    if len(idx.cluster_ids()) == 0:
        return placement
    k = max(cfg.soft_k, cfg.slm.route_candidates)
    threshold = new_cluster_threshold(state)
    room = cluster_room(state, n) if threshold is not None else 0
    all_ids = np.full((n, k), -1, np.int64)
    all_scores = np.full((n, k), -np.inf, np.float32)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        ids, scores = idx.soft_assign(vectors[lo:hi], k=k)
        all_ids[lo:hi, : ids.shape[1]] = ids
        all_scores[lo:hi, : ids.shape[1]] = scores
        members = routing.memberships(ids, scores, cfg.soft_k, cfg.spill_margin)
        kk = min(cfg.soft_k, ids.shape[1])
        aff_ids, aff = placement.ids[lo:hi], placement.affin[lo:hi]
        aff_ids[:, :kk] = ids[:, :kk]
        aff[:, :kk] = scores[:, :kk]
        if threshold is not None and room > 0:
            low = np.flatnonzero(scores[:, 0] < threshold)
            if len(low):
                leaders, lead_aff = routing.leaders(vectors[lo:hi][low], threshold)
                keep = routing.within_room(leaders, room)
                low, leaders, lead_aff = low[keep], leaders[keep], lead_aff[keep]
                opened = {}
                for lead in leaders.tolist():
                    if lead not in opened:
                        opened[lead] = idx.new_cluster()
                        placement.new_clusters.append((opened[lead], "route"))
                cids = np.asarray([opened[lead] for lead in leaders.tolist()], np.int64)
                members[low] = -1
                members[low, 0] = cids
                aff_ids[low] = -1
                aff_ids[low, 0] = cids
                aff[low] = -np.inf
                aff[low, 0] = lead_aff
                placement.opened_rows.update((lo + low).tolist())
                room -= len(opened)
        idx.assign(rows[lo:hi], members)
    placement.candidates, placement.scores = all_ids, all_scores
    state.count("routed_new", len(placement.opened_rows))
    state.count("routed_vector", n - len(placement.opened_rows))
    return placement


def record_placement(state: StoreState, rows: np.ndarray, texts: list[str],
                     placement: Placement, now: float, budget: LabelBudget | None = None) -> None:
    """Inside the caller's transaction: save the clusters a batch opened; then the rows'
    assignment records. A new cluster is labelled by its first memory until the next profile
    pass (SLM or vector) rewrites it. With a ``budget``, only the new clusters it covers are
    (those with the most members first); the others wait, unlabelled, for a profile pass,
    which takes unlabelled clusters first."""
    provisional = {}
    if placement.new_clusters:
        t0 = time.perf_counter()
        col = placement.ids[:, 0]
        uniq, first, count = np.unique(col[col >= 0], return_index=True, return_counts=True)
        first_row = dict(zip(uniq.tolist(), np.flatnonzero(col >= 0)[first].tolist()))
        members = dict(zip(uniq.tolist(), count.tolist()))
        new = [c for c, _ in placement.new_clusters]
        if budget is not None:
            new = sorted(new, key=lambda c: -members.get(c, 0))
            new = new[:budget.affordable([FIRST_LABEL_COST] * len(new))]
            budget.spend(FIRST_LABEL_COST * len(new))
        for c in new:
            provisional[c] = vector_profile([texts[first_row[c]]])
        state.count("label_s", time.perf_counter() - t0)
        state.count("label_units", FIRST_LABEL_COST * len(new))
    add_clusters(state, placement.new_clusters, now, provisional)
    state.assignments.write(rows, placement.ids, placement.affin)


def add_clusters(state: StoreState, clusters: list[tuple[int, str]], now: float,
                 profiles: dict[int, tuple[str, list[str]]] | None = None, profiled: bool = False) -> None:
    profiles = profiles or {}
    state.catalog.add_clusters(clusters, now, profiles, profiled=profiled)
    for c, _ in clusters:
        state.profiles[c] = profiles.get(c, ("", []))


def move_rows(state: StoreState, rows: np.ndarray, targets: list[int]) -> None:
    """Apply the SLM's routing choices: make ``targets[i]`` the primary cluster of a row."""
    idx = state.index
    ids = idx.cluster_ids()
    known = set(ids.tolist())
    keep = [i for i, t in enumerate(targets) if t in known]
    if not keep:
        return
    rows = rows[keep]
    targets_a = np.asarray([targets[i] for i in keep], np.int64)
    slot = {c: i for i, c in enumerate(ids.tolist())}
    centres = idx.centres()[[slot[t] for t in targets_a.tolist()]]
    sims = np.einsum("ij,ij->i", centres, idx.vectors()[rows])
    idx.assign(rows, targets_a)
    state.assignments.write(rows, targets_a[:, None], sims[:, None])
