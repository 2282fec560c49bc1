"""``clag-fast eval``: retrieval and QA evaluation on LoCoMo-format data.

Does cluster-aware memory give a small model better context than one flat pool, and what does
it cost? For every sample of the dataset a fresh :class:`~clag_fast.store.MemoryStore` is
built per organisation ("vector": k-means only, no SLM; "slm": organised by the SLM when a
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
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clag_fast._deprecated import RenamedKeys, renamed_kwargs, renamed_option
from clag_fast.eval.embedders import HashingEmbedder, LookupEmbedder, embed_texts, make_embedder
from clag_fast.eval.endpoint import slm_endpoint
from clag_fast.eval.metrics import percentile
from clag_fast.eval.sample_run import SampleInput, Tallies, Tally, run_sample
from clag_fast.eval.settings import SEARCH_K, RunSettings, search_configs, store_config
from clag_fast.locomo import Sample, load_dataset

__all__ = ["HashingEmbedder", "LookupEmbedder", "add_eval_parser", "run_eval", "main", "DEFAULT_N_PROBE"]

DEFAULT_N_PROBE = (0, 2, 4, 8, 16)  # 0 = the store's automatic n_probe ("auto")

# --- the run ---------------------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def _retrieval_summary(acc: Tally) -> dict:
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


def _qa_summary(acc: Tally) -> dict:
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


@renamed_kwargs(llm="slm")
def run_eval(
    dataset: str | Path,
    *,
    out_dir: str | Path | None = "eval_out",
    samples: int | str | Sequence[str] | None = None,
    max_questions: int | None = None,
    n_probe: Sequence[int] = DEFAULT_N_PROBE,
    slm: str | None = None,
    embedder: Any = "minilm",
    precision: str = "auto",
    threads: int | None = None,
    qa_modes: Sequence[str] = ("flat", "two_stage"),
    qa_questions: int | None = None,
    cache_dir: str | Path | None = None,
    store_options: dict[str, Any] | None = None,
    progress: bool = True,
    plots: bool = True,
    reflections: bool = False,
) -> dict:
    """Run the evaluation and return the report (also written under ``out_dir``).

    Args:
      dataset: a LoCoMo-format JSON file.
      out_dir: where ``eval.json``, ``eval.md`` and the PNG plots go (None: write nothing).
      samples: first N samples (int), or sample ids / indices (list or comma string).
      max_questions: at most this many questions per sample (the first ones).
      n_probe: the two_stage n_probe values to measure.
      slm: None (retrieval only, vector organisation), a llama.cpp server URL, or "managed"
        (starts the bundled SmolLM2 server). Adds the "slm" organisation and QA metrics.
        ``llm`` is its deprecated spelling.
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
      reflections: store each session's observations (LoCoMo's per-session facts) after its
        turns as the agent's reflections; hits on them hold no evidence turn.
    """
    t_start = time.perf_counter()
    n_probe = _checked_args(n_probe, max_questions, qa_questions, qa_modes, store_options)
    picked = _load_samples(dataset, samples, max_questions, reflections)
    emb, emb_name = make_embedder(embedder, precision, threads)
    vectors = _embed_samples(picked, emb, emb_name, Path(cache_dir) if cache_dir is not None else None, progress)
    with slm_endpoint(slm) as url:
        settings = RunSettings(search_configs=tuple(search_configs(n_probe)), qa_modes=tuple(qa_modes), url=url,
                               embedder=emb, store_options=dict(store_options or {}), qa_questions=qa_questions)
        runs = _run_samples(picked, vectors, settings, progress)
    args = {
        "samples": [s.sample_id for s in picked.samples],
        "max_questions": max_questions,
        "n_probe": n_probe,
        "slm": slm if not isinstance(slm, str) or slm == "managed" else "url",
        "embedder": emb_name,
        "threads": threads,
        "search_k": SEARCH_K,
        "qa_modes": list(qa_modes),
        "qa_questions": qa_questions,
        "store_options": dict(store_options or {}),
        "reflections": reflections,
    }
    report = _report(dataset, args, picked, vectors, runs)
    report["total_s"] = time.perf_counter() - t_start
    if out_dir is not None:
        from clag_fast.eval.report import write_report

        report["files"] = write_report(report, Path(out_dir), plots=plots)
    return report


def _checked_args(n_probe: Sequence[int], max_questions: int | None, qa_questions: int | None,
                  qa_modes: Sequence[str], store_options: dict[str, Any] | None) -> list[int]:
    """The sorted n_probe values (0: automatic); ValueError naming a bad argument, before any
    embedding work."""
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
    store_config("vector", store_options)  # bad options fail here too
    return n_probe


@dataclass
class _Picked:
    """The samples evaluated (questions cut to ``max_questions``) and, per sample id, the
    turn ids each question's evidence names."""

    samples: list[Sample]
    relevant: dict[str, list[set[str]]]


def _load_samples(dataset: str | Path, spec: Any, max_questions: int | None, reflections: bool = False) -> _Picked:
    picked = _select_samples(load_dataset(dataset, reflections=reflections), spec)
    for s in picked:
        if max_questions is not None:
            s.qa = s.qa[:max_questions]
    relevant = {s.sample_id: [s.resolve_evidence(q) for q in s.qa] for s in picked}
    _check_evidence(picked, relevant)
    return _Picked(picked, relevant)


@dataclass
class _Vectors:
    """Every turn's and every question's vector, in dataset order, and the time it took."""

    turns: np.ndarray
    questions: np.ndarray
    seconds: float


def _embed_samples(picked: _Picked, emb: Any, emb_name: str, cache: Path | None, progress: bool) -> _Vectors:
    """Every turn and every question embedded once, in batches (cached under ``cache``)."""
    turn_texts = [t.memory_text() for s in picked.samples for t in s.turns]
    questions = [q.question for s in picked.samples for q in s.qa]
    t0 = time.perf_counter()
    turn_vecs = embed_texts(emb, turn_texts, emb_name, cache, progress=progress, desc="embed turns")
    q_vecs = embed_texts(emb, questions, emb_name, cache, progress=progress, desc="embed questions")
    return _Vectors(turn_vecs, q_vecs, time.perf_counter() - t0)


@dataclass
class _Runs:
    """What the per-sample runs left: their records, the tallies, per-organisation totals."""

    per_sample: list[dict] = field(default_factory=list)
    tallies: Tallies = field(default_factory=Tallies)
    totals: dict[str, dict[str, Any]] = field(default_factory=dict)
    no_evidence: int = 0  # questions whose evidence names no turn

    def add(self, rec: dict) -> None:
        """One per-sample record, summed into its organisation's totals."""
        self.per_sample.append(rec)
        tot = self.totals.setdefault(rec["organisation"], {"cluster_sizes": [], "cluster_counts": []})
        sums = {key: rec[key] for key in ("memories", "questions", "ingest_s", "organize_s",
                                          "organizations_during_search")}
        for prefix, name in (("ingest_slm_", "store_slm_ingest"), ("search_slm_", "store_slm_search"),
                             ("qa_slm_", "qa_slm")):
            sums.update({prefix + key: val for key, val in rec[name].items()})
        for key, val in sums.items():
            tot[key] = tot.get(key, 0) + val
        tot["cluster_sizes"].extend(rec["cluster_sizes"])
        tot["cluster_counts"].append(len(rec["cluster_sizes"]))


def _run_samples(picked: _Picked, vectors: _Vectors, settings: RunSettings, progress: bool) -> _Runs:
    """Every sample under every organisation ("vector", and "slm" with an SLM server)."""
    from tqdm import tqdm

    organisations = ["vector"] + (["slm"] if settings.url else [])
    runs = _Runs()
    n_units = sum(len(s.qa) for s in picked.samples) * len(organisations)
    bar = tqdm(total=n_units, desc="eval", unit="q", disable=not progress)
    runs.tallies.tick = lambda: bar.update(1)
    t_off = q_off = 0
    for s in picked.samples:
        data = SampleInput(s, vectors.turns[t_off : t_off + len(s.turns)],
                           vectors.questions[q_off : q_off + len(s.qa)], picked.relevant[s.sample_id])
        t_off += len(s.turns)
        q_off += len(s.qa)
        runs.no_evidence += sum(1 for r in data.relevant if not r)
        for org in organisations:
            runs.add(run_sample(data, org, settings, runs.tallies))
    bar.close()
    return runs


def _report(dataset: str | Path, args: dict[str, Any], picked: _Picked, vectors: _Vectors, runs: _Runs) -> dict:
    n_turns, n_questions = len(vectors.turns), len(vectors.questions)
    return {
        "dataset": str(dataset),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": _machine(),
        "args": args,
        "counts": {
            "samples": len(picked.samples),
            "memories": n_turns,
            "questions": n_questions,
            "questions_without_resolvable_evidence": runs.no_evidence,
        },
        "embedding": {"texts": n_turns + n_questions, "seconds": vectors.seconds},
        "retrieval": {name: _retrieval_summary(acc) for name, acc in runs.tallies.retrieval.items()},
        "qa": {name: _qa_summary(acc) for name, acc in runs.tallies.qa.items()},
        "organisation": {org: _org_summary(tot) for org, tot in runs.totals.items()},
        "per_sample": runs.per_sample,
    }


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


#: The old names of the organisation summary's SLM figures, still readable (with a warning).
_ORG_RENAMES = {f"llm_{k}": f"slm_{k}" for k in (
    "calls_per_memory", "tokens_per_memory", "calls_per_question_search", "tokens_per_question_search",
    "calls_per_question_answer", "tokens_per_question_answer", "errors")}


def _org_summary(tot: dict) -> dict:
    sizes = tot["cluster_sizes"]
    mem = max(tot["memories"], 1)
    nq = max(tot["questions"], 1)
    return RenamedKeys({
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
        "slm_calls_per_memory": tot["ingest_slm_calls"] / mem,
        "slm_tokens_per_memory": (tot["ingest_slm_prompt_tokens"] + tot["ingest_slm_completion_tokens"]) / mem,
        "slm_calls_per_question_search": tot["search_slm_calls"] / nq,
        "slm_tokens_per_question_search": (tot["search_slm_prompt_tokens"] + tot["search_slm_completion_tokens"]) / nq,
        "slm_calls_per_question_answer": tot["qa_slm_calls"] / nq,
        "slm_tokens_per_question_answer": (tot["qa_slm_prompt_tokens"] + tot["qa_slm_completion_tokens"]) / nq,
        "slm_errors": tot["ingest_slm_errors"] + tot["search_slm_errors"] + tot["qa_slm_errors"],
        "organizations_during_search": int(tot["organizations_during_search"]),
    }, _ORG_RENAMES, "run_eval() report['organisation'][...]")


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
    p.add_argument("--slm", default=None,
                   help="llama.cpp server URL, or 'managed' for the bundled SmolLM2 (default: none, retrieval only)")
    renamed_option(p, "--llm", "--slm")
    p.add_argument("--embedder", choices=["minilm", "hash"], default="minilm",
                   help="minilm (the product's embedder) or hash (bag-of-words, no model; tests only)")
    p.add_argument("--precision", choices=["auto", "fp32", "int8"], default="auto",
                   help="MiniLM precision (auto: the Embedder's default, int8 on a CPU with VNNI)")
    p.add_argument("--threads", type=int, default=None, help="embedder threads (default: onnxruntime's)")
    p.add_argument("--qa-modes", default="flat,two_stage", help="search modes answered by the SLM")
    p.add_argument("--qa-questions", type=int, default=None,
                   help="with --slm: answer only the first N questions per sample (retrieval still uses all)")
    p.add_argument("--cache", default=None, help="directory to cache embeddings between runs")
    p.add_argument("--store-option", action="append", default=[], type=_store_option, metavar="FIELD=VALUE",
                   help="StoreConfig override for every store, e.g. target_cluster_size=32 (repeatable)")
    p.add_argument("--reflections", action="store_true",
                   help="store each session's observations after its turns as the agent's reflections")
    p.add_argument("--qa-table", action="store_true",
                   help="with --slm: measure the QA table instead (flat vector RAG vs clag_fast without and with "
                        "cluster labels, a fixed stratified question subset; see clag_fast.eval.qa)")
    p.add_argument("--qa-n", type=int, default=200, help="--qa-table: questions in the subset (default 200)")
    p.add_argument("--qa-seed", type=int, default=0, help="--qa-table: seed of the subset (default 0)")
    p.add_argument("--qa-k", type=int, default=None, help="--qa-table: memories per answer prompt (default 10)")
    p.add_argument("--qa-configs", default="flat_vector,flat_hybrid,clag,clag_labels",
                   help="--qa-table: configurations, comma-separated (flat_vector, clag, clag_labels, clag_tags)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_from_args(args: argparse.Namespace) -> int:
    if args.qa_table:
        return _qa_table_from_args(args)
    try:
        report = run_eval(
            args.dataset, out_dir=args.out, samples=args.samples, max_questions=args.max_questions,
            n_probe=args.n_probe, slm=args.slm, embedder=args.embedder, precision=args.precision,
            threads=args.threads, qa_modes=[m.strip() for m in args.qa_modes.split(",") if m.strip()],
            qa_questions=args.qa_questions,
            cache_dir=args.cache, store_options=dict(args.store_option),
            progress=not args.no_progress, plots=not args.no_plots, reflections=args.reflections,
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
        if args.slm is None:
            raise ValueError("--qa-table needs --slm (managed or a server URL)")
        if args.reflections:
            raise ValueError("--reflections applies to the retrieval run, not to --qa-table")
        summary = run_qa_table(
            args.dataset, out_dir=args.out, n_questions=args.qa_n, seed=args.qa_seed, slm=args.slm,
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
