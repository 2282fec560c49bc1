"""Argument conventions shared by every store-shaped API (``MemoryStore``, ``ShardedStore``,
``Client``, ``AsyncClient``), so each spells and checks them the same way."""

from __future__ import annotations

from typing import Sequence


def batch_namespaces(namespace: str | None, namespaces: Sequence[str] | str | None) -> Sequence[str] | str | None:
    """The namespaces of an ``add_many`` batch: ``namespace=`` (one for the whole batch, as
    ``add`` spells it) or ``namespaces=`` (one per item, or one string for all); both given is
    a ValueError, neither is None (the default namespace)."""
    if namespace is None:
        return namespaces
    if namespaces is not None:
        raise ValueError("give namespace= (the whole batch) or namespaces= (one per item), not both")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"namespace must be a non-empty string, got {namespace!r}")
    return namespace
