"""Format checks for the bundled demo conversation (python/clag_fast/data/demo_trip.json).

`clag-fast demo` and the eval code read this file as LoCoMo data, so it must keep
LoCoMo's shape: a list of samples, each with a `conversation` of numbered sessions
(`session_N` + `session_N_date_time`) and `qa` items whose evidence ids exist.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from datetime import datetime

import pytest

# data/ has no __init__.py (it is package data, not a subpackage), so it is reached
# from the clag_fast package root rather than as clag_fast.data.
DEMO = importlib.resources.files("clag_fast") / "data" / "demo_trip.json"

SESSION_KEY = re.compile(r"^session_(\d+)$")
DIA_ID = re.compile(r"^D(\d+):(\d+)$")


@pytest.fixture(scope="module")
def sample() -> dict:
    data = json.loads(DEMO.read_text(encoding="utf-8"))
    assert isinstance(data, list) and len(data) == 1, "expected a list with one sample"
    return data[0]


def _sessions(conv: dict) -> dict[int, list[dict]]:
    return {int(m.group(1)): v for k, v in conv.items() if (m := SESSION_KEY.match(k))}


def test_file_is_small_enough_to_ship() -> None:
    assert DEMO.is_file()
    assert len(DEMO.read_bytes()) < 150_000


def test_sample_header(sample: dict) -> None:
    assert sample["sample_id"] == "demo-trip"
    conv = sample["conversation"]
    assert conv["speaker_a"] == "User"
    assert conv["speaker_b"] == "Agent"


def test_sessions_are_numbered_and_dated(sample: dict) -> None:
    conv = sample["conversation"]
    sessions = _sessions(conv)
    assert len(sessions) >= 8
    assert sorted(sessions) == list(range(1, len(sessions) + 1)), "session numbers must be 1..N"
    dates = []
    for n in sessions:
        raw = conv[f"session_{n}_date_time"]
        # LoCoMo's format, e.g. "1:56 pm on 8 May, 2023".
        dates.append(datetime.strptime(raw, "%I:%M %p on %d %B, %Y"))
    assert dates == sorted(dates), "sessions must be in chronological order"


def test_turns_are_well_formed(sample: dict) -> None:
    conv = sample["conversation"]
    speakers = {conv["speaker_a"], conv["speaker_b"]}
    seen: set[str] = set()
    total = 0
    for n, turns in _sessions(conv).items():
        assert turns, f"session_{n} is empty"
        for i, turn in enumerate(turns, 1):
            assert set(turn) >= {"speaker", "dia_id", "text"}, turn
            assert turn["speaker"] in speakers, turn
            assert isinstance(turn["text"], str) and turn["text"].strip(), turn
            # ids follow LoCoMo's D<session>:<turn> numbering, so evidence can be located.
            assert turn["dia_id"] == f"D{n}:{i}", turn["dia_id"]
            assert turn["dia_id"] not in seen, f"duplicate dia_id {turn['dia_id']}"
            seen.add(turn["dia_id"])
            total += 1
    assert total >= 250


def test_turn_texts_are_not_repeated(sample: dict) -> None:
    texts = [t["text"] for turns in _sessions(sample["conversation"]).values() for t in turns]
    dupes = {t for t in texts if texts.count(t) > 1 and len(t) > 20}
    assert not dupes, f"repeated turns: {sorted(dupes)[:3]}"


def test_agent_tool_and_reflection_turns_present(sample: dict) -> None:
    turns = [t for ts in _sessions(sample["conversation"]).values() for t in ts]
    tools = [t for t in turns if t["text"].startswith("[tool: ")]
    reflections = [t for t in turns if t["text"].startswith("[reflection] ")]
    assert len(tools) >= 20 and len(reflections) >= 5
    assert all(t["speaker"] == "Agent" for t in tools + reflections)


def test_qa_evidence_exists(sample: dict) -> None:
    qa = sample["qa"]
    assert len(qa) >= 12
    ids = {t["dia_id"] for ts in _sessions(sample["conversation"]).values() for t in ts}
    for item in qa:
        assert item["question"].strip() and str(item["answer"]).strip(), item
        assert item["category"] in {1, 2, 3, 4}, item
        assert item["evidence"], item
        for ev in item["evidence"]:
            assert DIA_ID.match(ev) and ev in ids, f"unknown evidence {ev!r} in {item['question']!r}"
    assert {item["category"] for item in qa} == {1, 2, 3, 4}
