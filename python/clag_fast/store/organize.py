"""Organisation: cold start, SLM topics and template labels as centres, split of oversized
clusters, merge of redundant and tiny ones, re-assignment, and the vector side of profiles.

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
        touched |= _merge_redundant(state, report, now)
        report["reassigned_touched"] = reassign_near(state, touched)
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


def _split_oversized(state: StoreState, report: dict, new: list) -> set[int]:
    idx = state.index
    touched: set[int] = set()
    max_size = state.config.cluster_sizes_for(len(state))[1]
    ids, sizes = idx.cluster_ids(), idx.cluster_sizes()
    size = dict(zip(ids.tolist(), sizes.tolist()))
    # In waves: every oversized cluster of a wave is split in one native call (the 2-means
    # fits side by side on all cores), its still oversized parts form the next wave.
    wave = ids[sizes > max_size].tolist()
    while wave:
        parts = idx.split_many(wave, seed=0)
        now = dict(zip(idx.cluster_ids().tolist(), idx.cluster_sizes().tolist()))
        report["split"].extend(wave)
        nxt = []
        for cid, pair in zip(wave, parts):
            for c in pair:
                if c != cid:
                    new.append((c, "split"))
                touched.add(c)
                # A part as big as the whole means 2-means found no cut (identical vectors):
                # splitting it again would loop forever, so it stays oversized.
                if max_size < now[c] < size[cid]:
                    nxt.append(c)
        size = now
        wave = nxt
    return touched


def _merge_redundant(state: StoreState, report: dict, now: float) -> set[int]:
    """Merge near-duplicate centres, then tiny clusters that have already had a chance to grow
    (they survived the previous organisation) into their nearest surviving neighbour."""
    idx, cfg = state.index, state.config
    touched: set[int] = set()
    gone: set[int] = set()
    max_size = cfg.cluster_sizes_for(len(state))[1]
    size = dict(zip(idx.cluster_ids().tolist(), idx.cluster_sizes().tolist()))
    for a, b, _sim in idx.merge_candidates(threshold=cfg.merge_threshold):
        # Never merge into something split would cut again: the two would fight forever.
        if a in gone or b in gone or size[a] + size[b] > max_size:
            continue
        size[a] += size.pop(b)
        idx.merge(a, b)
        gone.add(b)
        touched.add(a)
        report["merged"].append((a, b))
    last = state.catalog.meta("last_organized")
    old = state.catalog.clusters_created_before(float(last) if last else now)
    ids, sizes = idx.cluster_ids(), idx.cluster_sizes()
    if len(ids) > 2 and old:
        tiny = (sizes < cfg.min_cluster_size) & np.isin(ids, np.fromiter(old, np.int64, len(old)))
        if tiny.any() and not tiny.all():
            # Every tiny cluster goes to its nearest non-tiny one, all in one matrix product
            # (tiny clusters never receive each other, so the order of merges is irrelevant).
            centres = idx.centres()
            sims = centres[tiny] @ centres.T
            sims[:, tiny] = -np.inf
            targets = ids[np.argmax(sims, axis=1)]
            for cid, target in zip(ids[tiny].tolist(), targets.tolist()):
                idx.merge(target, cid)
                gone.add(cid)
                touched.add(target)
                report["merged"].append((target, cid))
    return touched - gone


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
