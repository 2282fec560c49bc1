"""The width of a store's vectors: fixed at creation by ``StoreConfig(dim=...)`` or by an
embedder that states its width (an integer ``dim`` attribute), else by the first vectors
written.

A store created with neither (``embedder=False``; the default embedder, whose first add may
bring vectors of another model; an embedder that does not state its width) records its width
as pending (meta ``PENDING``). Its index is created at ``PROVISIONAL_DIM`` and, while it holds
no vector row, re-created at the width of the first vectors written (``fix``): brought
1536-d vectors need no ``StoreConfig(dim=1536)``. From then on the width is recorded and
enforced as for any store. While pending, ``store.config.dim`` is None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from clag_fast.config import StoreConfig
from clag_fast.errors import DimensionMismatchError
from clag_fast.store import recovery
from clag_fast.store.assignments import Assignments
from clag_fast.store.catalog import Catalog
from clag_fast.store.state import ASSIGNMENTS, StoreState

#: The index width of a store whose width is pending: the default embedder's (all-MiniLM-L6-v2),
#: so a store that ends up embedding its texts with it is never re-created.
PROVISIONAL_DIM = 384

#: Meta key present (value "1") while the store's width waits for its first vectors.
PENDING = "dim_pending"

#: Meta key of the recorded width.
DIM = "dim"


def stated_width(embedder: Any) -> int | None:
    """The width an embedder states (an integer ``dim`` attribute), or None."""
    width = getattr(embedder, "dim", None) if embedder not in (None, False) else None
    if isinstance(width, (int, np.integer)) and not isinstance(width, bool):
        return int(width)
    return None


def settle(catalog: Catalog, path: Path, config: StoreConfig | None, embedder: Any, embedder_name: str,
           read_only: bool) -> tuple[StoreConfig, int, bool]:
    """(the store's config, its index width, whether the width is pending) at open.

    The config's ``dim`` is recorded at creation and must match after; an embedder stating
    its width must agree with it (and gives a new store its width when the config has none).
    A pending store opened with a width (config or embedder) takes it now: it holds no
    vector yet. Raises ``DimensionMismatchError`` naming both widths."""
    width = stated_width(embedder)
    explicit = config.dim if config is not None else None
    if explicit is not None and width is not None and explicit != width:
        raise DimensionMismatchError(
            f"the embedder {embedder_name!r} makes {width}-dimensional vectors, "
            f"the store {path} holds {explicit}-dimensional ones")
    wanted = explicit if explicit is not None else width
    stored = catalog.meta(DIM)
    base = config or StoreConfig()
    if stored is None:
        if wanted is not None:
            if not read_only:
                catalog.set_meta(DIM, str(wanted))
            return base.replace(dim=wanted), wanted, False
        if not read_only:
            catalog.set_meta(DIM, str(PROVISIONAL_DIM))
            catalog.set_meta(PENDING, "1")
        return base.replace(dim=None), PROVISIONAL_DIM, True
    dim = int(stored)
    if catalog.meta(PENDING) is not None:
        # Fixed by the first vectors, or now by the width asked for (fixed by the caller,
        # which owns the index: ``fix``). A read-only open leaves it pending.
        return base.replace(dim=None), dim, True
    if explicit is not None and explicit != dim:
        raise DimensionMismatchError(f"store {path} holds {dim}-dimensional vectors, config says dim={explicit}")
    if width is not None and width != dim:
        raise DimensionMismatchError(
            f"the embedder {embedder_name!r} makes {width}-dimensional vectors, "
            f"the store {path} holds {dim}-dimensional ones")
    return base.replace(dim=dim), dim, False


def wanted_width(config: StoreConfig | None, embedder: Any) -> int | None:
    """The width an open asks for (the config's, else the embedder's), or None."""
    if config is not None and config.dim is not None:
        return config.dim
    return stated_width(embedder)


def fix(state: StoreState, width: int) -> None:
    """Fix a pending store's width (under the write lock): its empty index is re-created at
    ``width`` when it has another, and the width is recorded. A store holding vector rows is
    refused (its width is theirs)."""
    index = state.index
    if len(index) > 0:
        raise DimensionMismatchError(
            f"store {state.path} holds {index.dim}-dimensional vectors, got {width}-dimensional ones")
    if index.dim != width:
        state.close_index()
        for name in (recovery.VECTORS, recovery.CLUSTERS):
            (state.path / recovery.INDEX_DIR / name).unlink(missing_ok=True)
        state.index = recovery.open_index(state.path, width, False)
        state.assignments = Assignments(state.path / ASSIGNMENTS, state.config.soft_k, False)
    state.catalog.set_meta(DIM, str(width))
    state.catalog.delete_meta(PENDING)
    state.config = state.config.replace(dim=width)


def current(catalog: Catalog, config: StoreConfig) -> tuple[StoreConfig, int, bool]:
    """(config, index width, pending) as the database records them now (a read-only store's
    ``refresh``: the writer may have fixed the width since)."""
    dim = int(catalog.meta(DIM) or PROVISIONAL_DIM)
    pending = catalog.meta(PENDING) is not None
    return config.replace(dim=None if pending else dim), dim, pending
