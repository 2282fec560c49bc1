"""Replay captured SLM calls against llama.cpp server variants, side by side.

``benches/bench_slm.py --capture calls.jsonl`` records the organiser's calls for one
conversation. This script replays them (same messages, schema and max_tokens) against a
managed server per variant, rounds interleaved so a change in machine load hits every variant
alike, and reports per variant: wall time, prompt / completion tokens, and how many answers
equal the captured ones (temperature 0, so a difference means different arithmetic).

    .venv/bin/python benches/replay_slm.py calls.jsonl \\
        --variant wheel=.venv/bin/python --variant native=/tmp/venv_native/bin/python [--rounds 2]

A variant is ``label=python[,n_threads=N][,n_threads_batch=N]``: the interpreter that has
the llama-cpp-python build to try, plus ManagedServer settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_variant(spec: str) -> tuple[str, dict]:
    label, _, rest = spec.partition("=")
    parts = rest.split(",")
    kw: dict = {"python": str(Path(parts[0]).absolute())}
    for p in parts[1:]:
        k, _, v = p.partition("=")
        kw[k] = int(v) if v.isdigit() else v
    return label, kw


def replay(url: str, calls: list[dict]) -> dict:
    from clag_fast.slm.client import LLMClient, LLMError

    llm = LLMClient(url, timeout=300.0)
    same = errors = 0
    lat = []
    t0 = time.perf_counter()
    for c in calls:
        t = time.perf_counter()
        try:
            ans = llm.chat_json(c["messages"], c["schema"], c["max_tokens"])
            same += ans == c.get("answer")
        except LLMError:
            errors += 1
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    st = llm.stats.snapshot()
    return {"wall_s": round(wall, 2), "calls": len(calls), "errors": errors, "same_answers": same,
            "prompt_tokens": st.get("prompt_tokens", 0), "completion_tokens": st.get("completion_tokens", 0),
            "latency_p50_s": round(statistics.median(lat), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calls", type=Path)
    p.add_argument("--variant", action="append", required=True)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()

    from clag_fast.slm.server import ManagedServer

    calls = [json.loads(l) for l in args.calls.read_text().splitlines() if l.strip()]
    if not calls:
        raise SystemExit(f"{args.calls} holds no captured calls")
    variants = [parse_variant(v) for v in args.variant]
    results: dict[str, list[dict]] = {label: [] for label, _ in variants}
    for r in range(args.rounds):
        for label, kw in variants:
            with ManagedServer(**kw) as srv:
                load = open("/proc/loadavg").read().split()[0]
                res = replay(srv.url, calls)
                res["load_before"] = load
                res["served_model"] = srv.served_model.name  # the shipped file after a fallback
                res["load_after"] = open("/proc/loadavg").read().split()[0]
                results[label].append(res)
                print(f"round {r + 1} {label}: {json.dumps(res)}", file=sys.stderr, flush=True)
    summary = {label: {"wall_s_median": statistics.median(x["wall_s"] for x in runs), "runs": runs}
               for label, runs in results.items()}
    summary["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
