"""The answer prompt of the evaluation: one place for the SLM's instructions, the context
built from search hits (a plain ranked list, or grouped under cluster labels), the question
as it is put to the model, the extraction of a short answer from the reply, and its score.

Adversarial questions (LoCoMo category 5) follow the published LoCoMo protocol
(snap-research/locomo, ``task_eval/gpt_utils.py`` and ``task_eval/evaluation.py``): the
question is put as a two-way choice, "Select the correct answer: (a) ... (b) ...", between
"Not mentioned in the conversation" and the dataset's ``adversarial_answer`` (a plausible
wrong answer), in an order fixed per question; the reply scores 1 when it contains "not
mentioned" or "no information available" (case-insensitive), else 0, for F1 and BLEU-1
alike. The system prompt names no abstention string, so the model is never told which option
is gold, and the headline QA scores are the means over the other categories (1-4), with the
adversarial accuracy reported beside them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from clag_fast.eval.metrics import bleu1, token_f1

__all__ = ["ANSWER_SYSTEM", "ANSWER_MAX_TOKENS", "answer_context", "answer_messages", "ask", "ask_with_reply", "extract_answer",
           "cluster_label", "ADVERSARIAL_CATEGORY", "is_adversarial", "question_prompt", "score_answer"]

#: One system prompt for every configuration, so that a difference in the QA table comes from
#: the context alone. It must not claim a grouping the plain context lacks, and it must not
#: name the adversarial gold string (an always-abstaining model would then score 1 there).
ANSWER_SYSTEM = (
    "You answer questions about a long conversation between two people, using only the "
    "memories given. Each memory is dated; memories may be grouped under a topic. Reply with "
    "a short phrase (a few words), not a sentence."
)

#: LoCoMo's adversarial category: unanswerable questions with a trap answer.
ADVERSARIAL_CATEGORY = "5"
_NOT_MENTIONED = "Not mentioned in the conversation"
_ABSTAINS = ("not mentioned", "no information available")


def is_adversarial(category: object, adversarial: bool = False) -> bool:
    """True for a LoCoMo adversarial item (category 5, or parsed without an ``answer``)."""
    return bool(adversarial) or str(category) == ADVERSARIAL_CATEGORY


def question_prompt(question: str, category: object, adversarial_answer: str = "", adversarial: bool = False) -> str:
    """The question as the model sees it: unchanged, except for an adversarial item, which
    becomes LoCoMo's two-way choice. The order of the options comes from a hash of the
    question (LoCoMo draws it at random; a hash keeps runs comparable and resumable)."""
    if not is_adversarial(category, adversarial):
        return question
    trap = adversarial_answer or "something else"
    first = hashlib.sha256(question.encode("utf-8")).digest()[0] % 2 == 0
    a, b = (_NOT_MENTIONED, trap) if first else (trap, _NOT_MENTIONED)
    return f"{question} Select the correct answer: (a) {a} (b) {b}."


def score_answer(prediction: str, gold: str, category: object, adversarial: bool = False) -> tuple[float, float]:
    """(token F1, BLEU-1) of ``prediction``; an adversarial item scores (1, 1) when the
    prediction abstains ("not mentioned" / "no information available"), else (0, 0)."""
    if is_adversarial(category, adversarial):
        hit = float(any(a in str(prediction).lower() for a in _ABSTAINS))
        return hit, hit
    return token_f1(prediction, gold), bleu1(prediction, gold)


#: Answers are short phrases; a cap keeps a rambling small model from costing seconds.
ANSWER_MAX_TOKENS = 32


def _line(h: Any) -> str:
    date = (h.metadata or {}).get("date", "")
    return f"- ({date}) {h.text}" if date else f"- {h.text}"


def cluster_label(h: Any) -> str:
    """A hit's cluster label: its summary, else its tags, else the cluster id."""
    label = (h.cluster_summary or "").strip() or ", ".join(h.cluster_tags or [])
    return label or (f"cluster {h.cluster_id}" if h.cluster_id is not None else "unclustered")


def answer_context(hits: Sequence[Any], grouped: bool | str) -> str:
    """The memories as the prompt shows them.

    ``grouped=False``: one dated line per hit, best first. ``grouped=True``: the hits grouped
    under their cluster's label (``Topic: ...``, :func:`cluster_label`), groups in the order of
    their best hit and hits in rank order within a group. ``grouped="tags"``: the same, the
    label being the cluster's tags only (falling back to :func:`cluster_label`).
    """
    if not grouped:
        return "\n".join(_line(h) for h in hits)
    groups: dict[str, list[str]] = {}
    for h in hits:
        label = ", ".join(h.cluster_tags or []) if grouped == "tags" else ""
        groups.setdefault(label or cluster_label(h), []).append(_line(h))
    return "\n".join(f"Topic: {label}\n" + "\n".join(lines) for label, lines in groups.items())


def answer_messages(question: str, context: str) -> list[dict]:
    """Chat messages for one answer."""
    return [
        {"role": "system", "content": ANSWER_SYSTEM},
        {"role": "user", "content": f"Memories:\n{context}\n\nQuestion: {question}\nShort answer:"},
    ]


def ask(client: Any, question: str, context: str) -> str:
    """:func:`ask_with_reply` without the raw reply."""
    return ask_with_reply(client, question, context)[0]


def ask_with_reply(client: Any, question: str, context: str) -> tuple[str, str]:
    """The SLM's short answer (:func:`extract_answer` of a plain completion) and the raw reply;
    ("", "") when the call fails (scored 0; the client counts the error).

    Plain text, not ``chat_json``: SmolLM2-135M often breaks a JSON wrapper around a free-text
    answer (measured: "truncated JSON object" then retries, ~5 s per question against ~2 s),
    and the answer needs no structure.
    """
    from clag_fast.slm.client import LLMError

    try:
        text = client.chat(answer_messages(question, context), max_tokens=ANSWER_MAX_TOKENS)
    except LLMError:
        return "", ""
    return extract_answer(text), str(text)


#: Lines of the prompt's own scaffolding that a small model echoes before (or instead of) its
#: answer (measured on SmolLM2-135M: "Memories:" as the first line of 2 answers in 5).
_SCAFFOLD = ("memories:", "topic:", "question:")


def extract_answer(text: object) -> str:
    """The answer in a raw reply: the first line that is not prompt scaffolding (``Memories:``,
    ``Topic: ...``, ``Question: ...``), without an "answer:" frame; "" when none is left."""
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.lower().startswith(_SCAFFOLD)]
    answer = lines[0] if lines else ""
    # Small models often restate the question's frame before the answer; drop that frame.
    for prefix in ("the short answer is:", "the answer is:", "short answer:", "answer:"):
        if answer.lower().startswith(prefix):
            answer = answer[len(prefix):].strip()
            break
    return answer
