"""The cluster map: a store's centres drawn in 2-D (``clag-fast demo``, ``clag-fast clusters
--plot``). Reads the store through its public methods only (``cluster_centres``,
``clusters``); needs matplotlib."""

from __future__ import annotations

import numpy as np

__all__ = ["plot_cluster_map"]


def plot_cluster_map(store, path) -> int:
    """Draw ``store``'s cluster map to ``path`` (PNG): the centres projected to 2-D (their
    first two principal components), each a disc sized by its members and labelled with its
    summary. Returns how many clusters were drawn. Needs matplotlib (ImportError naming it
    otherwise)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never a window, works without a display
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the cluster map needs matplotlib: pip install matplotlib") from e
    ids, centres = store.cluster_centres()
    info = {c.id: c for c in store.clusters()}
    keep = [i for i, c in enumerate(ids.tolist()) if c in info]
    fig, ax = plt.subplots(figsize=(12, 9), dpi=100)
    if keep:
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
        ax.scatter(xy[:, 0], xy[:, 1], s=30 + 600 * sizes / max(1.0, sizes.max()), alpha=0.35,
                   c=np.arange(len(keep)) % 10, cmap="tab10", edgecolors="k", linewidths=0.5)
        for (px, py), i in zip(xy.tolist(), keep):
            c = info[int(ids[i])]
            text = c.summary or "(no label)"
            ax.annotate(text if len(text) <= 40 else text[:39] + "…", (px, py), fontsize=7,
                        ha="center", va="center")
    ax.set_title(f"{len(keep)} clusters: centres in 2-D (PCA), disc area ~ members")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return len(keep)
