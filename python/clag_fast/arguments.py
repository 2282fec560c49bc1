"""Argument conventions shared by every store-shaped API (``MemoryStore``, ``ShardedStore``,
``Client``, ``AsyncClient``), so each spells and checks them the same way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Sequence

import numpy as np


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


#: Longest thread or speaker name, in characters.
MAX_NAME_CHARS = 512


@dataclass(frozen=True)
class Conversation:
    """Per memory of a batch: thread, turn, speaker (None: not given) and the id of the older
    memory it supersedes (None: none). A field is None when no memory of the batch gives it."""

    threads: list[str | None] | None = None
    turns: list[float | None] | None = None
    speakers: list[str | None] | None = None
    supersedes: list[int | None] | None = None

    def columns(self, at: Sequence[int] | None = None) -> dict[str, list[Any]]:
        """The catalog's columns (``catalog.CONVERSATION``) of the items ``at`` (all: None)."""
        out = {}
        for name, values in (("thread", self.threads), ("turn", self.turns), ("speaker", self.speakers)):
            if values is not None:
                out[name] = list(values) if at is None else [values[i] for i in at]
        return out

    def take(self, at: Sequence[int]) -> "Conversation":
        """The items ``at`` of the batch."""
        pick = (lambda v: None if v is None else [v[i] for i in at])
        return Conversation(pick(self.threads), pick(self.turns), pick(self.speakers), pick(self.supersedes))


NONE = Conversation()


def check_conversation(n: int, *, thread: Any = None, threads: Any = None, turns: Any = None, speaker: Any = None,
          speakers: Any = None, supersedes: Any = None) -> Conversation:
    """The conversation arguments of a batch of ``n`` memories, checked: ``thread``/``speaker``
    for the whole batch or ``threads``/``speakers`` per item (not both), ``turns`` and
    ``supersedes`` per item. A ValueError or TypeError names the field and the position."""
    return Conversation(
        _names(n, thread, threads, "thread"),
        _turns(n, turns),
        _names(n, speaker, speakers, "speaker"),
        _ids(n, supersedes),
    )


def _per_item(values: Any, n: int, field: str) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray):
        raise TypeError(f"{field} must be a list with one item per text, got {type(values).__name__}")
    out = list(values)
    if len(out) != n:
        raise ValueError(f"{field} has {len(out)} items for {n} texts")
    return out


def _names(n: int, one: Any, many: Any, field: str) -> list[str | None] | None:
    if one is not None and many is not None:
        raise ValueError(f"give {field}= (the whole batch) or {field}s= (per item), not both")
    if one is not None:
        _check_name(one, field)
        return [one] * n
    if many is None:
        return None
    out = _per_item(many, n, f"{field}s")
    for i, v in enumerate(out):
        if v is not None:
            _check_name(v, f"{field}s[{i}]")
    return out if any(v is not None for v in out) else None


def _check_name(value: Any, field: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{field} is empty")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{field} has {len(value)} characters, more than {MAX_NAME_CHARS}")
    if "\x00" in value or "\x1f" in value:
        raise ValueError(f"{field} contains a control character (NUL or unit separator)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{field} is not valid unicode ({e.reason})") from None


def _turns(n: int, turns: Any) -> list[float | None] | None:
    if turns is None:
        return None
    out = _per_item(turns, n, "turns")
    for i, v in enumerate(out):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, Real):
            raise TypeError(f"turns[{i}] must be a number, got {type(v).__name__}")
        if not math.isfinite(float(v)):
            raise ValueError(f"turns[{i}] must be finite, got {v!r}")
        out[i] = float(v)
    return out if any(v is not None for v in out) else None


def _ids(n: int, supersedes: Any) -> list[int | None] | None:
    if supersedes is None:
        return None
    out = _per_item(supersedes, n, "supersedes")
    for i, v in enumerate(out):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"supersedes[{i}] must be a memory id (int), got {type(v).__name__}")
        out[i] = int(v)
    return out if any(v is not None for v in out) else None
