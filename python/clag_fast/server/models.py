"""Request and response bodies of the JSON API (pydantic models: they validate requests and
write the OpenAPI document). Field names follow ``MemoryStore``'s arguments."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# NaN and infinity are refused here (Python's json module reads the non-standard literals).
Finite = Annotated[float, Field(allow_inf_nan=False)]
Vector = Annotated[list[Finite], Field(min_length=1, description="the memory's embedding (the store's dim)")]
Namespace = Annotated[str, Field(min_length=1, max_length=256)]
Key = Annotated[str, Field(min_length=1, max_length=512, description="user-chosen id, unique in its namespace")]
Name = Annotated[str, Field(min_length=1, max_length=512)]
Filter = Annotated[dict[str, Any], Field(description="metadata filter (Mongo-like: $eq $ne $gt $gte $lt $lte $in $nin $and $or)")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not ignored


# -- writing ---------------------------------------------------------------------------------
class NewMemory(_Body):
    """One memory to add: its text, and optionally its vector (else the service embeds it)."""

    text: str = Field(min_length=1)
    vector: Vector | None = None
    namespace: Namespace = "default"
    kind: Annotated[str, Field(min_length=1, max_length=64)] = "user_input"
    metadata: dict[str, Any] | None = None
    key: Key | None = None
    thread: Name | None = Field(default=None, description="the conversation it belongs to in its namespace")
    turn: Finite | None = Field(default=None, description="its place in the thread (default: insertion order)")
    speaker: Name | None = Field(default=None, description="who said or wrote it")
    supersedes: int | None = Field(default=None, ge=0, description="the id of an older memory it updates")


class NewMemories(_Body):
    """A batch of memories, added atomically (all or none). ``namespace``: one namespace for
    every item (which then names none of its own)."""

    items: list[NewMemory] = Field(min_length=1)
    namespace: Namespace | None = None


class AddResult(BaseModel):
    ids: list[int]


class MemoryPatch(_Body):
    """A change to one memory: new text (re-embedded and re-routed, or with its vector), new metadata."""

    text: str | None = Field(default=None, min_length=1)
    metadata: dict[str, Any] | None = None
    vector: Vector | None = None


class IdsRequest(_Body):
    """Memories by id, or by key within one namespace."""

    ids: list[int] | None = None
    keys: list[Key] | None = None
    namespace: Namespace = "default"


class DeleteResult(BaseModel):
    deleted: int


# -- searching -------------------------------------------------------------------------------
class _SearchOptions(_Body):
    k: int = Field(default=5, ge=1)
    namespace: Namespace | None = None
    kind: str | None = None
    since: Finite | None = None
    until: Finite | None = None
    mode: Literal["two_stage", "flat"] = "two_stage"
    n_probe: int | None = Field(default=None, ge=1, le=100_000)
    lexical_weight: float | None = Field(default=None, ge=0, le=1)
    where: Filter | None = None
    as_of: Finite | None = Field(default=None, ge=0, description="answer as of this time (seconds since the epoch)")
    context: int = Field(default=0, ge=0, le=16, description="neighbouring turns each hit carries, each side")


class SearchRequest(_SearchOptions):
    """One query: a text (hybrid: vectors + BM25) or a vector."""

    query: str | None = Field(default=None, min_length=1)
    vector: Vector | None = None


class SearchBatchRequest(_SearchOptions):
    """Several queries with the same options: texts or vectors."""

    queries: list[Annotated[str, Field(min_length=1)]] | None = None
    vectors: list[Vector] | None = None


class TurnOut(BaseModel):
    memory_id: int
    offset: int
    text: str
    speaker: str | None = None


class HitOut(BaseModel):
    memory_id: int
    text: str
    score: float
    cluster_id: int | None
    cluster_summary: str
    cluster_tags: list[str]
    kind: str
    namespace: str
    created_at: float
    metadata: dict[str, Any] | None
    key: str | None = None
    superseded_by: int | None = None
    context: list[TurnOut] = []


class HitsOut(BaseModel):
    hits: list[HitOut]
    scanned: int
    candidates: int
    clusters_probed: list[int]
    mode: str
    latency_s: float
    cached: bool


class SearchBatchResult(BaseModel):
    results: list[HitsOut]


# -- reading ---------------------------------------------------------------------------------
class MemoryOut(BaseModel):
    memory_id: int
    text: str
    kind: str
    namespace: str
    metadata: dict[str, Any] | None
    created_at: float
    last_accessed: float | None
    access_count: int
    strength: float
    archived: bool
    clusters: list[tuple[int, float]]
    key: str | None = None
    thread: str | None = None
    turn: float | None = None
    speaker: str | None = None
    superseded_by: int | None = None


class MemoriesOut(BaseModel):
    items: list[MemoryOut]


class MemoryPageOut(BaseModel):
    items: list[MemoryOut]
    next_cursor: str | None


class ClusterOut(BaseModel):
    id: int
    summary: str
    tags: list[str]
    size: int
    source: str
    created_at: float
    updated_at: float


class ClustersOut(BaseModel):
    clusters: list[ClusterOut]


class ClusterPageOut(BaseModel):
    """A cluster with one page of its members (pass ``next_cursor`` back for the next)."""

    cluster: ClusterOut
    members: list[MemoryOut]
    next_cursor: str | None


class ForgottenOut(BaseModel):
    forgotten: int


class MergeRequest(_Body):
    """Merge cluster ``other`` into the cluster of the path (which keeps its profile)."""

    other: int


class MoveRequest(_Body):
    """Move the path cluster's members (all, those of ``namespace``, or ``memory_ids``) to ``to``."""

    to: int
    memory_ids: list[int] | None = None
    namespace: Namespace | None = None


class MovedOut(BaseModel):
    moved: int


class OrganizeRequest(_Body):
    task_context: str | None = Field(default=None, max_length=4096)


class ForgetRequest(_Body):
    now: Finite | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """Every error answer: a stable code and a message for people."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "starting"]
    store: str
    embedder: str
    slm: str
    auth: str
