"""Writing an evaluation report: JSON, a Markdown table and PNG plots."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

__all__ = ["write_report", "to_markdown", "write_plots"]


def _fmt(x: object, digits: int = 3) -> str:
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.{digits}f}"
    return str(x)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def to_markdown(report: dict) -> str:
    """The report as Markdown tables: retrieval per configuration, organisation cost, QA."""
    c = report["counts"]
    a = report["args"]
    lines = [
        f"Dataset `{report['dataset']}`: {c['samples']} samples, {c['memories']} memories, "
        f"{c['questions']} questions ({c['questions_without_resolvable_evidence']} without "
        f"resolvable evidence, left out of retrieval metrics). Embedder {a['embedder']}; "
        f"embedding {report['embedding']['texts']} texts took {report['embedding']['seconds']:.1f} s; "
        f"whole run {report.get('total_s', float('nan')):.1f} s.",
        "",
        "| configuration | questions | Recall@5 | Recall@10 | Precision@5 | nDCG@10 | answer in top 5 "
        "| answer in top 10 | scanned | fell back to flat | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["retrieval"].items():
        lines.append(
            f"| {name} | {r['questions']} | {_fmt(r['recall@5'])} | {_fmt(r['recall@10'])} | "
            f"{_fmt(r['precision@5'])} | {_fmt(r['ndcg@10'])} | {_fmt(r.get('containment@5', float('nan')))} | "
            f"{_fmt(r.get('containment@10', float('nan')))} | {_pct(r['search_fraction'])} | "
            f"{_pct(r.get('fallback_flat', float('nan')))} | {_fmt(r['latency_ms_p50'], 2)} | {_fmt(r['latency_ms_p99'], 2)} |"
        )
    lines += _scan_notes(report["retrieval"])
    lines += [
        "",
        "Configurations: flat = exact scan of every memory; two_stage = probed clusters only "
        "(@n_probe, auto = the store's rule); vector = lexical_weight 0, hybrid = the store's "
        "default lexical + vector fusion. Scanned = memories whose score the search computed, "
        "over the eligible memories, as the store counts them (Hits.scanned: the members of the "
        "probed clusters; hybrid search adds its lexical candidates, a memory among both may be "
        "counted twice); a two-stage search whose probed clusters hold fewer than k rows falls "
        "back to flat and scans them all (column 'fell back to flat'). Answer in top k = answer "
        "containment: the share of the gold answer's content words found in the top k hits as the "
        "answer prompt shows them (dated lines), over the questions with a gold answer (not the "
        "adversarial ones): what retrieval puts before the model, whatever the model makes of it.",
        "",
        "| organisation | memories | ingest s | organize s | ms/memory | clusters per sample | size min/p50/p90/max "
        "| SLM calls/memory | SLM tokens/memory | SLM calls/question (search) | answer calls/question "
        "| re-organisations during search |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for org, o in report["organisation"].items():
        cs = o["cluster_size"]
        counts = o["clusters_per_sample"]
        count_txt = f"{min(counts)}-{max(counts)}" if counts and min(counts) != max(counts) else (
            str(counts[0]) if counts else "0")
        lines.append(
            f"| {org} | {o['memories']} | {o['ingest_s']:.2f} | {o['organize_s']:.2f} | "
            f"{o['ingest_ms_per_memory']:.3f} | {count_txt} | {cs['min']}/{_fmt(cs['p50'], 0)}/"
            f"{_fmt(cs['p90'], 0)}/{cs['max']} | {o['slm_calls_per_memory']:.3f} | "
            f"{o['slm_tokens_per_memory']:.1f} | {o['slm_calls_per_question_search']:.3f} | "
            f"{o['slm_calls_per_question_answer']:.3f} | {o.get('organizations_during_search', 0)} |"
        )
    lines += _label_lines(report.get("per_sample", []))
    if report["qa"]:
        cats = sorted({cat for q in report["qa"].values() for cat in q["by_category"]})
        # Headline over the answerable categories; the adversarial one (scored by abstention,
        # LoCoMo's protocol) in its own column, never in the mean.
        head = ("| configuration | questions (cat 1-4) | F1 (cat 1-4) | BLEU-1 (cat 1-4) | adversarial accuracy (n) | "
                + " | ".join(f"F1 cat {x}" for x in cats) + " |")
        lines += ["", head, "|---|---:|---:|---:|---:|" + "---:|" * len(cats)]
        for name, q in report["qa"].items():
            per = " | ".join(_fmt(q["by_category"].get(x, {}).get("f1", float("nan"))) for x in cats)
            adv = f"{_fmt(q.get('adversarial_accuracy', float('nan')))} ({q.get('adversarial_questions', 0)})"
            lines.append(f"| {name} | {q['questions']} | {_fmt(q['f1'])} | {_fmt(q['bleu1'])} | {adv} | {per} |")
    return "\n".join(lines) + "\n"


def _label_lines(per_sample: list) -> list[str]:
    """Label quality per sample and organisation (``clag_fast.labels.measures``), when measured."""
    rows = [(r.get("sample_id"), r.get("organisation"), r.get("store_stats", {}).get("label_quality"))
            for r in per_sample if isinstance(r, dict)]
    rows = [r for r in rows if isinstance(r[2], dict)]
    if not rows:
        return []
    out = ["", "| sample | organisation | clusters (2+ members) | copies | grounded | self@1 | generic | neutral |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for sid, org, q in rows:
        generic = f"{q['generic']} ({_pct(q['generic_rate'])})" if "generic" in q else "n/a"
        out.append(f"| {sid} | {org} | {q['clusters']} | {q['copies']} | {_fmt(q['grounded'])} | "
                   f"{_fmt(q.get('self_at_1', float('nan')))} | {generic} | {q['neutral']} |")
    out.append("")
    out.append("Labels: copies = summaries sharing an 8-word run with a member; grounded = share of "
               "label words found in the members; self@1 = the embedded summary is nearest its own "
               "cluster's centre; generic = labels naming no topic (every content word among the "
               "1,000 most frequent English words or unable to be a noun), their share of the "
               "clusters; neutral = 'misc' labels of clusters whose members share no topic "
               "(left out of grounded, self@1 and generic).")
    return out


def _scan_notes(retrieval: dict) -> list[str]:
    """A note for every two-stage series whose scanned share falls as n_probe grows: the
    smaller n_probe fell back to a flat scan (its probed clusters held fewer than k rows), so
    the table says why rather than showing a silent inversion."""
    series: dict[str, list[tuple[int, str, dict]]] = {}
    for name, r in retrieval.items():
        base, _, npb = name.partition("@")
        if npb.isdigit():
            series.setdefault(base, []).append((int(npb), name, r))
    notes = []
    for base, pts in series.items():
        pts.sort()
        for (p1, _, a), (p2, _, b) in zip(pts, pts[1:]):
            if b["search_fraction"] < a["search_fraction"]:
                notes.append(
                    f"Note: {base} scans {_pct(a['search_fraction'])} at n_probe {p1} but "
                    f"{_pct(b['search_fraction'])} at {p2}: at {p1}, {_pct(a.get('fallback_flat', float('nan')))} "
                    "of the searches fell back to a flat scan (the probed clusters held fewer than k rows).")
    return [""] + notes if notes else []


def write_plots(report: dict, out_dir: Path) -> list[str]:
    """recall@10 vs search-space fraction (one line per organisation, flat as a marker) and a
    cluster-size histogram per organisation. Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    orgs = sorted({name.split("/")[0] for name in report["retrieval"]})
    for i, org in enumerate(orgs):
        color = f"C{i}"  # one colour per organisation: its flat stars and its two_stage line
        pts = []
        for name, r in report["retrieval"].items():
            o, _, config = name.partition("/")
            if o != org:
                continue
            mode, _, rest = config.partition("-")
            kind, _, npb = rest.partition("@")
            if mode == "flat":
                ax.scatter([r["search_fraction"]], [r["recall@10"]], marker="*" if kind == "hybrid" else "x",
                           s=120, color=color, label=f"{org} {config}")
            elif kind == "vector":
                ax.scatter([r["search_fraction"]], [r["recall@10"]], marker="s", color=color,
                           label=f"{org} {config}")
            else:
                pts.append((r["search_fraction"], r["recall@10"], npb))
        pts.sort()
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color,
                    label=f"{org} two_stage-hybrid")
            for x, y, npb in pts:
                ax.annotate(f"n_probe={npb}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlabel("search-space fraction (memories scanned / total)")
    ax.set_ylabel("evidence Recall@10")
    ax.set_xlim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Recall@10 vs search space")
    fig.tight_layout()
    p = out_dir / "recall_vs_fraction.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(str(p))

    fig, ax = plt.subplots(figsize=(6, 4))
    for org, o in report["organisation"].items():
        sizes = o["cluster_sizes"]
        if sizes:
            ax.hist(sizes, bins=min(40, max(5, len(set(sizes)))), alpha=0.6, label=f"{org} ({len(sizes)} clusters)")
    ax.set_xlabel("cluster size (memories)")
    ax.set_ylabel("clusters")
    ax.set_title("Cluster sizes after organize()")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "cluster_sizes.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(str(p))
    return paths


def write_report(report: dict, out_dir: Path, *, plots: bool = True) -> list[str]:
    """Write ``eval.json``, ``eval.md`` and (optionally) the plots; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [str(out_dir / "eval.json"), str(out_dir / "eval.md")]
    if plots:
        paths += write_plots(report, out_dir)
    md = out_dir / "eval.md"
    md.write_text(to_markdown(report), encoding="utf-8")
    # Written last and atomically so that a present eval.json means a complete report; NaN
    # (an empty metric) is written as null, which strict JSON readers accept.
    tmp = out_dir / "eval.json.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(_jsonable(report | {"files": paths}), f, indent=1, default=str)
    os.replace(tmp, out_dir / "eval.json")
    return paths


def _jsonable(x: object) -> object:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _jsonable(x.item())
    return x
