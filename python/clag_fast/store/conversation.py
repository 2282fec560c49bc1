"""The conversation arguments of a write applied to the store: the older memories that a
batch's ``supersedes`` names, checked before anything is written. The arguments themselves
(thread, turn, speaker, supersedes) are checked in ``clag_fast.arguments``, as every
store-shaped API checks them."""

from __future__ import annotations

from typing import Sequence

from clag_fast.arguments import NONE, Conversation
from clag_fast.arguments import check_conversation as check
from clag_fast.store import catalog as catalog_mod

__all__ = ["NONE", "Conversation", "check", "check_superseded"]


def check_superseded(catalog: catalog_mod.Catalog, conv: Conversation, namespaces: Sequence[str]) -> dict[int, int]:
    """Item position -> the row of the memory it supersedes; KeyError naming the item when
    that memory does not exist (or is deleted), ValueError when it lives in another namespace."""
    out: dict[int, int] = {}
    if conv.supersedes is None:
        return out
    for i, old in enumerate(conv.supersedes):
        if old is None:
            continue
        found = catalog.row_of(old)
        if found is None or found[1] == catalog_mod.DELETED:
            raise KeyError(f"supersedes[{i}]: no memory with id {old}")
        ns = catalog.namespace_of(old)
        if ns != namespaces[i]:
            raise ValueError(f"supersedes[{i}]: memory {old} is in namespace {ns!r}, not {namespaces[i]!r}")
        out[i] = found[0]
    return out
