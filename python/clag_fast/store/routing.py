"""Vector routing: turn top-K centre similarities into cluster memberships.

Pure numpy on the (n, K) arrays that ``VectorIndex.soft_assign`` returns, so the policy is
testable without an index.
"""

from __future__ import annotations

import numpy as np


def memberships(ids: np.ndarray, scores: np.ndarray, soft_k: int, spill_margin: float) -> np.ndarray:
    """The (n, soft_k) membership matrix for ``VectorIndex.assign``.

    Column 0 is the best cluster (the primary, which moves that centre). A lower-ranked
    cluster becomes a secondary membership only when its similarity is within ``spill_margin``
    of the best: memories on a border are then found from either side, while the rest are
    listed once, so stage 2 does not scan every memory ``soft_k`` times.
    """
    k = min(soft_k, ids.shape[1])
    out = np.full((ids.shape[0], soft_k), -1, dtype=np.int64)
    out[:, :k] = ids[:, :k]
    if k > 1:
        far = scores[:, 1:k] < (scores[:, :1] - spill_margin)
        out[:, 1:k][far] = -1
    out[ids[:, :k] < 0] = -1  # padding from a store with fewer clusters than k
    return out


def affinity_rows(ids: np.ndarray, scores: np.ndarray, soft_k: int) -> list[list[tuple[int, float]]]:
    """Per memory, its top ``soft_k`` (cluster id, affinity) pairs for the assignments table."""
    k = min(soft_k, ids.shape[1])
    out = []
    for row_ids, row_scores in zip(ids[:, :k].tolist(), scores[:, :k].tolist()):
        out.append([(c, s) for c, s in zip(row_ids, row_scores) if c >= 0])
    return out


def choose_k(n_rows: int, target_cluster_size: int) -> int:
    """Cold-start cluster count: about ``target_cluster_size`` memories per cluster, at least 2."""
    return int(max(2, min(n_rows // 2, round(n_rows / target_cluster_size))))


def within_room(leaders: np.ndarray, room: int) -> np.ndarray:
    """Mask of the rows whose leader is among the first ``room`` leaders (in row order): the
    clusters that may open. The others keep their nearest existing cluster."""
    first = np.unique(leaders)[:room]
    return np.isin(leaders, first)


def leaders(vectors: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Greedy leader clustering of rows that open new clusters: row i joins the most similar
    earlier leader when that similarity is at least ``threshold``, else leads a cluster of its
    own. Returns (leader index per row, similarity to it; 1.0 for leaders).

    One (m x m) matrix product, then a pass that only indexes it. A row no earlier row reaches
    the threshold with leads whatever the earlier rows decided, so only the rows some earlier
    row is close to go through the loop, in order (each sees every earlier row's decision): far
    apart rows (isotropic vectors, where nearly every row opens a cluster) cost no Python step.
    """
    m = len(vectors)
    sims = vectors @ vectors.T
    lead = np.arange(m, dtype=np.int64)
    aff = np.ones(m, np.float32)
    close = np.tril(sims >= threshold, k=-1).any(axis=1)
    is_leader = ~close
    for i in np.flatnonzero(close).tolist():
        earlier = np.flatnonzero(is_leader[:i])
        cand = sims[i, earlier]
        if len(cand) and cand.max() >= threshold:
            j = int(earlier[int(np.argmax(cand))])
            lead[i], aff[i] = lead[j], cand.max()
        else:
            is_leader[i] = True
    return lead, aff
