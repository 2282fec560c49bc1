"""The paper's QA table, measured: does organised memory help a small model answer?

The configurations answer the same questions with the same SLM and the same answer prompt
(:mod:`clag_fast.eval.answer`), and differ only in the context:

  flat_vector   flat vector RAG: exact scan of every memory, vectors only (lexical_weight 0),
                the top ``k`` as a plain dated list
  flat_hybrid   exact scan, lexical + vector fusion alone (``RankingConfig.plain()``): hybrid
                RAG without the store's organisation or conversation structure
  clag          the store's default retrieval (two-stage, automatic n_probe, hybrid, ranked
                with the conversation structure), the same plain list
  clag_labels   the same hits as ``clag``, grouped under their cluster's label (summary, else
                tags): the cluster as context

Two configurations that give a question the same context share one answer (the model answers
at temperature 0).

The questions are a fixed stratified subset (:func:`select_questions`): the same rule and seed
choose the same questions on every run, so only the rule is stored, never the data. Every
(question, configuration) becomes one JSON line in ``qa.jsonl`` with the retrieved memories
(ids, dia_ids, scores, cluster ids), the exact context sent, the answer and its F1 / BLEU-1, so
that :func:`summarize` (``python -m clag_fast.eval.qa OUT/qa.jsonl``) recomputes every figure
of the table from the file alone. A run that stops part-way resumes from its JSONL.

The stores are organised without an SLM (k-means, profiles from the most typical member and
frequent words): the SLM is used for answers only, so the table isolates the context.

Adversarial questions (LoCoMo category 5) are asked and scored by LoCoMo's protocol
(:mod:`clag_fast.eval.answer`); the headline F1 / BLEU-1 and the "all" difference are over the
other categories, the adversarial accuracy is reported beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from clag_fast._deprecated import renamed_kwargs
from clag_fast.config import RankingConfig
from clag_fast.eval.answer import (ANSWER_MAX_TOKENS, ANSWER_SYSTEM, answer_context, ask_with_reply, is_adversarial,
                                   question_prompt, score_answer)
from clag_fast.eval.embedders import LookupEmbedder, embed_texts, make_embedder
from clag_fast.eval.endpoint import slm_endpoint
from clag_fast.eval.metrics import answer_containment
from clag_fast.eval.settings import store_config
from clag_fast.locomo import Sample, conversation, load_dataset

__all__ = ["QA_CONFIGS", "DEFAULT_QA_CONFIGS", "BASELINE", "select_questions", "run_qa_table", "read_jsonl",
           "summarize", "to_markdown", "main"]

#: name -> (search mode, lexical_weight (None = the store's default), grouping of the context:
#: False = plain list, True = under the cluster label, "tags" = under the cluster's tags, and
#: whether the store ranks by the fused score alone: ``RankingConfig.plain()``)
QA_CONFIGS: dict[str, tuple[str, float | None, bool | str, bool]] = {
    "flat_vector": ("flat", 0.0, False, False),
    "flat_hybrid": ("flat", None, False, True),
    "clag": ("two_stage", None, False, False),
    "clag_labels": ("two_stage", None, True, False),
    "clag_tags": ("two_stage", None, "tags", False),
}
#: The table's configurations (clag_tags is an extra, on request).
DEFAULT_QA_CONFIGS = ("flat_vector", "flat_hybrid", "clag", "clag_labels")
BASELINE = "flat_vector"
#: Memories in an answer prompt. 5 answers in half the time of 10, but on the same 100
#: questions it scored F1 0.017 lower, an interval that does not exclude a real loss
#: (BENCHMARKS.md, "Retrieval quality and QA"): the table keeps 10.
QA_K = 10
SELECTION_RULE = (
    "per category (sorted), the n_per_category questions with the smallest "
    "sha256(f'{seed}|{sample_id}|{qa_index}|{question}'), n_per_category = ceil(n / categories); "
    "a category with fewer questions gives all of them"
)


def select_questions(samples: Sequence[Sample], n: int, seed: int = 0) -> list[tuple[int, int]]:
    """A fixed stratified subset: ``(sample index, question index)`` pairs, in dataset order.

    Every category gets ``ceil(n / categories)`` questions (all of them when it has fewer),
    those with the smallest sha256 of ``seed``, sample id, index and question text. The rule
    depends on the data and the seed only (no RNG state, no Python hash salt), so every run on
    the same file picks the same questions.
    """
    if n < 1:
        raise ValueError(f"the QA subset needs n >= 1, got {n}")
    by_cat: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for si, s in enumerate(samples):
        for qi, q in enumerate(s.qa):
            key = hashlib.sha256(f"{seed}|{s.sample_id}|{qi}|{q.question}".encode()).hexdigest()
            by_cat[q.category].append((key, si, qi))
    if not by_cat:
        raise ValueError("the dataset has no questions")
    per = math.ceil(n / len(by_cat))
    picked = [(si, qi) for cat in sorted(by_cat) for _, si, qi in sorted(by_cat[cat])[:per]]
    return sorted(picked)


def _hit_record(h: Any, dia: dict[int, str]) -> dict:
    return {"memory_id": int(h.memory_id), "dia_id": dia.get(int(h.memory_id)), "score": float(h.score),
            "cluster_id": h.cluster_id}


@renamed_kwargs(llm="slm")
def run_qa_table(
    dataset: str | Path,
    *,
    out_dir: str | Path = "eval_qa",
    n_questions: int = 200,
    seed: int = 0,
    slm: str = "managed",
    embedder: Any = "minilm",
    precision: str = "auto",
    threads: int | None = None,
    cache_dir: str | Path | None = None,
    store_options: dict[str, Any] | None = None,
    progress: bool = True,
    configs: Sequence[str] = DEFAULT_QA_CONFIGS,
    k: int = QA_K,
) -> dict:
    """Answer the stratified subset in every configuration of ``configs`` (names of
    :data:`QA_CONFIGS`), with the top ``k`` memories in each prompt.

    Writes ``out_dir/qa.jsonl`` (appended line by line, so a stopped run resumes: pairs
    already in the file are not asked again), ``qa_run.json`` (the parameters and the
    selection rule; a resumed run must match them) and ``qa.json`` / ``qa.md`` (the table).
    ``slm``: "managed" (the bundled SmolLM2) or a server URL, answering the questions
    (``llm`` is its deprecated spelling). Returns the summary of :func:`summarize`.
    """
    from tqdm import tqdm

    from clag_fast.slm.client import LLMClient

    t_start = time.perf_counter()
    chosen = _chosen_configs(configs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = load_dataset(dataset)
    picked = select_questions(samples, n_questions, seed)
    emb, emb_name = make_embedder(embedder, precision, threads)
    cfg = store_config("vector", {"dim": int(emb.dim)} | dict(store_options or {}))
    run = {
        "dataset": Path(dataset).name,
        "n_questions": n_questions,
        "seed": seed,
        "selection_rule": SELECTION_RULE,
        "selected": len(picked),
        "configs": {c: {"mode": m, "lexical_weight": w, "grouped": g, "plain_ranking": p}
                    for c, (m, w, g, p) in chosen.items()},
        "k": k,
        "embedder": emb_name,
        "answer_system_prompt": ANSWER_SYSTEM,
        "answer_max_tokens": ANSWER_MAX_TOKENS,
        "store_options": dict(store_options or {}),
        "lexical_weight_default": cfg.lexical_weight,
    }
    jsonl = out / "qa.jsonl"
    done = _resume(out, run)
    todo = _todo(samples, picked, chosen, done)
    with slm_endpoint(slm) as url, jsonl.open("a", encoding="utf-8") as f:
        if url is None:
            raise ValueError("the QA table needs an SLM: slm='managed' or a server URL")
        client = LLMClient(url)
        bar = tqdm(total=sum(len(v) for v in todo.values()), desc="qa", unit="q", disable=not progress)
        table = _QATable(chosen, done, cfg, emb, emb_name, Path(cache_dir) if cache_dir is not None else None,
                         client, f, bar, k)
        for si, qis in sorted(todo.items()):
            table.answer_sample(samples[si], qis)
        bar.close()
    summary = summarize(read_jsonl(jsonl))
    summary["run"] = run
    summary["slm_stats"] = {k: v for k, v in client.stats.snapshot().items() if isinstance(v, (int, float))}
    summary["seconds_this_run"] = time.perf_counter() - t_start
    (out / "qa.json").write_text(json.dumps(_nan_to_none(summary), indent=1))
    (out / "qa.md").write_text(to_markdown(summary))
    return summary


_Config = tuple[str, float | None, bool | str, bool]


def _chosen_configs(configs: Sequence[str]) -> dict[str, _Config]:
    """The configurations asked for, by name, in order; ValueError naming unknown ones."""
    unknown = [c for c in configs if c not in QA_CONFIGS]
    if unknown or not configs:
        raise ValueError(f"QA configurations: unknown {unknown or 'none given'} (have {sorted(QA_CONFIGS)})")
    return {c: QA_CONFIGS[c] for c in dict.fromkeys(configs)}


def _resume(out: Path, run: dict) -> set[tuple[str, int, str]]:
    """Record the run's parameters in ``qa_run.json``; the (sample id, question index,
    configuration) triples its ``qa.jsonl`` holds already. ValueError when ``out`` holds a
    run with other parameters."""
    meta_path, jsonl = out / "qa_run.json", out / "qa.jsonl"
    if meta_path.exists() and jsonl.exists():
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in run} != run:
            raise ValueError(f"{out} holds a QA run with other parameters; choose another --out")
    meta_path.write_text(json.dumps(run, indent=1))
    return {(r["sample_id"], r["qa_index"], r["config"]) for r in read_jsonl(jsonl)} if jsonl.exists() else set()


def _todo(samples: Sequence[Sample], picked: list[tuple[int, int]], chosen: dict[str, _Config],
          done: set[tuple[str, int, str]]) -> dict[int, list[int]]:
    """Sample index -> its picked question indices, for the samples with a pair not done."""
    by_sample: dict[int, list[int]] = defaultdict(list)
    for si, qi in picked:
        by_sample[si].append(qi)
    return {si: qis for si, qis in by_sample.items()
            if any((samples[si].sample_id, qi, c) not in done for qi in qis for c in chosen)}


@dataclass
class _QATable:
    """What answering the table's questions shares: configurations, pairs done, the store
    configuration, the embedder (and its cache), the SLM client, the JSONL file, a progress bar."""

    chosen: dict[str, _Config]
    done: set[tuple[str, int, str]]
    cfg: Any
    emb: Any
    emb_name: str
    cache: Path | None
    client: Any
    jsonl: IO[str]
    bar: Any
    k: int = QA_K

    def answer_sample(self, s: Sample, qis: list[int]) -> None:
        """The stores for sample ``s`` (organised without an SLM; one per ranking the
        configurations use), questions ``qis`` answered in every configuration not done yet."""
        from clag_fast.store import MemoryStore

        texts = [t.memory_text() for t in s.turns]
        tv = embed_texts(self.emb, texts, self.emb_name, self.cache, progress=False)
        questions = [s.qa[qi].question for qi in qis]
        qv = embed_texts(self.emb, questions, self.emb_name, self.cache, progress=False)
        with contextlib.ExitStack() as stack:
            stores = {}  # plain ranking or not -> the sample's store
            for plain in sorted({c[3] for c in self.chosen.values()}):
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="clag-qa-"))
                config = self.cfg.replace(ranking=RankingConfig.plain()) if plain else self.cfg
                store = stores[plain] = MemoryStore.open(tmp, config=config, embedder=LookupEmbedder(questions, qv),
                                                         slm=False)
                stack.callback(store.close)
                ids = store.add_many(texts, embeddings=tv, metadata=[t.metadata() for t in s.turns],
                                     **conversation(s.turns))
                store.organize()
            dia = {int(m): t.dia_id for m, t in zip(ids, s.turns)}
            for qi in qis:
                self.answer_question(stores, s, qi, dia)
                self.bar.update(1)

    def answer_question(self, stores: dict[bool, Any], s: Sample, qi: int, dia: dict[int, str]) -> None:
        """Question ``qi`` of ``s`` in every configuration not done yet, one JSON line each
        (configurations that search alike share one search, and one context one answer)."""
        q = s.qa[qi]
        searches: dict[tuple, Any] = {}
        answered: dict[str, tuple[str, str]] = {}  # context -> (answer, reply)
        for name, (mode, lw, grouped, plain) in self.chosen.items():
            if (s.sample_id, qi, name) in self.done:
                continue
            hits = searches.get((mode, lw, plain))
            if hits is None:
                hits = searches[(mode, lw, plain)] = stores[plain].search(q.question, k=self.k, mode=mode,
                                                                          lexical_weight=lw)
            context = answer_context(hits, grouped)
            t0 = time.perf_counter()
            asked = question_prompt(q.question, q.category, q.adversarial_answer, q.adversarial)
            if context not in answered:
                answered[context] = ask_with_reply(self.client, asked, context)
            pred, reply = answered[context]
            f1, b1 = score_answer(pred, q.answer, q.category, q.adversarial)
            rec = {
                "config": name, "sample_id": s.sample_id, "qa_index": qi,
                "category": q.category, "question": q.question, "gold": q.answer,
                "adversarial": is_adversarial(q.category, q.adversarial), "asked": asked,
                "evidence": list(q.evidence),
                "retrieved": [_hit_record(h, dia) for h in hits],
                "context": context, "reply": reply, "answer": pred,
                "f1": f1, "bleu1": b1,
                "containment": answer_containment(q.answer, context),
                "answer_s": round(time.perf_counter() - t0, 3),
            }
            self.jsonl.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.jsonl.flush()


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a ``qa.jsonl`` (blank lines and a torn last line are skipped)."""
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves at most one torn line
    return out


def _bootstrap(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> dict:
    """Mean of the paired differences ``d`` and its percentile-bootstrap 95% interval."""
    if len(d) == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(d.mean()), "lo": float(lo), "hi": float(hi), "n": int(len(d))}


def summarize(records: Iterable[dict], *, baseline: str = BASELINE, n_boot: int = 10000, seed: int = 0,
              rescore: bool = True) -> dict:
    """The QA table from per-question records (the lines of ``qa.jsonl``).

    Per configuration and per category: n, mean F1, mean BLEU-1. For every configuration but
    ``baseline``: the mean paired difference to the baseline (over the questions both
    answered) with a percentile-bootstrap 95% interval (``n_boot`` resamples of the questions,
    ``seed`` fixed, so the interval is reproducible), overall and per category.
    ``rescore``: recompute F1 / BLEU-1 from ``answer`` and ``gold`` (default) rather than trust
    the stored values. A (question, configuration) seen twice keeps its last record.
    The configuration's n / F1 / BLEU-1 and the "all" difference cover the answerable questions
    (LoCoMo categories 1-4); ``adversarial`` holds the adversarial ones (accuracy as F1).
    """
    scores: dict[str, dict[tuple, tuple[float, float]]] = defaultdict(dict)
    contained: dict[str, dict[tuple, float]] = defaultdict(dict)
    cats: dict[tuple, str] = {}
    adversarial: set[tuple] = set()
    for r in records:
        if r.get("containment") is not None:
            contained[r["config"]][(str(r["sample_id"]), int(r["qa_index"]))] = float(r["containment"])
        key = (str(r["sample_id"]), int(r["qa_index"]))
        adv = is_adversarial(r["category"], bool(r.get("adversarial", False)))
        f1, b1 = score_answer(r["answer"], r["gold"], r["category"], adv) if rescore else (
            float(r["f1"]), float(r["bleu1"]))
        scores[r["config"]][key] = (f1, b1)
        cats[key] = str(r["category"])
        if adv:
            adversarial.add(key)

    def block(keys: list[tuple], table: dict[tuple, tuple[float, float]]) -> dict:
        vals = np.array([table[k] for k in keys], dtype=float).reshape(-1, 2)
        mean = vals.mean(axis=0) if len(vals) else np.array([np.nan, np.nan])
        return {"n": len(keys), "f1": float(mean[0]), "bleu1": float(mean[1])}

    configs = {}
    for name in sorted(scores, key=lambda c: (c != baseline, list(QA_CONFIGS).index(c) if c in QA_CONFIGS else 99, c)):
        table = scores[name]
        keys = sorted(table)
        held = [v for key, v in contained[name].items() if key not in adversarial]
        configs[name] = block([k for k in keys if k not in adversarial], table) | {
            "containment": float(np.mean(held)) if held else None,
            "adversarial": (block(adv_keys, table) if (adv_keys := [k for k in keys if k in adversarial])
                            else {"n": 0, "f1": None, "bleu1": None}),
            "by_category": {c: block([k for k in keys if cats[k] == c], table)
                            for c in sorted({cats[k] for k in keys})}}
    diffs = {}
    base = scores.get(baseline, {})
    rng = np.random.default_rng(seed)
    for name in configs:
        if name == baseline or not base:
            continue
        keys = sorted(set(scores[name]) & set(base))
        groups = {"all": [k for k in keys if k not in adversarial]} | {c: [k for k in keys if cats[k] == c] for c in sorted({cats[k] for k in keys})}
        diffs[f"{name} - {baseline}"] = {
            g: {metric: _bootstrap(np.array([scores[name][k][m] - base[k][m] for k in ks], float), n_boot, rng)
                for m, metric in ((0, "f1"), (1, "bleu1"))}
            for g, ks in groups.items()
        }
    return {"configs": configs, "differences": diffs, "baseline": baseline, "bootstrap": {"n_boot": n_boot,
            "seed": seed, "interval": "percentile 95%, paired by question"}}


def _f(x: float, d: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def to_markdown(summary: dict) -> str:
    """The QA table: per configuration and category (F1 / BLEU-1 / n), then the differences."""
    configs = summary["configs"]
    cats = sorted({c for v in configs.values() for c in v["by_category"]})
    lines = ["| configuration | n (cat 1-4) | F1 (cat 1-4) | BLEU-1 (cat 1-4) | answer in context (cat 1-4) "
             "| adversarial accuracy (n) | " + " | ".join(f"cat {c} F1 / BLEU-1 (n)" for c in cats) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---|" * len(cats)]
    for name, v in configs.items():
        per = " | ".join(
            f"{_f(b['f1'])} / {_f(b['bleu1'])} ({b['n']})" if (b := v["by_category"].get(c)) else "n/a"
            for c in cats)
        adv = v.get("adversarial", {"n": 0, "f1": float("nan")})
        lines.append(f"| {name} | {v['n']} | {_f(v['f1'])} | {_f(v['bleu1'])} | {_f(v.get('containment'))} "
                     f"| {_f(adv['f1'])} ({adv['n']}) | {per} |")
    if summary["differences"]:
        lines += ["", "| difference (paired, bootstrap 95% CI) | group | n | ΔF1 [CI] | ΔBLEU-1 [CI] |",
                  "|---|---|---:|---|---|"]
        for name, groups in summary["differences"].items():
            for g, m in groups.items():
                cell = lambda x: f"{_f(x['mean'])} [{_f(x['lo'])}, {_f(x['hi'])}]"  # noqa: E731
                lines.append(f"| {name} | {g} | {m['f1']['n']} | {cell(m['f1'])} | {cell(m['bleu1'])} |")
    return "\n".join(lines) + "\n"


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m clag_fast.eval.qa OUT/qa.jsonl [MORE.jsonl ...]``: recompute and print the
    table (several files are read as one, e.g. an extra configuration run on its own)."""
    p = argparse.ArgumentParser(prog="python -m clag_fast.eval.qa",
                                description="Recompute the QA table from a qa.jsonl written by clag-fast eval --qa-table.")
    p.add_argument("jsonl", nargs="+")
    p.add_argument("--baseline", default=BASELINE)
    p.add_argument("--n-boot", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of Markdown")
    a = p.parse_args(argv)
    summary = summarize([r for path in a.jsonl for r in read_jsonl(path)], baseline=a.baseline, n_boot=a.n_boot, seed=a.seed)
    print(json.dumps(_nan_to_none(summary), indent=1) if a.json else to_markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
