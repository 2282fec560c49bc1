"""The `clag-fast` command: ingest, search, clusters, stats on a store directory."""

from __future__ import annotations

import json

import pytest

from clag_fast.cli import _read_ingest_file, main

FACTS = [
    "The user is allergic to shellfish.",
    "The flight to Tokyo leaves on April 10.",
    {"text": "Maya is vegetarian.", "kind": "user_input", "metadata": {"who": "maya"}},
    "The Kyoto hotel is near the Kamo river.",
]


def test_ingest_search_clusters_stats(tmp_path, capsys):
    data = tmp_path / "facts.json"
    data.write_text(json.dumps(FACTS))
    store = str(tmp_path / "store")
    assert main(["ingest", str(data), "--store", store, "--llm", "off"]) == 0
    assert "added 4 memories" in capsys.readouterr().out
    assert main(["search", "what food is dangerous for the user?", "-k", "1", "--store", store,
                 "--llm", "off", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["text"] for h in hits] == ["The user is allergic to shellfish."]
    assert main(["clusters", "--store", store]) == 0
    assert "0 clusters" in capsys.readouterr().out  # 4 memories: still a flat store
    assert main(["stats", "--store", store]) == 0
    assert json.loads(capsys.readouterr().out)["memories"] == 4


def test_jsonl_and_locomo_inputs(tmp_path):
    jl = tmp_path / "a.jsonl"
    jl.write_text("\n".join(json.dumps(x) for x in FACTS))
    texts, kinds, meta = _read_ingest_file(jl)
    assert len(texts) == 4 and meta[2] == {"who": "maya"}
    loco = [{"sample_id": "x", "conversation": {"speaker_a": "A", "speaker_b": "B",
             "session_1_date_time": "1:00 pm on 1 May, 2023",
             "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi there"},
                           {"speaker": "B", "dia_id": "D1:2", "text": "[tool: x] result"}]}, "qa": []}]
    lf = tmp_path / "l.json"
    lf.write_text(json.dumps(loco))
    texts, kinds, meta = _read_ingest_file(lf)
    assert texts == ["A: hi there", "B: [tool: x] result"]
    assert kinds == ["dialogue", "tool_result"] and meta[0]["dia_id"] == "D1:1"


@pytest.mark.parametrize("content, msg", [("{}", "JSON list"), ("[1, 2]", "item 0")])
def test_bad_ingest_files(tmp_path, capsys, content, msg):
    f = tmp_path / "bad.json"
    f.write_text(content)
    assert main(["ingest", str(f), "--store", str(tmp_path / "s"), "--llm", "off"]) == 2
    assert msg in capsys.readouterr().err


def test_missing_store_is_a_clear_error(tmp_path, capsys):
    assert main(["search", "x", "--store", str(tmp_path / "none"), "--llm", "off"]) == 2
    assert "no store at" in capsys.readouterr().err
