"""Loading LoCoMo-format datasets: ``clag-fast eval``, the demo and ``clag-fast ingest`` read them.

The format (LoCoMo, Maharana et al. 2024): a JSON list of samples; each sample has
``conversation`` with ``session_N`` lists of turns ``{speaker, dia_id, text}`` (optionally
``blip_caption`` for shared images) and ``session_N_date_time`` strings, and ``qa`` items
``{question, answer, evidence: [dia_id, ...], category}``. Adversarial items (category 5 in
LoCoMo) carry ``adversarial_answer`` and no ``answer``: the question is unanswerable from the
conversation, so the gold answer becomes :data:`UNANSWERABLE`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Turn", "QAItem", "Sample", "UNANSWERABLE", "conversation", "load_dataset", "parse_samples", "normalize_evidence"]

#: Gold answer used for questions that only have an ``adversarial_answer``. It is one of the two
#: options the answer prompt offers for such a question (LoCoMo's protocol, see
#: ``clag_fast.eval.answer``); the prediction is scored by whether it abstains, not by F1.
UNANSWERABLE = "Not mentioned in the conversation"

_SESSION_KEY = re.compile(r"session_(\d+)")
# LoCoMo evidence ids are "D<session>:<turn>"; the file also has typos such as "D:11:26" and
# "D30:05", and some items pack several ids in one string ("D8:6; D9:17").
_EVIDENCE_ID = re.compile(r"D:?(\d+):0*(\d+)")


@dataclass(frozen=True)
class Turn:
    """One dialogue turn: becomes one memory."""

    dia_id: str
    speaker: str
    text: str
    session: int
    date_time: str
    image_caption: str | None = None

    def memory_text(self) -> str:
        """The text stored as a memory: ``"Speaker: text"`` (+ the shared image's caption).

        The caption is kept because LoCoMo asks about shared photos, and the turn text alone
        often says only "Look at this!".
        """
        text = f"{self.speaker}: {self.text}"
        if self.image_caption:
            text += f" [shares a photo: {self.image_caption}]"
        return text

    def metadata(self) -> dict:
        """Metadata stored with the memory; ``dia_id`` maps a search hit back to evidence."""
        return {"dia_id": self.dia_id, "speaker": self.speaker, "session": self.session, "date": self.date_time}

    @property
    def thread(self) -> str:
        """The memory's thread: its session of the conversation."""
        return f"session {self.session}"

    @property
    def kind(self) -> str:
        """The memory's kind: ``tool_result`` for a text that opens with ``[tool``,
        ``reflection`` for one that opens with ``[reflection]``, else ``dialogue``."""
        if self.text.startswith("[tool"):
            return "tool_result"
        if self.text.startswith("[reflection]"):
            return "reflection"
        return "dialogue"


def conversation(turns: list[Turn]) -> dict[str, list[str]]:
    """``add_many``'s conversation arguments for ``turns``: each turn in its session's thread,
    said by its speaker (insertion order is turn order)."""
    return {"threads": [t.thread for t in turns], "speakers": [t.speaker for t in turns]}


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answer and evidence ids.

    ``evidence``: the ids in LoCoMo's canonical ``D<session>:<turn>`` form
    (:func:`normalize_evidence`); ``raw_evidence``: the ids exactly as written, which
    :meth:`Sample.resolve_evidence` tries first (datasets with other id schemes, such as
    ``"0:19"``, only match this way). ``adversarial_answer``: for an adversarial item, the
    plausible but wrong answer the dataset gives (offered as the other option, never gold).
    """

    question: str
    answer: str
    category: str
    evidence: tuple[str, ...]
    adversarial: bool = False
    raw_evidence: tuple[str, ...] = ()
    adversarial_answer: str = ""


@dataclass
class Sample:
    """One conversation with its questions."""

    sample_id: str
    turns: list[Turn] = field(default_factory=list)
    qa: list[QAItem] = field(default_factory=list)

    def dia_ids(self) -> set[str]:
        """Every turn id of the conversation (evidence outside this set cannot be retrieved)."""
        return {t.dia_id for t in self.turns}

    def resolve_evidence(self, q: QAItem) -> set[str]:
        """The turn ids (as the turns write them) that ``q``'s evidence names.

        Each evidence id is matched exactly as written first; only an id that names no turn is
        then normalised (LoCoMo's typos: ``"D:11:26"``, ``"D30:05"``, ``"D8:6; D9:17"``) and
        matched against the turns' ids in the same canonical form.
        """
        exact = self.dia_ids()
        # canonical form -> turn id; a turn already written canonically wins, then turn order
        canon: dict[str, str] = {}
        for t in sorted(self.turns, key=lambda t: normalize_evidence(t.dia_id)[:1] != [t.dia_id]):
            for c in normalize_evidence(t.dia_id)[:1]:
                canon.setdefault(c, t.dia_id)
        out: set[str] = set()
        for e in q.raw_evidence or q.evidence:
            if e in exact:
                out.add(e)
                continue
            out.update(canon[c] for c in normalize_evidence(e) if c in canon)
        return out


def normalize_evidence(raw: object) -> list[str]:
    """Evidence ids from one ``evidence`` list, split and canonicalised (``"D:11:26"`` ->
    ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``). Strings with no id (e.g. ``"D"``) are dropped."""
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ValueError(f"evidence must be a list of dia_id strings, got {type(raw).__name__}")
    out: list[str] = []
    for item in raw:
        for sess, turn in _EVIDENCE_ID.findall(str(item)):
            did = f"D{int(sess)}:{int(turn)}"
            if did not in out:
                out.append(did)
    return out


def _raw_evidence(raw: object) -> tuple[str, ...]:
    """The evidence ids as written (stripped); a bare string is one id."""
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    return tuple(s for s in (str(x).strip() for x in items) if s)


#: The speaker of the reflections made of a dataset's observations (``reflections=True``).
REFLECTION_SPEAKER = "Agent"


def _parse_sample(i: int, obj: object, reflections: bool = False) -> Sample:
    where = f"sample {i}"
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    sample_id = str(obj.get("sample_id", i))
    where = f"sample {i} ({sample_id})"
    conv = obj.get("conversation")
    if not isinstance(conv, dict):
        raise ValueError(f"{where}: missing or invalid 'conversation' object")
    sessions = sorted(
        (int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.fullmatch(key)) is not None
    )
    if not sessions:
        raise ValueError(f"{where}: 'conversation' has no session_N turn lists")
    sample = Sample(sample_id=sample_id)
    for n, key in sessions:
        turns = conv[key]
        if not isinstance(turns, list):
            raise ValueError(f"{where}: {key} must be a list of turns")
        date = str(conv.get(f"{key}_date_time", ""))
        for j, t in enumerate(turns):
            if not isinstance(t, dict) or not all(isinstance(t.get(f), str) for f in ("speaker", "dia_id", "text")):
                raise ValueError(f"{where}: {key}[{j}] needs string fields speaker, dia_id, text")
            caption = t.get("blip_caption")
            sample.turns.append(
                Turn(
                    dia_id=t["dia_id"].strip(),
                    speaker=t["speaker"],
                    text=t["text"],
                    session=n,
                    date_time=date,
                    image_caption=caption if isinstance(caption, str) and caption else None,
                )
            )
        if reflections:
            sample.turns.extend(_reflections(obj, n, date, where))
    qa = obj.get("qa", [])
    if not isinstance(qa, list):
        raise ValueError(f"{where}: 'qa' must be a list")
    for j, q in enumerate(qa):
        if not isinstance(q, dict) or not isinstance(q.get("question"), str):
            raise ValueError(f"{where}: qa[{j}] needs a string 'question'")
        adversarial = "answer" not in q or q["answer"] is None
        if adversarial and "adversarial_answer" not in q:
            raise ValueError(f"{where}: qa[{j}] has neither 'answer' nor 'adversarial_answer'")
        try:
            evidence = normalize_evidence(q.get("evidence"))
        except ValueError as exc:
            raise ValueError(f"{where}: qa[{j}]: {exc}") from None
        sample.qa.append(
            QAItem(
                question=q["question"],
                answer=UNANSWERABLE if adversarial else str(q["answer"]),
                category=str(q.get("category", "none")),
                evidence=tuple(evidence),
                adversarial=adversarial,
                raw_evidence=_raw_evidence(q.get("evidence")),
                adversarial_answer=str(q.get("adversarial_answer") or "") if adversarial else "",
            )
        )
    return sample


def _reflections(obj: dict, session: int, date: str, where: str) -> list[Turn]:
    """A session's observations (LoCoMo's ``observation`` object: per session, per speaker,
    ``[fact, evidence ids]`` pairs) as the agent's reflections at the session's end, with ids
    ``R<session>:<n>`` that no evidence names."""
    observed = obj.get("observation")
    if observed is None:
        return []
    if not isinstance(observed, dict):
        raise ValueError(f"{where}: 'observation' must be an object")
    per_speaker = observed.get(f"session_{session}_observation", {})
    if not isinstance(per_speaker, dict):
        raise ValueError(f"{where}: observation session_{session}_observation must be an object")
    out = []
    for speaker, facts in per_speaker.items():
        if not isinstance(facts, list):
            raise ValueError(f"{where}: observation session_{session}_observation[{speaker!r}] must be a list")
        for fact in facts:
            text = fact[0] if isinstance(fact, list) and fact else fact
            if isinstance(text, str) and text.strip():
                out.append(Turn(dia_id=f"R{session}:{len(out) + 1}", speaker=REFLECTION_SPEAKER,
                                text="[reflection] " + text.strip(), session=session, date_time=date))
    return out


def parse_samples(data: object, *, reflections: bool = False) -> list[Sample]:
    """Samples from already-decoded JSON (a list of LoCoMo samples). ``reflections``: each
    session's observations follow its turns as the agent's reflections (``Turn.kind``)."""
    if not isinstance(data, list):
        raise ValueError(f"a LoCoMo-format dataset is a JSON list of samples, got {type(data).__name__}")
    return [_parse_sample(i, obj, reflections) for i, obj in enumerate(data)]


def load_dataset(path: str | Path, *, reflections: bool = False) -> list[Sample]:
    """Read and validate a LoCoMo-format JSON file; ValueError names the bad sample/field.
    ``reflections``: as in ``parse_samples``."""
    p = Path(path)
    try:
        with p.open(encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None
    try:
        return parse_samples(data, reflections=reflections)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from None
