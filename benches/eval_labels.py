"""Cluster label quality on one conversation: copies, groundedness, self@1, SLM
parse failures (apart from failed calls) and profile calls per memory.

The conversation's turns are added 32 at a time (``--batch``; the store's defaults: background SLM work),
then ``flush()``, ``organize(task_context)`` and ``flush()``; the labels are measured with
``MemoryStore.label_quality()`` (``clag_fast.labels.measures``).

    python benches/eval_labels.py python/clag_fast/data/demo_trip.json --slm managed \
        --context "an agent planning a two-week trip to Japan for a user and their partner"
    python benches/eval_labels.py locomo10.json --sample 2 --slm off        # LoCoMo's data file

``--misses`` lists the clusters whose label fails self@1, the cluster it points at and the cosine
of their centres.
Results: BENCHMARKS.md, "Cluster labels".
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

from clag_fast.config import StoreConfig
from clag_fast.errors import LLMHTTPError, LLMTimeout, LLMUnreachable
from clag_fast.locomo import load_dataset
from clag_fast.store import MemoryStore


class SLMFailures(logging.Handler):
    """Counts the organiser's failed SLM decisions by kind: ``parse`` (an answer came but was
    unusable: not JSON, outside the schema, no offered phrase) apart from ``call`` (timeout,
    unreachable, HTTP error: the server's side, not the prompt's). The organiser logs every
    failure (repeats at DEBUG); its ``organizer_errors`` counter adds both kinds."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("SLM %s failed") or len(record.args or ()) < 2:
            return
        decision, err = record.args[0], record.args[1]
        kind = "call" if isinstance(err, (LLMTimeout, LLMUnreachable, LLMHTTPError)) else "parse"
        self.counts[f"{decision}:{kind}"] += 1

    def parse(self) -> int:
        return sum(v for k, v in self.counts.items() if k.endswith(":parse"))


def print_misses(store: MemoryStore) -> None:
    """The labels nearer another cluster's centre than their own (``labels.measures.self_misses``),
    embedded by the default embedder."""
    from clag_fast.embed import Embedder
    from clag_fast.labels.measures import self_misses

    ids, centres = store.cluster_centres()
    info = {c.id: c for c in store.clusters()}
    got = [info.get(c) for c in ids.tolist()]
    # Every centre competes (as in self@1); only clusters with 2+ members are scored.
    summaries = [c.summary if c is not None and c.size >= 2 else "" for c in got]
    misses = self_misses(summaries, centres, Embedder().encode)
    print(f"self@1 misses: {len(misses)} of {sum(bool(s) for s in summaries)} labelled clusters with 2+ members")
    for i, j, margin in misses:
        a, b = got[i], got[j]
        # The centres' cosine: a miss between near-duplicate clusters (close to
        # ``merge_threshold``) is a merge signal rather than a labelling failure.
        print(f"  {margin:+.3f}  [{a.size}] {a.summary} | {', '.join(a.tags)}   nearer [{b.size}] {b.summary}"
              f"   (centres cos {float(centres[i] @ centres[j]):.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="LoCoMo-format JSON (the demo conversation is one)")
    p.add_argument("--sample", type=int, default=0, help="which conversation of the file")
    p.add_argument("--slm", choices=["off", "managed"], default="off")
    p.add_argument("--context", default=None, help="task context passed to organize()")
    p.add_argument("--show", type=int, default=20, help="print the labels of the N largest clusters")
    p.add_argument("--misses", action="store_true",
                   help="print the clusters failing self@1: label, size, margin, the nearer cluster's label and size")
    p.add_argument("--batch", type=int, default=32,
                   help="turns per add_many call (another batch size gives another clustering: a robustness check)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="build the store in DIR (must not exist) and keep it, to study its labels afterwards")
    args = p.parse_args()
    failures = SLMFailures()
    org_log = logging.getLogger("clag_fast.slm.organizer")
    org_log.addHandler(failures)
    org_log.setLevel(logging.DEBUG)
    sample = load_dataset(args.data)[args.sample]
    texts = [t.memory_text() for t in sample.turns]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "store"
        if args.keep and path.exists():
            raise SystemExit(f"--keep {path}: already exists")
        store = (MemoryStore.open(path, slm=False, config=StoreConfig(slm="off")) if args.slm == "off"
                 else MemoryStore.open(path))
        with store:
            t0 = time.perf_counter()
            for i in range(0, len(texts), args.batch):
                store.add_many(texts[i:i + args.batch])
            store.flush()
            report = store.organize(task_context=args.context)
            store.flush()
            seconds = time.perf_counter() - t0
            for c in store.clusters()[: args.show]:
                print(f"{c.size:>4}  {c.summary} | {', '.join(c.tags)}")
            if args.misses:
                print_misses(store)
            stats = store.stats()
            out = {
                "sample": sample.sample_id, "memories": len(texts), "slm": args.slm,
                "seconds": round(seconds, 1), "topics": report.get("topics", []),
                "quality": store.label_quality(), "labels": stats["labels"],
                "slm_calls": stats["slm_usage"].get("calls", 0),
                "organizer_errors": stats["slm_usage"].get("organizer_errors", 0),
                "parse_failures": failures.parse(), "slm_failures": dict(failures.counts),
                "profile_calls": stats["slm_usage"]["profile_calls"],
                "profile_calls_per_memory": round(stats["slm_usage"]["profile_calls"] / len(texts), 4),
            }
            print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
