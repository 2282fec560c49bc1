"""API keys: who may read and write which namespaces.

The keys file is TOML (read with the standard library's ``tomllib``)::

    [[keys]]
    name = "team-a"                    # shown in logs, never the key itself
    key = "sk-a-0123456789abcdef"      # or key_sha256 = "<hex of sha256(key)>"
    read = ["team-a", "team-a/*"]      # fnmatch patterns; write patterns are readable too
    write = ["team-a"]
    default_namespace = "team-a"       # used when a request names none (default: the first
                                       # read pattern without wildcards)
    admin = false                      # organize / forget / whole-store stats and labels
    expires = 2027-01-01T00:00:00Z     # optional

Keys are compared by SHA-256 digest in constant time, so the file may hold digests only.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import hmac
import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_WILD = set("*?[")


@dataclass(frozen=True)
class Principal:
    """The rights of one request's key."""

    name: str
    read: tuple[str, ...]
    write: tuple[str, ...]
    admin: bool = False
    default_namespace: str | None = None

    @property
    def unrestricted(self) -> bool:
        """Reads every namespace (so store-wide counts and labels reveal nothing new)."""
        return self.admin or "*" in self.read

    def can_read(self, namespace: str) -> bool:
        return self.unrestricted or any(fnmatch.fnmatchcase(namespace, p) for p in self.read)

    def can_write(self, namespace: str) -> bool:
        return self.admin or any(fnmatch.fnmatchcase(namespace, p) for p in self.write)


#: Without a keys file (loopback only): one local user with every right.
LOCAL = Principal("local", ("*",), ("*",), admin=True)


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    principal: Principal
    expires: dt.datetime | None


class KeyRing:
    """The keys of a keys file; ``lookup(key)`` answers the principal or why not."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries

    @classmethod
    def load(cls, path: str | Path) -> "KeyRing":
        """Parse and check a keys file (ValueError naming the entry and field at fault)."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML ({e})") from None
        items = data.get("keys")
        if not isinstance(items, list) or not items:
            raise ValueError(f"{path}: expected one or more [[keys]] tables")
        entries = [_entry(path, i, item) for i, item in enumerate(items)]
        digests = [e.digest for e in entries]
        if len(set(digests)) != len(digests):
            raise ValueError(f"{path}: the same key is listed twice")
        return cls(entries)

    def lookup(self, key: str | None, now: dt.datetime | None = None) -> Principal | str:
        """The principal of ``key``, or a message saying why it is refused."""
        if not key:
            return "missing API key (send 'Authorization: Bearer <key>' or 'X-API-Key: <key>')"
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found = None
        for e in self._entries:  # every entry compared, in constant time each
            if hmac.compare_digest(e.digest, digest):
                found = e
        if found is None:
            return "unknown API key"
        now = now or dt.datetime.now(dt.timezone.utc)
        if found.expires is not None and now >= found.expires:
            return f"API key {found.principal.name!r} expired at {found.expires.isoformat()}"
        return found.principal


def _entry(path: Path, i: int, item: Any) -> _Entry:
    where = f"{path}: keys[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not a table")
    unknown = set(item) - {"name", "key", "key_sha256", "read", "write", "admin", "default_namespace", "expires"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
    if ("key" in item) == ("key_sha256" in item):
        raise ValueError(f"{where}: give exactly one of key / key_sha256")
    if "key" in item:
        if not isinstance(item["key"], str) or len(item["key"]) < 16:
            raise ValueError(f"{where}: key must be a string of at least 16 characters")
        digest = hashlib.sha256(item["key"].encode("utf-8")).digest()
    else:
        try:
            digest = bytes.fromhex(item["key_sha256"])
        except (TypeError, ValueError):
            digest = b""
        if len(digest) != 32:
            raise ValueError(f"{where}: key_sha256 must be 64 hex digits")
    patterns = {}
    for field in ("read", "write"):
        value = item.get(field, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise ValueError(f"{where}: {field} must be a list of namespace patterns")
        patterns[field] = tuple(value)
    admin = item.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}: admin must be true or false")
    read = tuple(dict.fromkeys(patterns["read"] + patterns["write"]))
    if not read and not admin:
        raise ValueError(f"{where}: the key may read nothing (give read = [...] or write = [...])")
    default = item.get("default_namespace")
    if default is None:
        default = next((p for p in read if not _WILD & set(p)), None)
    elif not isinstance(default, str) or not any(fnmatch.fnmatchcase(default, p) for p in read):
        raise ValueError(f"{where}: default_namespace must be a namespace the key may read")
    expires = item.get("expires")
    if expires is not None:
        if isinstance(expires, dt.date) and not isinstance(expires, dt.datetime):
            expires = dt.datetime(expires.year, expires.month, expires.day)
        if not isinstance(expires, dt.datetime):
            raise ValueError(f"{where}: expires must be a TOML date or date-time")
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=dt.timezone.utc)
    name = str(item.get("name", f"key {i}"))
    return _Entry(digest, Principal(name, read, patterns["write"], admin, default), expires)
