"""The cluster map: a store's centres drawn in 2-D (``clag-fast demo``, ``clag-fast clusters
--plot``). Reads the store through its public methods only (``cluster_centres``,
``clusters``); needs matplotlib.

Every cluster is a disc at its centre's position on the centres' first two principal
components, its area proportional to its members, its colour saying what kind of label it has.
Labels are placed so that none overlaps another (``place_labels``): the biggest clusters' first,
each at the nearest free spot around its disc, with a thin line back to the disc when it had to
move away.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["plot_cluster_map", "draw_cluster_map", "place_labels"]

# Label kinds and their colours (the legend says what they mean).
_KINDS = {
    "topic": ("#4C72B0", "topic label"),
    "slm_topic": ("#DD8452", "topic the SLM proposed for the task"),
    "misc": ("#B0B0B0", "misc: small talk, short replies, mixed notes"),
    "none": ("#FFFFFF", "no label yet"),
}
LABEL_CHARS = 40
# Rings around its disc where a label also keeps clear of the other discs; beyond them it only
# keeps clear of the other labels.
NEAR_RINGS = 8


def _kind(summary: str, source: str) -> str:
    if not summary:
        return "none"
    if summary.startswith("misc:"):
        return "misc"
    return "slm_topic" if source == "slm_topic" else "topic"


def place_labels(anchors: np.ndarray, boxes: np.ndarray, bounds: tuple[float, float, float, float],
                 clear: Sequence[float] | None = None, pad: float = 2.0) -> list[tuple[float, float] | None]:
    """Centres for label boxes such that no two overlap, in the order given (earlier labels
    get the spots nearest their anchors).

    ``anchors``: (n, 2) points the labels belong to; ``boxes``: (n, 2) widths and heights;
    ``bounds``: (x0, y0, x1, y1) every box stays inside; ``clear``: per anchor a radius (its
    disc) that a label's box should not cover, except its own anchor's when placed on it. Each
    label tries its anchor itself, then rings of growing radius around it (16 directions per
    ring): near its anchor (``NEAR_RINGS`` rings) keeping clear of the other discs too, then
    anywhere, keeping clear of the other labels only. None for a label no free spot fits (a box
    bigger than the bounds, or no room left).
    """
    anchors = np.asarray(anchors, np.float64).reshape(-1, 2)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 2)
    if len(anchors) != len(boxes):
        raise ValueError(f"{len(anchors)} anchors but {len(boxes)} boxes")
    x0, y0, x1, y1 = bounds
    clear_r = np.zeros(len(anchors)) if clear is None else np.asarray(clear, np.float64)
    placed = np.zeros((0, 4))
    out: list[tuple[float, float] | None] = []
    reach = math.hypot(x1 - x0, y1 - y0)
    order = (0, 8, 4, 12, 2, 6, 10, 14, 1, 3, 5, 7, 9, 11, 13, 15)  # right, left, up, down, diagonals...
    cos = np.cos(np.array(order) * math.pi / 8)
    sin = np.sin(np.array(order) * math.pi / 8)

    def first_fit(i: int, cx: np.ndarray, cy: np.ndarray, avoid_discs: bool) -> int | None:
        """Index of the first candidate centre (cx[k], cy[k]) where box ``i`` fits."""
        w, h = boxes[i]
        bx0, by0, bx1, by1 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
        ok = (bx0 >= x0) & (by0 >= y0) & (bx1 <= x1) & (by1 <= y1)
        if len(placed):
            hit = ((bx0[:, None] < placed[None, :, 2] + pad) & (placed[None, :, 0] < bx1[:, None] + pad)
                   & (by0[:, None] < placed[None, :, 3] + pad) & (placed[None, :, 1] < by1[:, None] + pad))
            ok &= ~hit.any(axis=1)
        if avoid_discs and ok.any():
            # The nearest point of each box to each other disc's centre must lie outside it.
            dx = np.maximum(np.maximum(bx0[:, None] - anchors[None, :, 0], 0), anchors[None, :, 0] - bx1[:, None])
            dy = np.maximum(np.maximum(by0[:, None] - anchors[None, :, 1], 0), anchors[None, :, 1] - by1[:, None])
            inside = np.hypot(dx, dy) < clear_r[None, :]
            inside[:, i] = False
            ok &= ~inside.any(axis=1)
        hits = np.flatnonzero(ok)
        return int(hits[0]) if len(hits) else None

    for i, (ax, ay) in enumerate(anchors):
        w, h = boxes[i]
        step = max(h, 4.0)
        spot = None
        for avoid_discs, limit in ((True, NEAR_RINGS), (False, None)):
            if first_fit(i, np.array([ax]), np.array([ay]), avoid_discs) is not None:
                spot = (float(ax), float(ay))
                break
            r, rings = clear_r[i] + h / 2 + pad, 0
            while spot is None and r < reach and (limit is None or rings < limit):
                # Along the ring; sideways moves clear a wide box's own half-width.
                cx = ax + cos * (r + w / 2 * np.abs(cos))
                cy = ay + sin * r
                k = first_fit(i, cx, cy, avoid_discs)
                if k is not None:
                    spot = (float(cx[k]), float(cy[k]))
                r += step
                rings += 1
            if spot is not None:
                break
        if spot is not None:
            placed = np.vstack([placed, [spot[0] - w / 2, spot[1] - h / 2, spot[0] + w / 2, spot[1] + h / 2]])
        out.append(spot)
    return out


def draw_cluster_map(store, title: str | None = None):
    """The cluster map of ``store`` as a matplotlib Figure (``plot_cluster_map`` saves it).
    Needs matplotlib (ImportError naming it otherwise)."""
    return _draw(store, title)[0]


def _draw(store, title: str | None = None):
    """(the Figure, how many clusters it shows)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never a window, works without a display
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the cluster map needs matplotlib: pip install matplotlib") from e
    ids, centres = store.cluster_centres()
    info = {c.id: c for c in store.clusters()}
    keep = [i for i, c in enumerate(ids.tolist()) if c in info]
    # Biggest first: they are drawn first and their labels take the nearest spots.
    keep.sort(key=lambda i: (-info[int(ids[i])].size, int(ids[i])))
    fig = plt.figure(figsize=(13, 9.5), dpi=100)
    ax = fig.add_axes((0.02, 0.02, 0.96, 0.86))  # fixed: label placement works in its pixels
    ax.set_xticks([])
    ax.set_yticks([])
    n_members = sum(info[int(ids[i])].size for i in keep)
    fig.suptitle(title or f"{len(keep)} clusters of {n_members} memories", x=0.02, y=0.975, ha="left",
                 fontsize=13, weight="bold")
    ax.set_title("Each disc is a cluster: placed by the first two principal components of the cluster centres "
                 "(PCA; the axes have no units,\nnearby discs hold similar memories), its area grows with its "
                 "members, its colour says what kind of label it has (legend).", fontsize=9.5, loc="left")
    if not keep:
        return fig, 0
    x = centres[keep].astype(np.float64)
    x = x - x.mean(axis=0)
    if len(keep) >= 2:
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        xy = x @ vt[:2].T
        if xy.shape[1] < 2:
            xy = np.hstack([xy, np.zeros((len(xy), 1))])
    else:
        xy = np.zeros((1, 2))
    sizes = np.array([info[int(ids[i])].size for i in keep], np.float64)
    area = 40 + 900 * sizes / max(1.0, sizes.max())  # points^2
    kinds = [_kind(info[int(ids[i])].summary, info[int(ids[i])].source) for i in keep]
    span = np.ptp(xy, axis=0)
    span[span == 0] = 1.0
    lo, hi = xy.min(axis=0) - 0.12 * span, xy.max(axis=0) + 0.12 * span
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.scatter(xy[:, 0], xy[:, 1], s=area, c=[_KINDS[k][0] for k in kinds], alpha=0.55, edgecolors="0.25",
               linewidths=0.6, zorder=2)
    # Label boxes measured in pixels, placed, then drawn at their spots.
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    anchors = to_px(xy)
    radius_px = np.sqrt(area / math.pi) * fig.dpi / 72.0
    texts, boxes, fonts = [], [], []
    for j, i in enumerate(keep):
        c = info[int(ids[i])]
        text = c.summary or "(no label)"
        text = text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"
        font = 7.0 + 2.0 * sizes[j] / max(1.0, sizes.max())
        probe = ax.text(0, 0, text, fontsize=font)
        bb = probe.get_window_extent(renderer)
        probe.remove()
        texts.append(text)
        fonts.append(font)
        boxes.append((bb.width + 4, bb.height + 2))
    axb = ax.get_window_extent(renderer)
    spots = place_labels(anchors, np.array(boxes), (axb.x0, axb.y0, axb.x1, axb.y1), clear=radius_px * 0.9)
    inv = ax.transData.inverted()
    for j, spot in enumerate(spots):
        if spot is None:
            continue
        tx, ty = inv.transform(spot)
        ax.text(tx, ty, texts[j], fontsize=fonts[j], ha="center", va="center", zorder=3)
        if math.dist(spot, anchors[j]) > radius_px[j] * 0.9:
            # A thin line from the disc to the nearest point of the label's box.
            w, h = boxes[j]
            end = np.clip(anchors[j], (spot[0] - w / 2, spot[1] - h / 2), (spot[0] + w / 2, spot[1] + h / 2))
            (ex, ey), (px, py) = inv.transform(end), xy[j]
            ax.plot([px, ex], [py, ey], color="0.45", lw=0.5, zorder=1)
    shown = [k for k in _KINDS if k in kinds]
    ax.legend(handles=[Line2D([], [], marker="o", ls="", markersize=9, markerfacecolor=_KINDS[k][0],
                              markeredgecolor="0.25", alpha=0.7, label=_KINDS[k][1]) for k in shown],
              loc="lower right", fontsize=8, framealpha=0.85, title="label kind", title_fontsize=8)
    return fig, len(keep)


def plot_cluster_map(store, path) -> int:
    """Draw ``store``'s cluster map to ``path`` (PNG): the centres projected to 2-D (their
    first two principal components), each a disc sized by its members, coloured by its kind of
    label and labelled with its summary, no two labels overlapping. Returns how many clusters
    were drawn. Needs matplotlib (ImportError naming it otherwise)."""
    fig, n = _draw(store)
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path)
    finally:
        plt.close(fig)
    return n
