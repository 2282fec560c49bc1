"""What an answer costs the SLM, and which of the usual savings apply on a small CPU.

The QA table (``clag-fast eval --qa-table``) asks SmolLM2-135M one short question per
configuration over the store's top 10 memories. This bench builds the same prompts for the
first ``--n`` questions (categories 1-4) of one LoCoMo conversation: the turns go into a
``MemoryStore`` (the default embedder, no SLM), ``organize()``, and each question's context is
``clag_fast.eval.answer.answer_context`` of the default search's 10 hits grouped under their
cluster labels. Then, against the managed server (``ManagedServer``'s defaults):

* **prompt and generation**: each prompt once with ``max_tokens=1`` (the prompt's evaluation)
  and once in full (``ANSWER_MAX_TOKENS``); the prompt's share of the answer time;
* **the fixed instructions**: the same 1-token call after a call that shares nothing with it
  (the KV cache holds no common prefix) and after another answer prompt (llama.cpp keeps the
  shared system prompt in its KV cache and evaluates only the rest); the instructions' tokens
  over the prompt's;
* **parallel answering**: every prompt answered by one server, one at a time, then by two
  servers with one thread each, two at a time (llama-cpp-python's server runs one sequence at
  a time, so parallel slots mean parallel servers); wall time of each and whether the answers
  are the same text.

    python benches/bench_answer.py [--conv 0] [--n 24]

Prints medians and totals. Times are wall clock on whatever else the machine runs: compare
the two sides of a line, measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clag_fast import MemoryStore, StoreConfig
from clag_fast.eval.answer import ANSWER_MAX_TOKENS, answer_context, answer_messages, question_prompt
from clag_fast.locomo import conversation, load_dataset
from clag_fast.slm.client import LLMClient
from clag_fast.slm.server import ManagedServer

LOCOMO = Path(os.environ.get("CLAG_LOCOMO") or Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo10.json")
#: A prompt that shares no token with an answer prompt's start (another role first).
UNRELATED = [{"role": "user", "content": "Name one colour."}]


def prompts(conv: int, n: int) -> list[list[dict]]:
    """The answer prompts of the first ``n`` questions (categories 1-4) of conversation ``conv``."""
    s = load_dataset(LOCOMO)[conv]
    qs = [q for q in s.qa if str(q.category) in {"1", "2", "3", "4"}][:n]
    out = []
    with tempfile.TemporaryDirectory(prefix="clag-answer-") as tmp, \
            MemoryStore.open(tmp, config=StoreConfig(slm="off"), slm=False) as store:
        store.add_many([t.memory_text() for t in s.turns], metadata=[t.metadata() for t in s.turns],
                       **conversation(s.turns))
        store.organize()
        for q in qs:
            hits = store.search(q.question, k=10)
            asked = question_prompt(q.question, q.category, q.adversarial_answer, q.adversarial)
            out.append(answer_messages(asked, answer_context(hits, grouped=True)))
    return out


def call(client: LLMClient, messages: list[dict], max_tokens: int) -> tuple[float, str, int]:
    """(seconds, reply, prompt tokens) of one chat call."""
    before = client.stats.snapshot()["prompt_tokens"]
    t0 = time.perf_counter()
    text = client.chat(messages, max_tokens=max_tokens)
    return time.perf_counter() - t0, text, client.stats.snapshot()["prompt_tokens"] - before


def costs(client: LLMClient, ps: list[list[dict]]) -> dict:
    """Prompt, generation and the instructions' prefix, per prompt."""
    system_tokens = call(client, ps[0][:1] + [{"role": "user", "content": ""}], 1)[2]
    cold, warm, full, tokens = [], [], [], []
    for i, m in enumerate(ps):
        call(client, UNRELATED, 1)
        t, _, pt = call(client, m, 1)
        cold.append(t)
        tokens.append(pt)
        call(client, ps[i - 1], 1)  # another answer prompt: the instructions stay in the KV cache
        warm.append(call(client, m, 1)[0])
        call(client, UNRELATED, 1)
        full.append(call(client, m, ANSWER_MAX_TOKENS)[0])
    med = statistics.median
    return {"prompt_tokens_median": med(tokens), "instruction_tokens": system_tokens,
            "prompt_s_cold": med(cold), "prompt_s_after_answer_prompt": med(warm),
            "answer_s": med(full), "prompt_share": med(c / f for c, f in zip(cold, full) if f > 0)}


def answer_all(servers: list[ManagedServer], ps: list[list[dict]]) -> tuple[float, list[str]]:
    """Wall seconds to answer every prompt, one worker per server, and the replies in order."""
    clients = [LLMClient(s.url) for s in servers]
    out = [""] * len(ps)

    def one(i: int) -> None:
        out[i] = clients[i % len(clients)].chat(ps[i], max_tokens=ANSWER_MAX_TOKENS)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(clients)) as ex:
        list(ex.map(one, range(len(ps))))
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conv", type=int, default=0, help="LoCoMo conversation index (default 0)")
    ap.add_argument("--n", type=int, default=24, help="questions (default 24)")
    args = ap.parse_args(argv)
    ps = prompts(args.conv, args.n)
    with ManagedServer() as srv:
        c = costs(LLMClient(srv.url), ps)
        one_s, one = answer_all([srv], ps)
    with ManagedServer(n_threads=1, n_threads_batch=1) as a, ManagedServer(n_threads=1, n_threads_batch=1) as b:
        two_s, two = answer_all([a, b], ps)
    same = sum(x == y for x, y in zip(one, two))
    report = {**c, "answers": len(ps), "one_server_s": one_s, "two_servers_s": two_s, "same_answers": same}
    print(json.dumps(report, indent=1))
    print(f"\n{len(ps)} answer prompts of LoCoMo conversation {args.conv} (median {c['prompt_tokens_median']:.0f} "
          f"tokens, of which the instructions {c['instruction_tokens']}):")
    print(f"  prompt evaluation {c['prompt_s_cold']:.2f} s of a {c['answer_s']:.2f} s answer "
          f"(median share {c['prompt_share']:.0%})")
    print(f"  prompt after another answer prompt (instructions in the KV cache) {c['prompt_s_after_answer_prompt']:.2f} s"
          f" against {c['prompt_s_cold']:.2f} s with nothing shared")
    print(f"  one server, one at a time: {one_s:.1f} s; two one-thread servers, two at a time: {two_s:.1f} s "
          f"({one_s / two_s:.2f}x); same answers {same} of {len(ps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
