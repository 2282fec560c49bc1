"""The `clag-fast` command: ingest, search, clusters, stats on a store directory."""

from __future__ import annotations

import json
import re

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
    assert main(["ingest", str(data), "--store", store, "--slm", "off"]) == 0
    assert "added 4 memories" in capsys.readouterr().out
    assert main(["search", "what food is dangerous for the user?", "-k", "1", "--store", store,
                 "--slm", "off", "--json"]) == 0
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
    assert main(["ingest", str(f), "--store", str(tmp_path / "s"), "--slm", "off"]) == 2
    assert msg in capsys.readouterr().err


def test_missing_store_is_a_clear_error(tmp_path, capsys):
    assert main(["search", "x", "--store", str(tmp_path / "none"), "--slm", "off"]) == 2
    assert "no store at" in capsys.readouterr().err


# -- the demo: the README's main job, end to end ------------------------------------------
HIT_LINE = re.compile(r"^  ([* ]) (-?\d\.\d{3})  \[(\d+): (.+?) \| (.*)\]$")


def _check_demo_output(out: str, slm_line: str) -> None:
    """The demo's output: the SLM line, the cluster table, and for every question of the demo
    conversation three hits, each shown with the label (and tags, where the cluster has more
    than one distinctive phrase) of a listed cluster, marked when it holds the answer; then
    the count of questions answered in the top three, which the marks add up to."""
    from importlib import resources

    from clag_fast.eval.data import load_dataset

    with resources.as_file(resources.files("clag_fast") / "data" / "demo_trip.json") as p:
        sample = load_dataset(p)[0]
    questions = [q.question for q in sample.qa]

    lines = out.splitlines()
    assert lines[1].startswith(f"SLM: {slm_line}"), lines[1]
    assert re.search(r"^ingested 346 turns", out, re.M)
    n_clusters = int(next(ln for ln in lines if re.fullmatch(r"\d+ clusters", ln)).split()[0])
    assert n_clusters >= 2
    start = lines.index(f"{n_clusters} clusters") + 2
    table = [ln.split() for ln in lines[start:start + n_clusters]]
    listed = {int(row[0]) for row in table}
    assert len(listed) == n_clusters and all(int(row[1]) >= 1 for row in table)
    marked = 0
    for q in questions:
        at = lines.index(f"? {q}")
        hits = [HIT_LINE.match(ln) for ln in lines[at + 1:at + 7:2]]
        assert all(hits), lines[at:at + 8]
        for m in hits:
            assert int(m.group(3)) in listed, "a hit's cluster is one of the listed clusters"
            assert m.group(4) != "(unlabelled)" and m.group(4).strip(), "every answer carries its cluster's label"
            # tags are the next distinctive phrases: a cluster with a single distinctive
            # phrase has none, but what is shown is never a blank entry
            assert not m.group(5) or all(t.strip() for t in m.group(5).split(",")), "tags are phrases"
        marked += any(m.group(1) == "*" for m in hits)
        scores = [float(m.group(2)) for m in hits]
        assert scores == sorted(scores, reverse=True)
        scanned = re.match(r"^  \(scanned (\d+) of (\d+) memories", lines[at + 7])
        assert scanned and int(scanned.group(2)) == 346 and int(scanned.group(1)) < 346, lines[at + 7]
    allergy = lines.index(f"? {questions[0]}")
    answers = " ".join(lines[allergy + 2:allergy + 7:2]).lower()
    assert "shellfish" in answers or "allerg" in answers, answers
    summary = re.search(r"^the turns holding the answer are in the top 3 for (\d+) of (\d+) questions", out, re.M)
    assert summary and int(summary.group(1)) == marked and int(summary.group(2)) == len(questions)
    assert marked >= len(questions) // 2, "most questions find their answer"
    assert re.search(r"^memories 346, clusters \d+", out, re.M)
    # About one cluster per subject of the trip, not one per exchange; labels name topics.
    assert n_clusters <= 30, n_clusters
    quality = re.search(r"^labels: (\d+) clusters of 2\+ members, copies 0 \(0.00\), grounded (\S+), "
                        r"self@1 (\S+), generic (\d+) \((\S+)\), neutral (\d+)$", out, re.M)
    assert quality, out[-600:]
    assert float(quality.group(2)) >= 0.95 and float(quality.group(3)) >= 0.95 and float(quality.group(5)) <= 0.05


@pytest.mark.slow
def test_demo_end_to_end_without_an_slm(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the demo writes its cluster map into the working directory
    assert main(["demo", "--slm", "off"]) == 0
    _check_demo_output(capsys.readouterr().out, "off (vector-only organisation)")


@pytest.mark.slow
@pytest.mark.slm
def test_demo_end_to_end_with_the_managed_slm(capsys, tmp_path, monkeypatch):
    from llm_fixtures import require_slm

    monkeypatch.chdir(tmp_path)  # the demo writes its cluster map into the working directory
    require_slm()
    assert main(["demo", "--slm", "managed"]) == 0  # what no --slm means too (see test_store_managed_slm)
    out = capsys.readouterr().out
    _check_demo_output(out, "not started yet")  # printed before the first add starts it
    calls = re.search(r"^SLM calls (\d+)", out, re.M)
    assert calls and int(calls.group(1)) > 0, "the SLM organised the demo"


# -- command-line options -------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_file():
    from importlib import resources

    with resources.as_file(resources.files("clag_fast") / "data" / "demo_trip.json") as p:
        yield str(p)


@pytest.mark.slow
def test_ingest_namespace_and_organize_then_search_options(tmp_path, capsys, demo_file):
    store = str(tmp_path / "store")
    assert main(["ingest", demo_file, "--store", store, "--slm", "off", "--namespace", "trip"]) == 0
    assert "added 346 memories" in capsys.readouterr().out
    assert main(["clusters", "--store", store]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\d+ clusters", out, re.M)
    before = int(re.search(r"^(\d+) clusters", out, re.M).group(1))
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS))
    assert main(["ingest", str(facts), "--store", store, "--slm", "off", "--namespace", "other", "--organize"]) == 0
    out = capsys.readouterr().out
    assert "added 4 memories" in out and "(350 in total)" in out
    assert re.search(r"reason=explicit.*clusters=\d+", out), out  # the --organize report
    assert main(["clusters", "--store", store]) == 0
    assert int(re.search(r"^(\d+) clusters", capsys.readouterr().out, re.M).group(1)) >= 2 and before >= 2

    def search(*extra):
        assert main(["search", "what is the user allergic to?", "-k", "3", "--store", store, "--slm", "off",
                     "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    other = search("--namespace", "other")
    assert other and {h["namespace"] for h in other} == {"other"}
    assert other[0]["text"] == "The user is allergic to shellfish."
    trip = search("--namespace", "trip")
    assert trip and {h["namespace"] for h in trip} == {"trip"}
    assert search("--namespace", "nobody") == []
    flat, two = search("--mode", "flat"), search("--mode", "two_stage", "--n-probe", "2")
    assert [h["memory_id"] for h in flat] == [h["memory_id"] for h in search("--mode", "flat")]  # exact, stable
    assert len(two) == 3

    def scanned(*extra):
        assert main(["search", "what is the user allergic to?", "--store", store, "--slm", "off", *extra]) == 0
        m = re.search(r"\((\w+): scanned (\d+) of (\d+)", capsys.readouterr().out)
        return m.group(1), int(m.group(2)), int(m.group(3))

    mode, n, of = scanned("--mode", "flat")
    assert mode == "flat" and n == of == 350
    mode, n2, _ = scanned("--mode", "two_stage", "--n-probe", "2")
    mode4, n4, _ = scanned("--mode", "two_stage", "--n-probe", "8")
    assert mode == mode4 == "two_stage" and n2 < n4 < 350
    with pytest.raises(SystemExit):
        main(["search", "x", "--store", store, "--mode", "fast"])
    assert main(["search", "x", "--store", store, "--slm", "off", "--n-probe", "0"]) == 2
    assert "n_probe must be a positive integer" in capsys.readouterr().err


@pytest.mark.slow
def test_slm_url_sends_the_organiser_to_that_server(tmp_path, capsys, demo_file, fake_server):
    """--slm URL: the store's SLM work goes to the given server (here a fake that answers
    nothing usable, so every decision falls back to vectors)."""
    store = str(tmp_path / "store")
    assert main(["ingest", demo_file, "--store", store, "--slm", fake_server.url, "--organize"]) == 0
    assert "added 346 memories" in capsys.readouterr().out
    assert fake_server.chat_requests(), "the organiser asked the given server"
    n = len(fake_server.chat_requests())
    assert main(["search", "which hotel in Kyoto?", "--store", store, "--slm", "off"]) == 0
    assert len(fake_server.chat_requests()) == n, "--slm off asks nobody"


def test_serve_refuses_an_embed_cache_it_could_not_pass_to_ray(tmp_path, capsys):
    rc = main(["serve", "--store", str(tmp_path / "s"), "--ray", "auto", "--embed-cache", "10"])
    assert rc == 2
    assert "--embed-cache" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before anything started or was created
