"""How a store keeps its clusters in shape: routing new rows, organisation (cold start,
topics, split, merge), forgetting, and recovery after a crash.

Functions here take the store and run under its write lock; they touch the index and the
database together and keep them in agreement. SLM calls never happen under the lock: the
store's ``SLMSide`` asks the SLM first and applies the answers here.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from clag_fast import routing, schema

if TYPE_CHECKING:
    from clag_fast.store import MemoryStore

log = logging.getLogger("clag_fast.store")


@dataclass
class Placement:
    """Where a batch of new rows went."""

    affinities: list[list[tuple[int, float]]]
    new_clusters: list[tuple[int, str]] = field(default_factory=list)  # (cluster id, source)
    opened_rows: set[int] = field(default_factory=set)  # batch indices placed in new clusters
    candidates: np.ndarray | None = None  # (n, route_candidates) cluster ids, for the SLM
    scores: np.ndarray | None = None


# -- routing ------------------------------------------------------------------------------
def route_new_rows(store: "MemoryStore", rows: np.ndarray, vectors: np.ndarray) -> Placement:
    """Assign fresh rows by vectors: nearest clusters (soft, top ``soft_k``), or a new cluster
    when even the nearest is below the new-cluster threshold. Before the cold start (no
    clusters yet) rows stay unassigned and search runs flat."""
    idx, cfg = store._index, store.config
    n = len(rows)
    if len(idx.cluster_ids()) == 0:
        return Placement(affinities=[[] for _ in range(n)])
    k = max(cfg.soft_k, store._slm.route_candidates)
    ids, scores = idx.soft_assign(vectors, k=k)
    members = routing.memberships(ids, scores, cfg.soft_k, cfg.spill_margin)
    affinities = routing.affinity_rows(ids, scores, cfg.soft_k)
    placement = Placement(affinities, candidates=ids, scores=scores)
    threshold = store._slm.new_cluster_threshold
    if cfg.labels is None and threshold is not None:
        opened: list[tuple[int, np.ndarray]] = []  # clusters opened by this batch
        for i in np.flatnonzero(scores[:, 0] < threshold).tolist():
            v = vectors[i]
            sims = [float(c_vec @ v) for _, c_vec in opened]
            if sims and max(sims) >= threshold:
                cid = opened[int(np.argmax(sims))][0]
                aff = max(sims)
            else:
                cid = idx.new_cluster()
                opened.append((cid, v))
                placement.new_clusters.append((cid, "route"))
                aff = 1.0
            members[i] = -1
            members[i, 0] = cid
            affinities[i] = [(cid, aff)]
            placement.opened_rows.add(i)
    store._counters["routed_new"] += len(placement.opened_rows)
    store._counters["routed_vector"] += n - len(placement.opened_rows)
    idx.assign(rows, members)
    return placement


def move_rows(store: "MemoryStore", memory_ids: list[int], rows: np.ndarray, targets: list[int]) -> None:
    """Apply the SLM's routing choices: make ``targets[i]`` the primary cluster of a row."""
    idx = store._index
    known = set(idx.cluster_ids().tolist())
    keep = [i for i, t in enumerate(targets) if t in known]
    if not keep:
        return
    rows = rows[keep]
    memory_ids = [memory_ids[i] for i in keep]
    targets = [targets[i] for i in keep]
    vecs = idx.vectors()[rows]
    centres = dict(zip(idx.cluster_ids().tolist(), idx.centres()))
    affinities = [[(t, float(centres[t] @ v))] for t, v in zip(targets, vecs)]
    idx.assign(rows, np.asarray(targets, np.int64))
    with schema.transaction(store._db):
        store._db.executemany("DELETE FROM assignments WHERE memory_id=?", [(m,) for m in memory_ids])
        write_assignments(store, memory_ids, affinities)


def record_placement(store: "MemoryStore", memory_ids: list[int], texts: list[str],
                     placement: Placement, now: float) -> None:
    """Inside the caller's transaction: save the clusters a batch opened and the memories'
    assignments. A new cluster is labelled by its first memory until the next profile pass
    (SLM or vector) rewrites it, so no hit is ever returned unlabelled."""
    first_text: dict[int, str] = {}
    for t, aff in zip(texts, placement.affinities):
        if aff:
            first_text.setdefault(aff[0][0], t)
    provisional = {c: vector_profile([first_text[c]]) for c, _ in placement.new_clusters}
    save_new_clusters(store, placement.new_clusters, now, provisional)
    store._db.executemany("DELETE FROM assignments WHERE memory_id=?", [(m,) for m in memory_ids])
    write_assignments(store, memory_ids, placement.affinities)


def write_assignments(store: "MemoryStore", memory_ids: list[int], affinities: list[list[tuple[int, float]]]) -> None:
    store._db.executemany(
        "INSERT OR REPLACE INTO assignments (memory_id, rank, cluster_id, affinity) VALUES (?, ?, ?, ?)",
        [(m, r, c, a) for m, pairs in zip(memory_ids, affinities) for r, (c, a) in enumerate(pairs)],
    )


def save_new_clusters(store: "MemoryStore", clusters: list[tuple[int, str]], now: float,
                      profiles: dict[int, tuple[str, list[str]]] | None = None) -> None:
    profiles = profiles or {}
    store._db.executemany(
        "INSERT OR REPLACE INTO clusters (id, summary, tags, source, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
        [(c, profiles.get(c, ("", []))[0], json.dumps(profiles.get(c, ("", []))[1]), src, now, now)
         for c, src in clusters],
    )
    for c, _ in clusters:
        store._profiles[c] = profiles.get(c, ("", []))


# -- organisation -------------------------------------------------------------------------
def organize(store: "MemoryStore", *, task_context: str | None = None, reason: str = "explicit",
             topics: list[str] | None = None, topic_vectors: np.ndarray | None = None) -> dict[str, Any]:
    """Restructure the clusters. ``topics``/``topic_vectors`` are SLM-proposed (or template)
    topic descriptions already embedded by the caller (outside the lock)."""
    idx, cfg = store._index, store.config
    t0 = time.perf_counter()
    live = store._rows.live_rows()
    report: dict[str, Any] = {"reason": reason, "memories": int(len(live)), "kmeans_k": 0,
                              "topics": [], "split": [], "merged": [], "reassigned": 0}
    now = time.time()
    new: list[tuple[int, str]] = []
    profiles: dict[int, tuple[str, list[str]]] = {}
    enough = len(live) >= (2 if reason == "explicit" else cfg.min_memories_to_cluster)
    if topics and topic_vectors is not None and len(topic_vectors):
        for text, vec in zip(topics, topic_vectors):
            cid = idx.new_cluster(centre=vec, weight=cfg.topic_weight)
            new.append((cid, "slm_topic"))
            profiles[cid] = (text, [])
            report["topics"].append(text)
        report["reassigned"] = _reassign(store, live)
    elif len(idx.cluster_ids()) == 0 and enough and cfg.labels is None:
        k = routing.choose_k(len(live), cfg.cluster_sizes_for(len(live))[0])
        for cid in idx.kmeans(k, rows=live, seed=0).tolist():
            new.append((cid, "kmeans"))
        report["kmeans_k"] = k
        report["reassigned"] = _reassign(store, live)
    elif len(idx.cluster_ids()) > 0:
        unassigned = live[idx.cluster_of(live) < 0]
        if len(unassigned):
            report["reassigned"] = _reassign(store, unassigned)
    if len(idx.cluster_ids()) > 0 and cfg.labels is None:
        touched = _split_oversized(store, report, new)
        touched |= _merge_redundant(store, report, now)
        if touched:
            rows = np.concatenate([idx.members(c) for c in touched if c in set(idx.cluster_ids().tolist())] or
                                  [np.empty(0, np.int64)])
            _reassign(store, rows)
    # A topic no memory is nearest to would only waste probes: drop it (and any other
    # cluster left empty), except template labels, which exist by definition.
    templates = {c for (c,) in store._db.execute("SELECT id FROM clusters WHERE source='template'")}
    templates |= {c for c, src in new if src == "template"}
    for cid, size in zip(idx.cluster_ids().tolist(), idx.cluster_sizes().tolist()):
        if size == 0 and cid not in templates:
            idx.drop_cluster(cid)
            report.setdefault("dropped_empty", []).append(cid)
    new = [(c, src) for c, src in new if c in set(idx.cluster_ids().tolist())]
    with schema.transaction(store._db):
        save_new_clusters(store, new, now, profiles)
        _sync_clusters(store, now)
    idx.flush()
    store._counters["organizations"] += 1
    store._cache.clear()
    report["clusters"] = int(len(idx.cluster_ids()))
    report["seconds"] = round(time.perf_counter() - t0, 4)
    log.info("organised (%s): %s", reason, report)
    return report


def create_label_clusters(store: "MemoryStore", labels: list[str], vectors: np.ndarray) -> list[int]:
    """Templated-labels mode: one anchored cluster per label; existing rows are re-routed."""
    idx, cfg = store._index, store.config
    now = time.time()
    new = [(idx.new_cluster(centre=v, weight=max(cfg.topic_weight, 1.0)), "template") for v in vectors]
    profiles = {cid: (label, []) for (cid, _), label in zip(new, labels)}
    with schema.transaction(store._db):
        save_new_clusters(store, new, now, profiles)
        store._db.executemany("UPDATE clusters SET profiled_size=1 WHERE id=?", [(c,) for c, _ in new])
    _reassign(store, store._rows.live_rows())
    idx.flush()
    return [c for c, _ in new]


def _split_oversized(store: "MemoryStore", report: dict, new: list) -> set[int]:
    idx, cfg = store._index, store.config
    touched: set[int] = set()
    max_size = cfg.cluster_sizes_for(len(store))[1]
    queue = [c for c, s in zip(idx.cluster_ids().tolist(), idx.cluster_sizes().tolist()) if s > max_size]
    while queue:
        cid = queue.pop()
        a, b = idx.split(cid, seed=0)
        report["split"].append(cid)
        for c in (a, b):
            if c != cid:
                new.append((c, "split"))
            touched.add(c)
            if len(idx.members(c)) > max_size:
                queue.append(c)
    return touched


def _merge_redundant(store: "MemoryStore", report: dict, now: float) -> set[int]:
    """Merge near-duplicate centres, then tiny clusters that have already had a chance to grow
    (they survived the previous organisation) into their nearest neighbour."""
    idx, cfg = store._index, store.config
    touched: set[int] = set()
    gone: set[int] = set()
    max_size = cfg.cluster_sizes_for(len(store))[1]
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
    last = store._db.execute("SELECT value FROM meta WHERE key='last_organized'").fetchone()
    last_t = float(last[0]) if last else now
    old = {c for (c,) in store._db.execute("SELECT id FROM clusters WHERE created_at < ? AND source != 'template'", (last_t,))}
    ids = idx.cluster_ids()
    if len(ids) > 2:
        sizes = idx.cluster_sizes()
        centres = idx.centres()
        for i in np.argsort(sizes, kind="stable").tolist():
            cid = int(ids[i])
            if sizes[i] >= cfg.min_cluster_size or cid not in old or cid in gone:
                continue
            sims = centres @ centres[i]
            sims[i] = -np.inf
            for g in gone:
                sims[ids == g] = -np.inf
            target = int(ids[int(np.argmax(sims))])
            idx.merge(target, cid)
            gone.add(cid)
            touched.add(target)
            report["merged"].append((target, cid))
    store._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_organized', ?)", (repr(now),))
    return touched - gone


def _reassign(store: "MemoryStore", rows: np.ndarray) -> int:
    """Recompute the soft assignment of ``rows`` against the current centres (index + db)."""
    if len(rows) == 0:
        return 0
    idx, cfg = store._index, store.config
    ids, scores = idx.soft_assign(idx.vectors()[rows], k=cfg.soft_k)
    idx.assign(rows, routing.memberships(ids, scores, cfg.soft_k, cfg.spill_margin))
    mids = store._rows.memory_id[rows].tolist()
    with schema.transaction(store._db):
        store._db.executemany("DELETE FROM assignments WHERE memory_id=?", [(m,) for m in mids])
        write_assignments(store, mids, routing.affinity_rows(ids, scores, cfg.soft_k))
    return len(rows)


def _sync_clusters(store: "MemoryStore", now: float) -> None:
    """Make the clusters table list exactly the index's clusters."""
    live = set(store._index.cluster_ids().tolist())
    known = {c for (c,) in store._db.execute("SELECT id FROM clusters WHERE archived=0")}
    gone = known - live
    store._db.executemany("DELETE FROM clusters WHERE id=?", [(c,) for c in gone])
    store._db.executemany("DELETE FROM assignments WHERE cluster_id=?", [(c,) for c in gone])
    for c in gone:
        store._profiles.pop(c, None)
    save_new_clusters(store, [(c, "recovered") for c in live - known], now)


# -- evolution ----------------------------------------------------------------------------
def cluster_neighbours(store: "MemoryStore", row: int, n: int) -> list[tuple[int, str]]:
    """(memory id, text) of the ``n`` members of ``row``'s cluster most similar to it."""
    idx = store._index
    cid = int(idx.cluster_of(np.asarray([row]))[0])
    if cid < 0:
        return []
    members = idx.members(cid)
    members = members[(members != row) & store._rows.live[members]]
    if len(members) == 0:
        return []
    sims = idx.vectors()[members] @ idx.vectors()[row]
    top = members[np.argsort(-sims, kind="stable")[:n]]
    mids = store._rows.memory_id[top].tolist()
    texts = store._details(mids)
    return [(m, texts[m][0]) for m in mids if m in texts]


def apply_evolution(store: "MemoryStore", memory_id: int, links: list[int], tags: list[str]) -> None:
    """Write the SLM's links (``related``, both directions) and the memory's tags (in its
    metadata under ``tags``) in one transaction; memories deleted meanwhile are skipped."""
    now = time.time()
    with schema.transaction(store._db):
        row = store._db.execute("SELECT metadata FROM memories WHERE id=?", (memory_id,)).fetchone()
        if row is None:
            return
        live = {m for (m,) in store._db.execute(
            f"SELECT id FROM memories WHERE id IN ({','.join('?' * len(links))})", links)} if links else set()
        store._db.executemany(
            "INSERT OR IGNORE INTO links (src, dst, relation, created_at) VALUES (?, ?, 'related', ?)",
            [(a, b, now) for m in links if m in live for a, b in ((memory_id, m), (m, memory_id))],
        )
        if tags:
            meta = json.loads(row[0]) if row[0] else {}
            if not isinstance(meta, dict):
                meta = {"value": meta}
            meta["tags"] = tags
            store._db.execute("UPDATE memories SET metadata=? WHERE id=?", (json.dumps(meta, ensure_ascii=False), memory_id))
    store._cache.clear()


# -- profiles -----------------------------------------------------------------------------
def cluster_examples(store: "MemoryStore", cid: int, n: int, centre: np.ndarray) -> list[str]:
    """Texts of the ``n`` members nearest the cluster's ``centre`` (the most typical ones).
    The caller passes the centre: fetching all centres per cluster would make profiling
    every cluster quadratic in the cluster count."""
    idx = store._index
    members = idx.members(cid)
    if len(members) == 0:
        return []
    sims = idx.vectors()[members] @ centre
    top = members[np.argsort(-sims, kind="stable")[:n]]
    mids = [m for m in store._rows.memory_id[top].tolist() if m >= 0]
    if not mids:
        return []
    texts = store._details(mids)
    return [texts[m][0] for m in mids if m in texts]


def vector_profile(texts: list[str]) -> tuple[str, list[str]]:
    """A profile without an SLM: the most typical member as summary, frequent words as tags."""
    from clag_fast.organizer import keywords

    if not texts:
        return "", []
    summary = texts[0] if len(texts[0]) <= 120 else texts[0][:117] + "..."
    return summary, keywords(texts, 3)


def save_profiles(store: "MemoryStore", profiles: dict[int, tuple[str, list[str]]], now: float,
                  unprofiled: set[int] = frozenset()) -> None:
    live = set(store._index.cluster_ids().tolist())
    sizes = dict(zip(store._index.cluster_ids().tolist(), store._index.cluster_sizes().tolist()))
    items = [(s, json.dumps(t), now, 0 if c in unprofiled else sizes.get(c, 0), c)
             for c, (s, t) in profiles.items() if c in live]
    with schema.transaction(store._db):
        store._db.executemany(
            "UPDATE clusters SET summary=?, tags=?, updated_at=?, profiled_size=? WHERE id=?", items)
    for c, p in profiles.items():
        if c in live:
            store._profiles[c] = p
    store._cache.clear()


def clusters_needing_profiles(store: "MemoryStore", drift_share: float) -> list[int]:
    """Clusters without a profile, or whose membership grew by ``drift_share`` since their
    profile was written (inertia: small changes keep the old profile)."""
    sizes = dict(zip(store._index.cluster_ids().tolist(), store._index.cluster_sizes().tolist()))
    out = []
    for cid, summary, profiled, source in store._db.execute(
        "SELECT id, summary, profiled_size, source FROM clusters WHERE archived=0"
    ):
        size = sizes.get(cid, 0)
        if size == 0 or source == "template":
            continue
        # Inertia: a profile is rewritten when membership moved by drift_share of its size
        # and by at least 3 memories (small clusters would otherwise churn on every join).
        if profiled == 0 or not summary or abs(size - profiled) >= max(3.0, drift_share * profiled):
            out.append(cid)
    return out


# -- forgetting ---------------------------------------------------------------------------
def forget(store: "MemoryStore", now: float) -> dict[str, Any]:
    store._flush_access()  # decay must see the latest accesses
    policy = store.config.forgetting
    rows = store._rows
    report = {"pruned": 0, "action": policy.prune_action, "archived_clusters": []}
    if policy.active:
        weights = rows.weights(policy, now)
        victims = np.flatnonzero(rows.live[: rows.n] & policy.prune_mask(weights))
        if len(victims):
            _retire(store, victims, policy.prune_action)
            report["pruned"] = int(len(victims))
    if policy.archive_clusters_after_days is not None:
        stale = [c for c, last, created in store._db.execute(
            "SELECT id, last_hit_at, created_at FROM clusters WHERE archived=0")
            if policy.cluster_is_stale(now, last, created)]
        for cid in stale:
            members = store._index.members(cid)
            members = members[store._rows.live[members]]
            _retire(store, members, "archive")
            if len(store._index.members(cid)) == 0:
                store._index.drop_cluster(cid)
            report["archived_clusters"].append(cid)
        with schema.transaction(store._db):
            store._db.executemany("UPDATE clusters SET archived=1 WHERE id=?", [(c,) for c in stale])
    store._index.flush()
    return report


def _retire(store: "MemoryStore", rows: np.ndarray, action: str) -> None:
    mids = store._rows.memory_id[rows].tolist()
    if action == "delete":
        store._delete_rows(mids, rows)
        return
    with schema.transaction(store._db):
        store._db.executemany("UPDATE memories SET state=? WHERE id=?", [(schema.ARCHIVED, m) for m in mids])
    store._index.unassign(rows)
    store._rows.kill(rows)
    store._cache.clear()


# -- recovery -----------------------------------------------------------------------------
def reconcile(store: "MemoryStore") -> dict[str, int]:
    """After open: make the index's cluster state and the database agree.

    The cluster state on disk is the last one saved (organisation, flush, close); memories
    added after it are unassigned in the index, and clusters opened after it are unknown to
    it. Unknown clusters are dropped from the database, rows the index does not place are
    routed again, and rows the database no longer holds are removed from the clusters.
    """
    idx = store._index
    rows = store._rows
    live = rows.live_rows()
    now = time.time()
    with schema.transaction(store._db):
        _sync_clusters(store, now)
    fixed = {"rerouted": 0, "unassigned": 0}
    n_idx = len(idx)
    if n_idx:
        placed = idx.cluster_of(np.arange(n_idx, dtype=np.int64))
        dead = np.flatnonzero((placed >= 0) & ~rows.live[:n_idx])
        if len(dead):
            idx.unassign(dead)
            fixed["unassigned"] = int(len(dead))
        if len(idx.cluster_ids()):
            lost = live[placed[live] < 0]
            if len(lost):
                fixed["rerouted"] = _reassign(store, lost)
        elif len(live):
            # No clusters in the index: every stored assignment is stale.
            store._db.execute("DELETE FROM assignments")
    if fixed["rerouted"] or fixed["unassigned"]:
        idx.flush()
        log.warning("recovered %s: %s", store.path, fixed)
    return fixed
