"""Old spellings kept working for one release: renamed keyword arguments and renamed keys of
returned dicts. Each use warns with a ``DeprecationWarning`` naming the new spelling.

The language model is spelled ``slm`` everywhere (``MemoryStore.open(slm=...)``,
``stats()["slm_usage"]``); ``llm`` is the old spelling of the same thing.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

if TYPE_CHECKING:
    import argparse

F = TypeVar("F", bound=Callable[..., Any])

#: The old key of each renamed ``stats()`` key.
STATS_RENAMES = {"llm": "slm_usage", "llm_calls_per_memory": "slm_calls_per_memory"}


def warn_renamed(old: str, new: str, where: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` is the deprecated spelling of ``new`` in ``where``."""
    warnings.warn(f"{where}: {old!r} is deprecated and will be removed in the next release; use {new!r}",
                  DeprecationWarning, stacklevel=stacklevel + 1)


def renamed_kwargs(**renames: str) -> Callable[[F], F]:
    """Decorator: accept each ``old=`` keyword as the deprecated spelling of ``renames[old]``.

    ``@renamed_kwargs(llm="slm")`` lets ``f(llm=x)`` behave as ``f(slm=x)`` with a
    DeprecationWarning; giving both spellings is a TypeError (which one was meant is unknown).
    """

    def decorate(func: F) -> F:
        where = func.__qualname__.replace(".__init__", "")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where}() got both {new}= and its deprecated spelling {old}=; "
                                        f"give {new}= only")
                    warn_renamed(f"{old}=", f"{new}=", f"{where}()", stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_option(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Add ``old`` (say ``--llm``) to ``parser`` as a hidden spelling of the option ``new``
    (added with its default dest): it sets the same value and prints a deprecation note to
    stderr."""
    import argparse  # only the command lines need it, not ``import clag_fast``

    dest = new.lstrip("-").replace("-", "_")  # argparse's dest for a long option

    class _Alias(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            print(f"{parser.prog}: {old} is deprecated and will be removed in the next release; use {new}",
                  file=sys.stderr)
            setattr(namespace, dest, values)

    parser.add_argument(old, dest=dest, action=_Alias, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def renamed_fields(**renames: str) -> Callable[[type], type]:
    """Class decorator (over ``@dataclass`` too): ``Cls(old=...)`` and ``obj.old`` keep
    working, with a DeprecationWarning, for each attribute ``renames[old]``."""

    def decorate(cls: type) -> type:
        cls.__init__ = renamed_kwargs(**renames)(cls.__init__)  # type: ignore[misc]
        for old, new in renames.items():
            setattr(cls, old, property(_old_field(cls.__name__, old, new), doc=f"Deprecated spelling of ``{new}``."))
        return cls

    return decorate


def _old_field(owner: str, old: str, new: str) -> Callable[[Any], Any]:
    def read(self: Any) -> Any:
        warn_renamed(f".{old}", f".{new}", owner, stacklevel=2)
        return getattr(self, new)

    return read


class RenamedKeys(dict):
    """A plain dict holding the new keys only (so ``json.dumps``, ``==`` and iteration see the
    new names), that still answers a read of an old key, with a DeprecationWarning.

    renames: old key -> new key. where: what returned the dict, for the warning.
    """

    def __init__(self, data: Mapping[str, Any], renames: Mapping[str, str], where: str) -> None:
        super().__init__(data)
        self._renames = dict(renames)
        self._where = where

    def _new(self, key: Any) -> Any:
        new = self._renames.get(key) if isinstance(key, str) else None
        if new is None or dict.__contains__(self, key):
            return None
        warn_renamed(key, new, self._where, stacklevel=3)
        return new

    def __missing__(self, key: Any) -> Any:
        new = self._new(key)
        if new is None:
            raise KeyError(key)
        return self[new]

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        new = self._new(key)
        return dict.get(self, new, default) if new is not None else default

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        new = self._new(key)
        return new is not None and dict.__contains__(self, new)

    def __reduce__(self) -> Any:
        # Pickles (and copies) as a plain dict: the old names are a reading aid, not data.
        return (dict, (dict(self),))
