"""Which shard owns a namespace, and how memory and cluster ids name their shard.

The map lives in ``ROOT/cluster.json`` beside the shard directories (``ROOT/shards/0003/``):
the number of shards, the store settings every shard is created with, and an explicit table
of pinned namespaces (large tenants given a shard of their own). Every other namespace goes
to ``blake2b(namespace) mod shards``: a hash that is the same in every process and on every
machine (Python's ``hash()`` is salted per process), so front doors started at different
times, or after a restart, route a namespace to the same shard without asking anyone.

Ids: every shard numbers its memories and clusters from 1 on its own, so the ids the API
hands out carry the shard in their top bits (``shard << 40 | local id``): 4,096 shards of a
trillion memories each, all below 2**52 (exact in a JavaScript number).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clag_fast._deprecated import renamed_fields, renamed_kwargs

ID_BITS = 40
MAX_SHARDS = 1 << 12
_LOCAL_MASK = (1 << ID_BITS) - 1
MAP_FILE = "cluster.json"
_VERSION = 1


def encode_id(shard: int, local: int) -> int:
    """The API's id for a shard's local memory (or cluster) id."""
    if local > _LOCAL_MASK:
        raise ValueError(f"local id {local} does not fit in {ID_BITS} bits")
    return (shard << ID_BITS) | local


def decode_id(global_id: int) -> tuple[int, int]:
    """(shard, local id) of an id the API handed out."""
    if isinstance(global_id, bool) or not isinstance(global_id, int) or global_id < 0:
        raise ValueError(f"memory ids are non-negative integers, got {global_id!r}")
    return global_id >> ID_BITS, global_id & _LOCAL_MASK


def hash_shard(namespace: str, shards: int) -> int:
    """The shard a namespace hashes to (stable across processes, machines and versions)."""
    digest = hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


@renamed_fields(llm="slm")
@dataclass(frozen=True)
class ShardMap:
    """The persisted layout of a sharded store (``ROOT/cluster.json``).

    shards: number of shards (fixed at creation: changing it would move every hashed
      namespace; grow by pinning namespaces to new shards instead, see docs/SCALING.md).
    dim, embedder, slm: how every shard's store is opened (``slm``: "off", "managed" or a
      server URL; ``llm`` is its deprecated spelling).
    pins: namespace -> shard, overriding the hash.
    """

    root: Path
    shards: int
    dim: int = 384
    embedder: bool = True
    slm: str = "off"
    pins: dict[str, int] = field(default_factory=dict)

    # -- routing ---------------------------------------------------------------------------
    def shard_of(self, namespace: str) -> int:
        """The shard that owns ``namespace``."""
        pinned = self.pins.get(namespace)
        return pinned if pinned is not None else hash_shard(namespace, self.shards)

    def shard_dir(self, shard: int) -> Path:
        """The store directory of a shard (self-contained: moving a shard is copying it)."""
        return self.root / "shards" / f"{shard:04d}"

    def existing_shards(self) -> list[int]:
        """Shards whose store has been created (a read never creates one)."""
        return [s for s in range(self.shards) if (self.shard_dir(s) / "memories.db").exists()]

    @property
    def cluster_name(self) -> str:
        """A name for this sharded store, unique per root directory (prefix of actor names)."""
        return hashlib.blake2b(str(self.root.resolve()).encode(), digest_size=6).hexdigest()

    # -- persistence -----------------------------------------------------------------------
    @classmethod
    @renamed_kwargs(llm="slm")
    def create_or_load(cls, root: str | os.PathLike[str], shards: int | None = None, *, dim: int | None = None,
                       embedder: bool | None = None, slm: str | None = None) -> "ShardMap":
        """Load ``ROOT/cluster.json``, or create it with these settings when it is missing.

        Two processes creating the same root race safely: the file is written aside and
        linked into place, so exactly one layout wins and the other process loads it. Settings
        given that differ from a stored layout are an error naming them (never a silent
        re-route of existing namespaces)."""
        root = Path(root)
        path = root / MAP_FILE
        if not path.exists():
            if shards is None:
                raise FileNotFoundError(f"no sharded store at {root} (no {MAP_FILE}); give shards= to create one")
            if not 1 <= shards <= MAX_SHARDS:
                raise ValueError(f"shards must be between 1 and {MAX_SHARDS}, got {shards}")
            root.mkdir(parents=True, exist_ok=True)
            new = cls(root, shards, dim=dim or 384, embedder=True if embedder is None else embedder, slm=slm or "off")
            # unique per writer: threads of one process (two front doors in one server) race too
            tmp = root / f".{MAP_FILE}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
            tmp.write_text(json.dumps(new.document(), indent=1))
            try:
                os.link(tmp, path)  # atomic, and fails if another process got there first
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        loaded = cls.load(root)
        asked = {"shards": shards, "dim": dim, "embedder": embedder, "slm": slm}
        wrong = [f"{k}={v!r} (stored: {getattr(loaded, k)!r})" for k, v in asked.items()
                 if v is not None and v != getattr(loaded, k)]
        if wrong:
            raise ValueError(f"{root} is a sharded store with other settings: {', '.join(wrong)}")
        return loaded

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> "ShardMap":
        """Read ``ROOT/cluster.json``."""
        root = Path(root)
        try:
            doc = json.loads((root / MAP_FILE).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no sharded store at {root} (no {MAP_FILE})") from None
        if doc.get("version") != _VERSION:
            from clag_fast.errors import StoreFormatError

            raise StoreFormatError(f"{root / MAP_FILE} has version {doc.get('version')!r}; this clag_fast reads {_VERSION}")
        return cls(root, int(doc["shards"]), dim=int(doc["dim"]), embedder=bool(doc["embedder"]),
                   slm=str(doc["slm"] if "slm" in doc else doc["llm"]),  # older layout files spell it "llm"
                   pins={str(k): int(v) for k, v in doc.get("pins", {}).items()})

    def pin(self, namespace: str, shard: int) -> "ShardMap":
        """Give ``namespace`` to ``shard`` explicitly and persist it (read-modify-write under
        a file lock, so concurrent pins do not lose each other). Only for a namespace that
        holds no memories yet: the caller checks that (``ShardedStore.pin``)."""
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard must be between 0 and {self.shards - 1}, got {shard}")
        with open(self.root / f".{MAP_FILE}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = ShardMap.load(self.root)
            pins = dict(current.pins, **{namespace: shard})
            updated = ShardMap(self.root, current.shards, current.dim, current.embedder, current.slm, pins)
            tmp = self.root / f".{MAP_FILE}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
            tmp.write_text(json.dumps(updated.document(), indent=1))
            os.replace(tmp, self.root / MAP_FILE)
        return updated

    def document(self) -> dict[str, Any]:
        """The JSON document written to ROOT/cluster.json."""
        return {"version": _VERSION, "shards": self.shards, "dim": self.dim, "embedder": self.embedder,
                "slm": self.slm, "pins": self.pins, "hash": "blake2b-64 mod shards"}
