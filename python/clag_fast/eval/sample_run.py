"""One sample under one organisation: build its store, organise it, search every question in
every configuration, answer with the SLM, and record what it cost.

The per-question values go to ``Tallies`` (one ``Tally`` per configuration, summed over the
samples by the runner); ``run_sample`` returns the sample's own record.
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clag_fast.eval.answer import answer_context, ask, is_adversarial, question_prompt, score_answer
from clag_fast.eval.embedders import LookupEmbedder
from clag_fast.eval.endpoint import counts_since, slm_counts
from clag_fast.eval.metrics import answer_containment, ndcg_at_k, precision_at_k, recall_at_k
from clag_fast.eval.settings import SEARCH_K, RunSettings, SearchConfig
from clag_fast.locomo import QAItem, Sample, conversation

__all__ = ["Tally", "Tallies", "SampleInput", "run_sample"]


@dataclass
class Tally:
    """Per-configuration accumulator of per-question values."""

    values: dict[str, list[float]]
    by_cat: dict[str, dict[str, list[float]]]

    @classmethod
    def new(cls) -> "Tally":
        return cls(defaultdict(list), defaultdict(lambda: defaultdict(list)))

    def add(self, cat: str, **vals: float) -> None:
        for name, v in vals.items():
            self.values[name].append(v)
            self.by_cat[cat][name].append(v)


@dataclass
class Tallies:
    """Where the per-question values of every sample go: retrieval and QA tallies by
    configuration name, and ``tick`` once per question answered (a progress bar)."""

    retrieval: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally.new))
    qa: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally.new))
    tick: Callable[[], Any] = lambda: None


@dataclass(frozen=True)
class SampleInput:
    """One sample with its vectors: a row of ``turn_vecs`` per turn, of ``q_vecs`` per
    question, and per question the turn ids its evidence names (``relevant``)."""

    sample: Sample
    turn_vecs: np.ndarray
    q_vecs: np.ndarray
    relevant: list[set[str]]


def run_sample(data: SampleInput, org: str, settings: RunSettings, tallies: Tallies) -> dict:
    """Build, organise and query one store for one sample and one organisation ("vector" or
    "slm"); returns the sample's record."""
    from clag_fast.store import MemoryStore

    store_client = qa_client = None
    if settings.url is not None:
        from clag_fast.slm.client import LLMClient

        # Two clients on one server so that the store's organisation calls and the answer
        # prompts are counted separately.
        qa_client = LLMClient(settings.url)
        store_client = LLMClient(settings.url) if org == "slm" else None
    cfg = settings.store_config(org)
    s = data.sample
    with tempfile.TemporaryDirectory(prefix="clag-eval-") as tmp:
        store = MemoryStore.open(
            tmp, config=cfg,
            # Every vector is passed in: turns as embeddings, questions through the lookup (the
            # question text is still the query, for the lexical half of hybrid search). Both
            # stores fall back to the shared embedder for label phrases (labels/keyphrases ranks
            # them by embedding) and SLM topics (embedded into cluster centres).
            embedder=LookupEmbedder([q.question for q in s.qa], data.q_vecs, fallback=settings.embedder),
            slm=store_client if store_client is not None else False,
        )
        try:
            run = _SampleRun(data, org, settings, tallies, store, store_client, qa_client, qa_np=cfg.n_probe or 0)
            built = run.build()
            asked = run.ask_all()
            after = run.after()
        finally:
            store.close()
    return {
        "sample_id": s.sample_id,
        "organisation": org,
        "memories": len(s.turns),
        "questions": len(s.qa),
        "ingest_s": built["ingest_s"],
        "organize_s": built["organize_s"],
        "organize": built["organize"],
        "cluster_sizes": built["cluster_sizes"],
        "store_slm_ingest": built["store_slm_ingest"],
        "store_slm_search": asked["store_slm_search"],
        "qa_slm": asked["qa_slm"],
        "store_stats": after["store_stats"],
        "organizations_during_search": after["organizations_during_search"],
        "answers": asked["answers"],
    }


@dataclass
class _SampleRun:
    """The steps of one sample's run on its open store."""

    data: SampleInput
    org: str
    settings: RunSettings
    tallies: Tallies
    store: Any
    store_client: Any
    qa_client: Any
    qa_np: int  # the n_probe of two-stage QA searches; 0: the automatic one
    id_to_dia: dict[int, str] = field(default_factory=dict)
    orgs_before: int = 0

    def build(self) -> dict:
        """Ingest every turn (with its vector), then organise."""
        s, store = self.data.sample, self.store
        before = slm_counts(self.store_client)
        t0 = time.perf_counter()
        ids = store.add_many([t.memory_text() for t in s.turns], embeddings=self.data.turn_vecs,
                             kinds=[t.kind for t in s.turns], metadata=[t.metadata() for t in s.turns],
                             **conversation(s.turns))
        ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        # The SLM organisation gets a task context so that it can propose topics (the
        # paper's agent-driven clustering); the vector organisation ignores it anyway.
        organised = store.organize(task_context=_task_context(s) if self.org == "slm" else None)
        organize_s = time.perf_counter() - t0
        self.id_to_dia = {int(mid): t.dia_id for mid, t in zip(ids, s.turns)}
        self.orgs_before = _organizations(store)
        return {"ingest_s": ingest_s, "organize_s": organize_s, "organize": organised,
                "store_slm_ingest": counts_since(slm_counts(self.store_client), before),
                "cluster_sizes": sorted((c.size for c in store.clusters()), reverse=True)}

    def ask_all(self) -> dict:
        """Every question: searched in every configuration, then answered (with an SLM)."""
        s, qa_questions = self.data.sample, self.settings.qa_questions
        answers: list[dict] = []
        before_search = slm_counts(self.store_client)
        before_qa = slm_counts(self.qa_client)
        for qi, (q, rel) in enumerate(zip(s.qa, self.data.relevant)):
            hits_for_qa = self.search(q, rel)
            if self.qa_client is not None and (qa_questions is None or qi < qa_questions):
                answers.extend(self.answer(q, hits_for_qa))
            self.tallies.tick()
        return {"store_slm_search": counts_since(slm_counts(self.store_client), before_search),
                "qa_slm": counts_since(slm_counts(self.qa_client), before_qa), "answers": answers}

    def search(self, q: QAItem, rel: set[str]) -> dict[str, Any]:
        """One question in every search configuration, tallied; returns the hits the answers
        use: the store's default search (hybrid) in each mode."""
        hits_for_qa: dict[str, Any] = {}
        for sc in self.settings.search_configs:
            t0 = time.perf_counter()
            hits = self.store.search(q.question, k=SEARCH_K, mode=sc.mode, n_probe=sc.n_probe,
                                     lexical_weight=sc.lexical_weight)
            # The store's own latency_s stops before its post-search triggers run: this loop
            # repeats each question once per configuration, so a confused question fires the
            # confusion trigger (an organisation) inside a search call, which says nothing
            # about search speed. Wall time is the fallback.
            lat = getattr(hits, "latency_s", None) or (time.perf_counter() - t0)
            if sc.lexical_weight is None and sc.mode == "flat":
                hits_for_qa["flat"] = hits
            elif sc.lexical_weight is None and (sc.n_probe or 0) == self.qa_np:
                hits_for_qa["two_stage"] = hits
            if rel:  # else recall/nDCG undefined: counted in questions_without_resolvable_evidence
                self.tally_retrieval(sc, q, rel, hits, lat)
        return hits_for_qa

    def tally_retrieval(self, sc: SearchConfig, q: QAItem, rel: set[str], hits: Any, lat: float) -> None:
        got = [self.id_to_dia.get(int(h.memory_id)) for h in hits]
        # Scanned: the memories whose score the search computed, as the store counts them
        # (Hits.scanned); a two-stage search whose probed clusters hold fewer than k rows
        # falls back to flat and scans every eligible memory.
        frac = hits.scanned / hits.candidates if hits.candidates else 0.0
        fell_back = float(sc.mode == "two_stage" and hits.mode == "flat")
        tally = self.tallies.retrieval[f"{self.org}/{sc.name}"]
        if not is_adversarial(q.category, q.adversarial):
            # The share of the answer in the context the model would see (top 5, top 10).
            for k in (5, 10):
                share = answer_containment(q.answer, answer_context(hits[:k], grouped=False))
                if share is not None:
                    tally.add(q.category, **{f"containment@{k}": share})
        tally.add(
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

    def answer(self, q: QAItem, hits_for_qa: dict[str, Any]) -> list[dict]:
        """The SLM's answer from each QA mode's hits, scored and tallied."""
        out = []
        for mode in self.settings.qa_modes:
            hits = hits_for_qa.get(mode)
            if hits is None:  # two_stage at the default n_probe was not in the list
                hits = self.store.search(q.question, k=SEARCH_K, mode=mode, n_probe=self.qa_np or None)
            asked = question_prompt(q.question, q.category, q.adversarial_answer, q.adversarial)
            pred = ask(self.qa_client, asked, answer_context(hits, grouped=True))
            name = f"{self.org}/{mode}" + (f"@{self.qa_np or 'auto'}" if mode == "two_stage" else "")
            f1, b1 = score_answer(pred, q.answer, q.category, q.adversarial)
            adv = is_adversarial(q.category, q.adversarial)
            self.tallies.qa[name].add(q.category, f1=f1, bleu1=b1, adversarial=float(adv))
            out.append({"config": name, "question": q.question, "gold": q.answer, "category": q.category,
                        "adversarial": adv, "prediction": pred, "f1": f1, "bleu1": b1})
        return out

    def after(self) -> dict:
        """The store's statistics and label quality, and the organisations searches ran."""
        try:
            stats = self.store.stats()
            stats["label_quality"] = self.store.label_quality()  # clag_fast.labels.measures
        except Exception as exc:  # a report field, never a reason to lose the run
            stats = {"error": repr(exc)}
        return {"store_stats": stats, "organizations_during_search": _organizations(self.store) - self.orgs_before}


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
