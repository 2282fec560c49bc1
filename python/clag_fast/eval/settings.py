"""The settings of an evaluation run: each store's configuration, the retrieval table's rows,
and what every per-sample run shares (``RunSettings``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SEARCH_K", "SearchConfig", "search_configs", "store_config", "RunSettings"]

#: The k of every retrieval metric is fixed: Recall@5, Recall@10, Precision@5, nDCG@10;
#: searches therefore return the top 10.
SEARCH_K = 10


@dataclass(frozen=True)
class SearchConfig:
    """One retrieval configuration of the table."""

    mode: str  # "flat" or "two_stage"
    n_probe: int | None  # two_stage: clusters probed; None = the store's automatic rule
    lexical_weight: float | None  # None = the store's default (hybrid); 0 = vectors only

    @property
    def name(self) -> str:
        kind = "vector" if self.lexical_weight == 0 else "hybrid"
        probe = f"@{self.n_probe or 'auto'}" if self.mode == "two_stage" else ""
        return f"{self.mode}-{kind}{probe}"


def search_configs(n_probe: Sequence[int]) -> list[SearchConfig]:
    """Flat vector and flat hybrid (exact references), two-stage hybrid at every ``n_probe``
    (0 = automatic), and two-stage vector at the automatic n_probe for reference."""
    return ([SearchConfig("flat", None, 0.0), SearchConfig("flat", None, None)]
            + [SearchConfig("two_stage", p or None, None) for p in n_probe]
            + [SearchConfig("two_stage", None, 0.0)])


def store_config(organisation: str, overrides: dict[str, Any] | None):
    """StoreConfig for one organisation: the retrieval cache and the cache of texts' vectors
    are off so that every search is measured, and the SLM is off for the vector-only
    organisation. ``overrides``: StoreConfig fields ("slm.route_batch" sets a field of the
    nested SLMConfig, "ranking.expand" one of the RankingConfig, "ranking" = "plain" ranks by
    the fused score alone); ValueError naming an unknown one."""
    from clag_fast.config import RankingConfig, SLMConfig, StoreConfig

    changes: dict[str, Any] = {"cache_size": 0, "embed_cache": 0}
    slm: dict[str, Any] = {"mode": "auto" if organisation == "slm" else "off"}
    ranking: dict[str, Any] = {}
    base_ranking = RankingConfig()
    for name, value in (overrides or {}).items():
        if name.startswith("slm."):
            slm[name[4:]] = value
        elif name.startswith("ranking."):
            ranking[name[8:]] = value
        elif name == "ranking":
            if value != "plain":
                raise ValueError(f"store option ranking: only 'plain' is a named ranking, got {value!r}")
            base_ranking = RankingConfig.plain()
        else:
            changes[name] = value
    try:
        return StoreConfig(slm=SLMConfig(**slm), ranking=base_ranking.replace(**ranking), **changes)
    except TypeError as exc:  # unknown field name
        raise ValueError(f"store option: {exc}") from None


@dataclass(frozen=True)
class RunSettings:
    """What every per-sample run of one evaluation shares.

    Attributes:
      search_configs: the retrieval table's rows, each question searched once per row.
      qa_modes: search modes whose hits the SLM answers from ("flat", "two_stage").
      url: the SLM server's base URL; None: retrieval only.
      embedder: the shared embedder (label phrases, SLM topics; its ``dim`` sizes the stores).
      store_options: StoreConfig overrides for every store.
      qa_questions: with an SLM, answer only the first N questions of each sample.
    """

    search_configs: tuple[SearchConfig, ...]
    qa_modes: tuple[str, ...]
    url: str | None
    embedder: Any
    store_options: dict[str, Any]
    qa_questions: int | None = None

    def store_config(self, organisation: str):
        """The StoreConfig of one organisation's store: its dimension follows the embedder
        (a store option may still override it)."""
        return store_config(organisation, {"dim": int(self.embedder.dim)} | dict(self.store_options))
