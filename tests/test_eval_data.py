"""Loading LoCoMo-format data."""

import json
from pathlib import Path

import pytest

from clag_fast.locomo import UNANSWERABLE, load_dataset, normalize_evidence, parse_samples

TINY = Path(__file__).parent / "data" / "tiny_locomo.json"


def _sample(**over):
    s = {
        "sample_id": "s1",
        "conversation": {
            "speaker_a": "A",
            "speaker_b": "B",
            "session_2_date_time": "2 pm on 2 May, 2023",
            "session_2": [{"speaker": "B", "dia_id": "D2:1", "text": "later"}],
            "session_1_date_time": "1 pm on 1 May, 2023",
            "session_1": [
                {"speaker": "A", "dia_id": "D1:1", "text": "hello"},
                {"speaker": "B", "dia_id": "D1:2", "text": "look", "blip_caption": "a photo of a cat"},
            ],
        },
        "qa": [
            {"question": "q1?", "answer": 2022, "evidence": ["D1:1"], "category": 2},
            {"question": "q2?", "evidence": ["D1:2"], "category": 5, "adversarial_answer": "x"},
        ],
    }
    s.update(over)
    return s


def test_tiny_file_loads():
    (s,) = load_dataset(TINY)
    assert s.sample_id == "tiny-1"
    assert len(s.turns) == 41
    assert {t.session for t in s.turns} == {1, 2, 3}
    assert len(s.qa) == 10
    # every evidence id of the tiny file resolves, after normalising "D:1:4; D2:05"
    assert all(set(q.evidence) <= s.dia_ids() for q in s.qa)
    assert s.qa[8].evidence == ("D1:4", "D2:5")
    assert s.qa[9].adversarial and s.qa[9].answer == UNANSWERABLE


def test_sessions_in_numeric_order_with_dates_and_memory_text():
    (s,) = parse_samples([_sample()])
    assert [t.dia_id for t in s.turns] == ["D1:1", "D1:2", "D2:1"]
    assert s.turns[0].date_time == "1 pm on 1 May, 2023"
    assert s.turns[0].memory_text() == "A: hello"
    assert s.turns[1].memory_text() == "B: look [shares a photo: a photo of a cat]"
    md = s.turns[2].metadata()
    assert md == {"dia_id": "D2:1", "speaker": "B", "session": 2, "date": "2 pm on 2 May, 2023"}


def test_answers_categories_and_adversarial_items():
    (s,) = parse_samples([_sample()])
    assert s.qa[0].answer == "2022" and s.qa[0].category == "2" and not s.qa[0].adversarial
    assert s.qa[1].answer == UNANSWERABLE and s.qa[1].adversarial


@pytest.mark.parametrize(
    "raw, expected",
    [
        (["D1:3"], ["D1:3"]),
        (["D8:6; D9:17"], ["D8:6", "D9:17"]),
        (["D9:1 D4:4 D4:6"], ["D9:1", "D4:4", "D4:6"]),
        (["D:11:26"], ["D11:26"]),
        (["D30:05"], ["D30:5"]),
        (["D", "D1:1", "D1:1"], ["D1:1"]),
        ([], []),
        (None, []),
    ],
)
def test_normalize_evidence(raw, expected):
    assert normalize_evidence(raw) == expected


@pytest.mark.parametrize(
    "data, message",
    [
        ({"not": "a list"}, "JSON list of samples"),
        ([_sample(conversation=None)], r"sample 0 \(s1\): missing or invalid 'conversation'"),
        ([_sample(conversation={"speaker_a": "A"})], "no session_N"),
        ([_sample(conversation={"session_1": [{"speaker": "A", "text": "x"}]})], r"session_1\[0\] needs"),
        ([_sample(qa=[{"question": "q", "category": 1, "evidence": []}])], "neither 'answer' nor"),
        ([_sample(qa=[{"answer": "a"}])], r"qa\[0\] needs a string 'question'"),
        ([_sample(qa=[{"question": "q", "answer": "a", "evidence": 5}])], "evidence must be a list"),
    ],
)
def test_bad_input_names_the_problem(data, message):
    with pytest.raises(ValueError, match=message):
        parse_samples(data)


def test_load_dataset_reports_bad_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_dataset(p)
    p.write_text(json.dumps([_sample(qa="nope")]))
    with pytest.raises(ValueError, match=r"bad.json: sample 0 \(s1\): 'qa' must be a list"):
        load_dataset(p)


def _ids_sample(turn_ids, evidence):
    return parse_samples([{
        "sample_id": "ids",
        "conversation": {"session_1": [{"speaker": "A", "dia_id": d, "text": f"text {i}"}
                                       for i, d in enumerate(turn_ids)]},
        "qa": [{"question": f"q{i}?", "answer": "a", "evidence": ev, "category": 1} for i, ev in enumerate(evidence)],
    }])[0]


def test_evidence_is_matched_as_written_first_then_normalised():
    s = _ids_sample(["0:1", "0:19", "D2:3", "D1:05", "D1:5"],
                    [["0:19"], ["D:2:03"], ["D1:05"], ["D1:005"], ["0:2"], ["0:19", "D2:3"], "0:1"])
    got = [s.resolve_evidence(q) for q in s.qa]
    assert got == [
        {"0:19"},  # another id scheme: exact match
        {"D2:3"},  # LoCoMo typo, normalised
        {"D1:05"},  # exact match wins over the canonical "D1:5"
        {"D1:5"},  # normalised: the turn written canonically is chosen
        set(),  # names no turn
        {"0:19", "D2:3"},
        {"0:1"},  # a bare string is one id
    ]
    assert s.qa[0].raw_evidence == ("0:19",) and s.qa[0].evidence == ()  # no D-form id in it
