"""Organisation: cold start, SLM topics and template labels as centres, split of oversized
clusters, merge of redundant and tiny ones, re-assignment, and the vector side of profiles.

A cluster over the size cap is split in two only when the split separates it (``cohesion``):
a coherent group (vectors drawn around one centre) stays whole up to ``COHERENT_CAP`` times the
cap, and near-duplicate clusters merge past the cap on the same test, so data made of 20 groups
ends in about 20 clusters rather than a size-capped tiling of each. Clusters of one member that
a pass creates (an SLM topic only one memory is nearest to, one side of a split) are folded into
their nearest cluster in the same pass; one that routing opened gets one organisation to grow.

Functions here take the ``StoreState`` and run under its write lock; they keep the index and
the database in agreement. SLM calls never happen here: the scheduler (``store.slm_scheduler``)
asks the SLM first, outside the lock, and passes the answers in.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from clag_fast.store import routing
from clag_fast.store.catalog import LIVE
from clag_fast.store.placement import add_clusters
from clag_fast.store.state import StoreState

log = logging.getLogger(__name__)

# Rows per re-assignment chunk (a 24 MB gather of their vectors).
REASSIGN_CHUNK = 16_384
# Centres a touched cluster's members are re-assigned among (``reassign_near``): the
# cluster's own and its nearest ones. A member's best centres lie next to the centre it was
# routed to, so a split, merge or drift needs no search of every centre: at 1M blob vectors
# split waves re-assigned hundreds of thousands of rows against ~2,000 centres per
# organisation, the largest cost of ingest as the store grew.
NEAR_CENTRES = 32
# A cluster whose centre moved by more than this (1 - cosine) since the last organisation has
# its members re-assigned: centres are running means, so a young cluster drifts as members
# join, and members routed early can be left nearer another centre than their own (seen: a
# member at cosine 0.09 to its own centre and 0.58 to another, unfindable by two-stage search
# probing 2 clusters). Mature clusters barely move, so the work falls as the store grows.
DRIFT = 0.05
# A coherent cluster (one a split would not separate) stays whole up to this many times the
# size cap; past it, it is split anyway, so one probe never scans an unbounded cluster.
COHERENT_CAP = 8
# A cluster found coherent is tested again once it has grown by this factor (each test is a
# 2-means fit and a gather of its members' vectors; at a million blob vectors most clusters
# would otherwise be split and put back at every organisation).
RETEST_GROWTH = 1.25
# Rows added since the last save of the index state past which a periodic organisation saves
# it. Each save rewrites the whole cluster state (every centre and member list) and
# checkpoints the database; at every pass that was about 28% of the add time of isotropic
# vectors at 5k memories (BENCHMARKS.md, "Labelling inside add_many"). A kill between saves
# costs nothing: the reopen repairs the older state from the database and the assignment
# records (``recovery.reconcile``). Readers in other processes scan the rows a saved state
# does not place exactly, so this also bounds their extra work (8k rows: 12 MB at dim 384).
SAVE_ROWS = 8_192
#: The database meta key recording a re-organisation that deferred writes
#: (``MemoryStore.add_many(defer_organize=True)``) left owed; every organisation clears it.
OWED_META = "organize_owed"


def organize(state: StoreState, *, reason: str = "explicit", topics: list[str] | None = None,
             topic_vectors: np.ndarray | None = None) -> dict[str, Any]:
    """Restructure the clusters. ``topics``/``topic_vectors`` are SLM-proposed (or template)
    topic descriptions already embedded by the caller (outside the lock)."""
    idx, cfg = state.index, state.config
    t0 = time.perf_counter()
    live = state.rows.live_rows()
    report: dict[str, Any] = {"reason": reason, "memories": int(len(live)), "kmeans_k": 0,
                              "topics": [], "split": [], "merged": [], "reassigned": 0}
    now = time.time()
    touched_all: set[int] | None = None  # None: every member was (re-)assigned, or no clusters
    new: list[tuple[int, str]] = []
    profiles: dict[int, tuple[str, list[str]]] = {}
    enough = len(live) >= (2 if reason == "explicit" else cfg.min_memories_to_cluster)
    if topics and topic_vectors is not None and len(topic_vectors):
        for text, vec in zip(topics, topic_vectors):
            cid = idx.new_cluster(centre=vec, weight=cfg.topic_weight)
            new.append((cid, "slm_topic"))
            profiles[cid] = (text, [])
            report["topics"].append(text)
        report["reassigned"] = reassign(state, live)
    elif len(idx.cluster_ids()) == 0 and enough and cfg.labels is None:
        k = routing.choose_k(len(live), cfg.cluster_sizes_for(len(live))[0])
        new += [(cid, "kmeans") for cid in idx.kmeans(k, rows=live, seed=0).tolist()]
        report["kmeans_k"] = k
        report["reassigned"] = reassign(state, live)
    elif len(idx.cluster_ids()) > 0:
        unassigned = live[idx.cluster_of(live) < 0]
        if len(unassigned):
            report["reassigned"] = reassign(state, unassigned)
    if len(idx.cluster_ids()) > 0 and cfg.labels is None:
        touched = drifted(state)
        report["drifted"] = len(touched)
        touched |= _split_oversized(state, report, new)
        stray: set[int] = set()
        touched |= _merge_redundant(state, report, now, {c for c, _ in new}, touched, stray)
        report["reassigned_touched"] = reassign_near(state, touched)
        # Rows that held a merged-away cluster as a secondary: the index moved the link, their
        # assignment records still name the old cluster.
        alive_now = set(idx.cluster_ids().tolist())
        for c in touched & alive_now:
            stray.difference_update(idx.members(c).tolist())  # re-assigned just now
        if stray:
            report["reassigned_touched"] += reassign(state, np.fromiter(sorted(stray), np.int64, len(stray)))
        touched_all = touched
    # A topic no memory is nearest to would only waste probes: drop it (and any other
    # cluster left empty), except template labels, which exist by definition.
    templates = state.catalog.template_clusters() | {c for c, src in new if src == "template"}
    ids, sizes = idx.cluster_ids(), idx.cluster_sizes()
    for cid in ids[(sizes == 0)].tolist():
        if cid not in templates:
            idx.drop_cluster(cid)
            report.setdefault("dropped_empty", []).append(cid)
    alive = set(idx.cluster_ids().tolist())
    new = [(c, src) for c, src in new if c in alive]
    with state.catalog.transaction():
        add_clusters(state, new, now, profiles)
        sync_clusters(state, now)
        state.catalog.set_meta("last_organized", repr(now))
        state.catalog.delete_meta(OWED_META)
    if _saves(state, reason):
        # Rows synced, the state saved so a reopen finds it; the state file itself is fsynced
        # only with ``StoreConfig.fsync`` (derived state: one lost with the power is rebuilt on
        # open from the rows and the database).
        state.flush_index(durable=state.config.fsync)
    _settle_references(state, touched_all)
    state.count("organizations")
    state.cache.clear()
    report["clusters"] = int(len(alive))
    report["seconds"] = round(time.perf_counter() - t0, 4)
    log.info("organised (%s): %s", reason, report)
    return report


def _saves(state: StoreState, reason: str) -> bool:
    """Whether an organisation ends by saving the index state (and checkpointing the
    database): an explicit one, any with ``StoreConfig.fsync``, a periodic one once
    ``SAVE_ROWS`` rows were added since the last save."""
    return reason == "explicit" or state.config.fsync or state.rows_since_checkpoint >= SAVE_ROWS


def create_label_clusters(state: StoreState, labels: list[str], vectors: np.ndarray) -> list[int]:
    """Templated-labels mode: one anchored cluster per label; existing rows are re-routed."""
    idx, cfg = state.index, state.config
    now = time.time()
    new = [(idx.new_cluster(centre=v, weight=max(cfg.topic_weight, 1.0)), "template") for v in vectors]
    profiles = {cid: (label, []) for (cid, _), label in zip(new, labels)}
    with state.catalog.transaction():
        add_clusters(state, new, now, profiles, profiled=True)
    reassign(state, state.rows.live_rows())
    state.flush_index()
    return [c for c, _ in new]


def drifted(state: StoreState) -> set[int]:
    """Clusters whose centre moved by more than ``DRIFT`` from its reference: the centre it
    had when its members were last re-assigned (a slow drift adds up across organisations).
    None on the first organisation in this process: a reopened store starts from its saved,
    settled centres."""
    if state.organized_centres is None:
        return set()
    before_ids, before = state.organized_centres
    ids, centres = state.index.cluster_ids(), state.index.centres()
    common, now_at, then_at = np.intersect1d(ids, before_ids, return_indices=True)
    if len(common) == 0:
        return set()
    moved = 1.0 - np.einsum("ij,ij->i", centres[now_at], before[then_at])
    return set(common[moved > DRIFT].tolist())


def _settle_references(state: StoreState, touched: set[int] | None) -> None:
    """Reference centres for ``drifted``: re-assigned (``touched``) and new clusters take
    their current centre; the others keep theirs, so small moves accumulate until they count.
    ``touched`` None: every cluster takes its current centre."""
    ids, centres = state.index.cluster_ids(), state.index.centres()
    if touched is None or state.organized_centres is None:
        state.organized_centres = (ids, centres)
        return
    before_ids, before = state.organized_centres
    ref = centres.copy()
    common, now_at, then_at = np.intersect1d(ids, before_ids, return_indices=True)
    keep = ~np.isin(common, np.fromiter(touched, np.int64, len(touched)))
    ref[now_at[keep]] = before[then_at[keep]]
    state.organized_centres = (ids, ref)


def cohesion(state: StoreState, a: np.ndarray, b: np.ndarray) -> float:
    """How much two groups of rows (``a``, ``b``: row arrays) are one: the mean similarity
    (dot product of unit vectors) between a row of one and a row of the other, over the mean
    similarity between two rows of the same group. Random subsets of one group score 1 whatever
    their sizes; halves or neighbouring pieces of one blob of vectors 0.95-1.0, neighbouring
    clusters of MiniLM conversation turns 0.55-0.93, of isotropic vectors 0.2-0.6
    (BENCHMARKS.md, "Cluster labels"). 0 when either group has fewer than two rows or the
    rows within them are not alike."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return 0.0
    vectors = state.index.vectors()
    sa, sb = vectors[a].sum(axis=0, dtype=np.float64), vectors[b].sum(axis=0, dtype=np.float64)
    pairs_a, pairs_b = na * (na - 1), nb * (nb - 1)
    # sum over ordered pairs i != j of x_i . x_j = |s|^2 - n for unit rows.
    within = (float(sa @ sa) - na + float(sb @ sb) - nb) / (pairs_a + pairs_b)
    if within <= 1e-6:
        return 0.0
    return float(sa @ sb) / (na * nb) / within


def _halves(vectors: np.ndarray, iterations: int = 8) -> np.ndarray:
    """A spherical 2-means cut of ``vectors`` (unit rows): True for the rows of one half. Seeded
    from the member farthest from the centre and the one farthest from it, so it is
    deterministic; a few iterations are enough to tell a separable cluster from one group."""
    centre = vectors.sum(axis=0)
    a = vectors[int(np.argmin(vectors @ centre))]
    b = vectors[int(np.argmin(vectors @ a))]
    side = (vectors @ a) >= (vectors @ b)
    for _ in range(iterations):
        if side.all() or not side.any():
            break
        a, b = vectors[side].sum(axis=0), vectors[~side].sum(axis=0)
        new = (vectors @ a) / np.linalg.norm(a) >= (vectors @ b) / np.linalg.norm(b)
        if np.array_equal(new, side):
            break
        side = new
    return side


def _coherent(state: StoreState, cid: int) -> bool:
    """A 2-means cut would not separate cluster ``cid`` (the halves' ``cohesion`` reaches
    ``StoreConfig.coherence``): it is one group around one centre."""
    members = state.index.members(cid)
    side = _halves(state.index.vectors()[members].astype(np.float32))
    return cohesion(state, members[side], members[~side]) >= state.config.coherence


def _split_oversized(state: StoreState, report: dict, new: list) -> set[int]:
    idx, cfg = state.index, state.config
    touched: set[int] = set()
    max_size = cfg.cluster_sizes_for(len(state))[1]
    cap = COHERENT_CAP * max_size
    ids, sizes = idx.cluster_ids(), idx.cluster_sizes()
    size = dict(zip(ids.tolist(), sizes.tolist()))
    coherent = state.coherent
    for c in [c for c in coherent if c not in size]:
        del coherent[c]

    def cut(c: int) -> bool:
        """Split ``c`` now: over the cap and, below ``cap``, separable (tested once per growth)."""
        n = size[c]
        if n <= max_size:
            return False
        if n > cap or cfg.coherence >= 1:
            return True
        if c in coherent and n < RETEST_GROWTH * coherent[c]:
            return False
        if _coherent(state, c):
            coherent[c] = n
            report.setdefault("coherent", []).append(c)
            return False
        coherent.pop(c, None)
        return True

    # In waves: every oversized cluster of a wave is split in one native call (the 2-means
    # fits side by side on all cores), its still oversized parts form the next wave.
    wave = [c for c in ids.tolist() if cut(c)]
    while wave:
        parts = idx.split_many(wave, seed=0)
        now = dict(zip(idx.cluster_ids().tolist(), idx.cluster_sizes().tolist()))
        report["split"].extend(wave)
        for cid, pair in zip(wave, parts):
            for c in pair:
                if c != cid:
                    new.append((c, "split"))
                touched.add(c)
        size = now
        # A part as big as the whole means 2-means found no cut (identical vectors): splitting
        # it again would loop forever, so it stays oversized.
        wave = [c for cid, pair in zip(wave, parts) for c in pair if now[c] < sum(now[x] for x in pair) and cut(c)]
    return touched


def _merge(state: StoreState, keep: int, absorb: int, stray: set[int]) -> None:
    """Merge cluster ``absorb`` into ``keep``; the rows that held ``absorb`` as a secondary
    membership go to ``stray`` (their assignment records are redone)."""
    stray.update(state.index.secondary_members(absorb).tolist())
    state.index.merge(keep, absorb)


def _merge_redundant(state: StoreState, report: dict, now: float, fresh: set[int] = frozenset(),
                     touched_now: set[int] = frozenset(), stray: set[int] | None = None) -> set[int]:
    """Merge near-duplicate centres, then clusters that make one coherent group with their
    nearest neighbour (``_merge_coherent``), then tiny clusters into their nearest surviving
    neighbour: those that have already had a chance to grow (they survived the previous
    organisation) and those this pass created (``fresh``: SLM topics, split parts, cold-start
    clusters), which every memory was just assigned against."""
    idx, cfg = state.index, state.config
    stray = set() if stray is None else stray
    touched: set[int] = set()
    gone: set[int] = set()
    max_size = cfg.cluster_sizes_for(len(state))[1]
    size = dict(zip(idx.cluster_ids().tolist(), idx.cluster_sizes().tolist()))
    for a, b, _sim in idx.merge_candidates(threshold=cfg.merge_threshold):
        # Never merge into something split would cut again: the two would fight forever.
        if a in gone or b in gone or size[a] + size[b] > max_size:
            continue
        size[a] += size.pop(b)
        _merge(state, a, b, stray)
        gone.add(b)
        touched.add(a)
        report["merged"].append((a, b))
    if cfg.coherence < 1:
        _merge_coherent(state, report, (set(fresh) | set(touched_now) | touched) - gone, size, gone, touched, stray)
    last = state.catalog.meta("last_organized")
    old = state.catalog.clusters_created_before(float(last) if last else now) | set(fresh)
    ids, sizes = idx.cluster_ids(), idx.cluster_sizes()
    if len(ids) > 2 and old:
        tiny = (sizes < cfg.min_cluster_size) & np.isin(ids, np.fromiter(old, np.int64, len(old)))
        if tiny.any() and not tiny.all():
            for target, cid in fold_tiny(state, ids[tiny], ids[~tiny], stray):
                gone.add(cid)
                touched.add(target)
                report["merged"].append((target, cid))
    return touched - gone


def fold_targets(state: StoreState, tiny: np.ndarray, rest: np.ndarray) -> list[tuple[int, int]]:
    """(target, tiny cluster) pairs: each cluster of ``tiny`` with the cluster of ``rest``
    whose centre is most similar to its own (one native product against the centre matrix in
    place; none where no cluster of ``rest`` has a centre)."""
    targets, _ = state.index.nearest_among(tiny, rest)
    return [(t, c) for c, t in zip(tiny.tolist(), targets.tolist()) if t >= 0]


def fold_tiny(state: StoreState, tiny: np.ndarray, rest: np.ndarray, stray: set[int]) -> list[tuple[int, int]]:
    """Merge every cluster of ``tiny`` into its nearest cluster of ``rest`` (``fold_targets``),
    all in one index update: tiny clusters never receive each other, so the order of the
    merges is irrelevant. The rows that held a folded cluster as a secondary go to ``stray``.
    Returns the (target, tiny cluster) pairs merged."""
    pairs = fold_targets(state, tiny, rest)
    for _, cid in pairs:
        stray.update(state.index.secondary_members(cid).tolist())
    state.index.merge_many(pairs)
    return pairs


def _merge_coherent(state: StoreState, report: dict, todo: set[int], size: dict[int, int], gone: set[int],
                    touched: set[int], stray: set[int]) -> None:
    """Merge each cluster of ``todo`` with its nearest neighbour while the two are one coherent
    group (``cohesion`` >= ``StoreConfig.coherence``, together at most ``COHERENT_CAP`` times the
    size cap): the pieces a cold start or the size cap cut one group of vectors into grow back
    into one cluster. Only clusters this pass created or touched are looked at (one
    neighbour search of their centres, then their members' vectors), so a periodic pass costs
    little; ``size``, ``gone``, ``touched`` and ``stray`` are updated."""
    idx, cfg = state.index, state.config
    cap = COHERENT_CAP * cfg.cluster_sizes_for(len(state))[1]
    todo = sorted(c for c in todo if c in size and c not in gone)
    if len(todo) == 0 or len(size) < 3:
        return
    ids = idx.cluster_ids()
    at = {c: i for i, c in enumerate(ids.tolist())}
    centres = idx.centres()
    got_ids, got_scores = idx.soft_assign(centres[[at[c] for c in todo]], k=2)
    for c, near, score in zip(todo, got_ids.tolist(), got_scores.tolist()):
        # The nearest centre other than its own.
        other = [(n, sc) for n, sc in zip(near, score) if n != c and n >= 0]
        if not other or c in gone:
            continue
        n, sim = other[0]
        # Pieces of one group lie close: their centres' cosine is far above what separate
        # topics reach, so most pairs need no look at their members.
        if n in gone or sim < cfg.coherence * 0.8 or size[c] + size[n] > cap:
            continue
        if cohesion(state, idx.members(c), idx.members(n)) < cfg.coherence:
            continue
        keep, absorb = (c, n) if size[c] >= size[n] else (n, c)
        size[keep] += size.pop(absorb)
        _merge(state, keep, absorb, stray)
        gone.add(absorb)
        touched.add(keep)
        state.coherent.pop(absorb, None)
        report["merged"].append((keep, absorb))


def reassign(state: StoreState, rows: np.ndarray) -> int:
    """Recompute the soft assignment of ``rows`` against the current centres (index and
    assignment records)."""
    if len(rows) == 0:
        return 0
    idx, cfg = state.index, state.config
    vectors = idx.vectors()
    # In chunks: a split wave can re-assign most of a large store at once, and one gather of
    # every row's vector would hold a copy of the whole vector file in memory.
    for lo in range(0, len(rows), REASSIGN_CHUNK):
        part = rows[lo:lo + REASSIGN_CHUNK]
        ids, scores = idx.soft_assign(vectors[part], k=cfg.soft_k)
        idx.assign(part, routing.memberships(ids, scores, cfg.soft_k, cfg.spill_margin))
        state.assignments.write(part, ids, scores)
    return len(rows)


def reassign_near(state: StoreState, cids: set[int]) -> int:
    """Re-assign the primary members of clusters ``cids`` (after a split, merge or drift)
    among each cluster's ``NEAR_CENTRES`` nearest centres instead of every centre. A member
    whose best nearby centre is still below the new-cluster threshold (it belongs somewhere
    else entirely) is re-assigned against every centre, as ``reassign`` does."""
    idx, cfg = state.index, state.config
    ids = idx.cluster_ids()
    want = np.fromiter(cids, np.int64, len(cids)) if cids else np.zeros(0, np.int64)
    want = np.sort(want[np.isin(want, ids)])
    if len(want) == 0:
        return 0
    if len(ids) <= NEAR_CENTRES:  # every centre is near: the exact path costs the same
        return reassign(state, np.concatenate([idx.members(c) for c in want.tolist()]))
    # soft_k columns, padded by the core where fewer centres are near.
    rows, got_ids, got_scores = idx.near_assign(want, NEAR_CENTRES, cfg.soft_k)
    if len(rows) == 0:
        return 0
    vectors = idx.vectors()
    threshold = cfg.slm.new_cluster_threshold
    far = np.flatnonzero(got_scores[:, 0] < threshold) if threshold is not None else np.zeros(0, np.int64)
    if len(far):
        got_ids[far], got_scores[far] = _soft_assign_padded(state, vectors[rows[far]])
    # One index update for the wave, in cluster order (each touched member list is rebuilt once).
    idx.assign(rows, routing.memberships(got_ids, got_scores, cfg.soft_k, cfg.spill_margin))
    state.assignments.write(rows, got_ids, got_scores)
    return len(rows)


def _soft_assign_padded(state: StoreState, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``soft_assign`` against every centre, padded to ``soft_k`` columns."""
    k = state.config.soft_k
    out_ids = np.full((len(vectors), k), -1, np.int64)
    out_scores = np.full((len(vectors), k), -np.inf, np.float32)
    got_ids, got_scores = state.index.soft_assign(vectors, k=k)
    out_ids[:, : got_ids.shape[1]] = got_ids
    out_scores[:, : got_scores.shape[1]] = got_scores
    return out_ids, out_scores


def sync_clusters(state: StoreState, now: float) -> None:
    """Make the clusters table list exactly the index's clusters."""
    live = set(state.index.cluster_ids().tolist())
    known = state.catalog.cluster_ids()
    gone = known - live
    state.catalog.drop_clusters(gone)
    for c in gone:
        state.profiles.pop(c, None)
    add_clusters(state, [(c, "recovered") for c in sorted(live - known)], now)


# -- evolution ----------------------------------------------------------------------------
def cluster_neighbours(state: StoreState, row: int, n: int) -> list[tuple[int, str]]:
    """(memory id, text) of the ``n`` members of ``row``'s cluster most similar to it."""
    idx = state.index
    cid = int(idx.cluster_of(np.asarray([row]))[0])
    if cid < 0:
        return []
    members = idx.members(cid)
    members = members[(members != row) & state.rows.live[members]]
    if len(members) == 0:
        return []
    sims = idx.vectors()[members] @ idx.vectors()[row]
    top = members[np.argsort(-sims, kind="stable")[:n]]
    mids = state.rows.memory_id[top].tolist()
    texts = state.catalog.texts(mids)
    return [(m, texts[m]) for m in mids if m in texts]


def update_candidate(state: StoreState, row: int, least: float) -> tuple[int, str] | None:
    """(memory id, text) of the older live memory of ``row``'s namespace, in its cluster, most
    similar to it, if at least ``least`` alike and not a copy; else None. Call under a lock."""
    idx, rows = state.index, state.rows
    cid = int(idx.cluster_of(np.asarray([row]))[0])
    if cid < 0:
        return None
    members = np.concatenate([idx.members(cid), idx.secondary_members(cid)])
    own = int(rows.memory_id[row])
    keep = (rows.live[members] & (rows.namespace[members] == rows.namespace[row])
            & (rows.memory_id[members] < own) & (rows.memory_id[members] >= 0))
    members = np.unique(members[keep])
    if len(members) == 0:
        return None
    sims = idx.vectors()[members] @ idx.vectors()[row]
    sims[sims >= 0.995] = -1.0  # the same words again is a repeat, not an update
    best = int(np.argmax(sims))
    if sims[best] < least:
        return None
    mid = int(rows.memory_id[members[best]])
    text = state.catalog.texts([mid]).get(mid)
    return None if text is None else (mid, text)


def apply_superseded(state: StoreState, pairs: list[tuple[int, int]]) -> None:
    """(older memory id, newer memory id): the newer updates the older (database, then the
    row table). Pairs whose memories died meanwhile are skipped. Call under the write lock."""
    rows = state.rows
    live = []
    for old, new in pairs:
        at_old, at_new = state.catalog.row_of(old), state.catalog.row_of(new)
        if at_old is not None and at_new is not None and at_old[1] == at_new[1] == LIVE:
            live.append((old, new, at_old[0], at_new[0]))
    if not live:
        return
    with state.catalog.transaction():
        state.catalog.set_superseded([(old, new) for old, new, _, _ in live])
    for old, new, old_row, new_row in live:
        rows.superseded_by[old_row] = new
        rows.successor_rows[new] = new_row
    rows.touch(np.asarray([o for _, _, o, _ in live], np.int64))
    state.cache.clear()


def apply_evolution(state: StoreState, memory_id: int, links: list[int], tags: list[str]) -> None:
    meta = state.catalog.tag_memory(memory_id, links, tags, time.time())
    if meta is not None:
        at = state.catalog.row_of(memory_id)
        if at is not None:
            state.fields.set([at[0]], [meta])  # the tags are a metadata field filters see
    state.cache.clear()


# -- profiles -----------------------------------------------------------------------------
def example_ids(state: StoreState, cid: int, n: int, centre: np.ndarray) -> list[int]:
    """Memory ids of the ``n`` members nearest the cluster's ``centre`` (the most typical
    ones). The caller passes the centre: fetching all centres per cluster would make
    profiling every cluster quadratic in the cluster count."""
    members = state.index.members(cid)
    if len(members) == 0:
        return []
    sims = state.index.vectors()[members] @ centre
    top = members[np.argsort(-sims, kind="stable")[:n]]
    return [m for m in state.rows.memory_id[top].tolist() if m >= 0]


def save_profiles(state: StoreState, profiles: dict[int, tuple[str, list[str]]], now: float,
                  unprofiled: set[int] = frozenset(), sizes_then: dict[int, int] | None = None) -> None:
    """Write profiles; ``unprofiled`` ones are marked for the next SLM pass (size 0).
    ``sizes_then``: the cluster sizes the profiles were computed at (recorded, so a cluster
    that grew while the SLM was answering is profiled again); default: the sizes now."""
    _, sizes = state.cluster_table()
    if sizes_then is not None:
        sizes = {c: sizes_then.get(c, n) for c, n in sizes.items()}
    items = [(c, s, list(t), 0 if c in unprofiled else sizes[c]) for c, (s, t) in profiles.items() if c in sizes]
    state.catalog.write_profiles(items, now)
    for c, s, t, _ in items:
        state.profiles[c] = (s, t)
    state.cache.clear()


def clusters_needing_profiles(state: StoreState, drift_share: float) -> list[int]:
    """Clusters without a profile, or whose membership grew by ``drift_share`` since their
    profile was written (inertia: small changes keep the old profile)."""
    _, sizes = state.cluster_table()
    out = []
    for cid, summary, profiled, source in state.catalog.profile_states():
        size = sizes.get(cid, 0)
        if size == 0 or source == "template":
            continue
        # Inertia: a profile is rewritten when membership moved by drift_share of its size
        # and by at least 3 memories (small clusters would otherwise churn on every join).
        if profiled == 0 or not summary or abs(size - profiled) >= max(3.0, drift_share * profiled):
            out.append(cid)
    return out
