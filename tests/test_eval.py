"""``clag-fast eval`` end to end on the tiny LoCoMo-format file (vector-only, and QA against a
fake OpenAI-compatible server).

The runs use ``--embedder hash`` (feature-hashed bag of words): deterministic, no model files,
thousands of texts per second, so the whole file runs in about a second. The real MiniLM path
is the same code with another ``encode``; it is measured by the full LoCoMo run recorded in
BENCHMARKS.md.
"""

import argparse
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from clag_fast.eval.runner import HashingEmbedder, add_eval_parser, main, run_eval
from clag_fast.locomo import load_dataset

TINY = Path(__file__).parent / "data" / "tiny_locomo.json"
# 41 memories: cluster from 10 on, ~5 clusters, so two_stage really prunes.
CLUSTERED = {"min_memories_to_cluster": 10, "target_cluster_size": 8}
CLUSTERED_ARGS = ["--store-option", "min_memories_to_cluster=10", "--store-option", "target_cluster_size=8"]
N_PROBES = ["auto", 2, 4, 8, 16]  # the eval's default list


def test_hashing_embedder_is_normalised_deterministic_and_lexical():
    emb = HashingEmbedder()
    v = emb.encode(["Tom adopted a cat named Pepper", "Pepper the cat", "marathon training", "", "!!"])
    assert v.shape == (5, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(v, emb.encode(["Tom adopted a cat named Pepper", "Pepper the cat", "marathon training", "", "!!"]))
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2
    with pytest.raises(ValueError, match="text 1 is int"):
        emb.encode(["ok", 3])


def test_cli_runs_tiny_file_end_to_end(tmp_path, capsys):
    rc = main([str(TINY), "--embedder", "hash", "--out", str(tmp_path), "--no-progress", *CLUSTERED_ARGS])
    assert rc == 0
    for name in ("eval.json", "eval.md", "recall_vs_fraction.png", "cluster_sizes.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "recall_vs_fraction.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((tmp_path / "eval.json").read_text())
    out = capsys.readouterr().out
    assert "| vector/flat-vector |" in out and "| vector/two_stage-hybrid@auto |" in out

    ret = report["retrieval"]
    assert sorted(ret) == sorted(["vector/flat-vector", "vector/flat-hybrid", "vector/two_stage-vector@auto"]
                              + [f"vector/two_stage-hybrid@{p}" for p in N_PROBES])
    assert report["counts"] == {"samples": 1, "memories": 41, "questions": 10,
                                "questions_without_resolvable_evidence": 0}
    for name, r in ret.items():
        assert r["questions"] == 10, name
        for m in ("recall@5", "recall@10", "precision@5", "ndcg@10", "search_fraction"):
            assert 0.0 <= r[m] <= 1.0, (name, m)
        assert r["recall@5"] <= r["recall@10"]
        assert r["latency_ms_p50"] <= r["latency_ms_p99"]
    assert ret["vector/flat-vector"]["search_fraction"] == ret["vector/flat-hybrid"]["search_fraction"] == 1.0
    # the store clustered itself, and probing one cluster scans less than everything
    org = report["organisation"]["vector"]
    assert org["clusters_per_sample"][0] >= 2
    assert sum(org["cluster_sizes"]) >= 41  # soft assignment may list a memory twice
    assert ret["vector/two_stage-vector@auto"]["search_fraction"] < 1.0
    fracs = [ret[f"vector/two_stage-hybrid@{p}"]["search_fraction"] for p in N_PROBES[1:]]
    assert fracs == sorted(fracs), "more probes never scan less"
    assert report["qa"] == {}  # no SLM given
    assert org["slm_calls_per_memory"] == 0


def test_flat_recall_matches_brute_force(tmp_path):
    """The report's flat Recall@10 equals a numpy brute force over the same vectors."""
    report = run_eval(TINY, out_dir=None, embedder="hash", progress=False, store_options=CLUSTERED)
    (s,) = load_dataset(TINY)
    emb = HashingEmbedder()
    mem = emb.encode([t.memory_text() for t in s.turns])
    qv = emb.encode([q.question for q in s.qa])
    recalls = []
    for q, v in zip(s.qa, qv):
        top = {s.turns[i].dia_id for i in np.argsort(-(mem @ v), kind="stable")[:10]}
        rel = s.resolve_evidence(q)
        recalls.append(len(top & rel) / len(rel))  # by hand, not with the package's recall_at_k
    assert report["retrieval"]["vector/flat-vector"]["recall@10"] == pytest.approx(np.mean(recalls))
    assert report["retrieval"]["vector/flat-vector"]["recall@10"] >= 0.5  # lexical overlap finds most evidence


def test_vector_only_run_is_deterministic():
    kw = dict(out_dir=None, embedder="hash", progress=False, store_options=CLUSTERED, n_probe=[1, 2])
    a, b = run_eval(TINY, **kw), run_eval(TINY, **kw)
    strip = lambda rep: {n: {m: v for m, v in r.items() if "latency" not in m} for n, r in rep["retrieval"].items()}
    assert strip(a) == strip(b)
    assert a["organisation"]["vector"]["cluster_sizes"] == b["organisation"]["vector"]["cluster_sizes"]


def test_max_questions_and_samples_bound_the_run():
    rep = run_eval(TINY, out_dir=None, embedder="hash", progress=False, max_questions=3, samples="tiny-1",
                   n_probe=[2])
    assert rep["counts"]["questions"] == 3
    assert sorted(rep["retrieval"]) == ["vector/flat-hybrid", "vector/flat-vector", "vector/two_stage-hybrid@2",
                                       "vector/two_stage-vector@auto"]
    assert rep["retrieval"]["vector/flat-vector"]["questions"] == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"samples": "nope"}, "no sample with id or index 'nope'"),
        ({"samples": 0}, "--samples must be >= 1"),
        ({"max_questions": 0}, "max_questions must be >= 1"),
        ({"qa_questions": 0}, "qa_questions must be >= 1"),
        ({"n_probe": [-1, 2]}, "n_probe values must be >= 1"),
        ({"store_options": {"bogus": 1}}, "store option"),
        ({"qa_modes": ["fast"]}, "unknown search mode 'fast'"),
        ({"embedder": "word2vec"}, "embedder must be"),
        ({"slm": 42}, "slm must be None"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_eval(TINY, out_dir=None, embedder=kwargs.pop("embedder", "hash"), progress=False, **kwargs)


def test_cli_reports_errors_with_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing.json"), "--embedder", "hash", "--no-progress"]) == 2
    assert "clag-fast eval: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(TINY), "--n-probe", "1,x"])


def test_add_eval_parser_wires_a_subcommand(tmp_path):
    parser = argparse.ArgumentParser(prog="clag-fast")
    sub = parser.add_subparsers(dest="command")
    add_eval_parser(sub)
    args = parser.parse_args(["eval", str(TINY), "--embedder", "hash", "--n-probe", "1,2", "--out",
                              str(tmp_path), "--no-progress", "--no-plots", "--max-questions", "2"])
    assert args.n_probe == [1, 2] and args.max_questions == 2
    assert args.func(args) == 0
    assert (tmp_path / "eval.json").exists() and not (tmp_path / "cluster_sizes.png").exists()


# --- QA with an SLM: a fake OpenAI-compatible server -----------------------------------


class _FakeSLM(BaseHTTPRequestHandler):
    """Answers an eval answer prompt with ``reply(question)`` (default: the gold answer of its
    question; plain text, plus a second line the eval must drop); anything else (the store's
    organisation prompts) gets an empty JSON object, which fails their schemas, so the store
    falls back to vector decisions. ``asked`` keeps every answer request's body."""

    gold: dict[str, str] = {}
    answered = 0
    asked: list = []
    reply = None  # question -> answer text; None: the gold answer

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "fake-slm", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        content = "{}"
        if "\nQuestion: " in prompt:
            line = prompt.split("\nQuestion: ", 1)[1].split("\n", 1)[0]
            question = line.split(" Select the correct answer:", 1)[0]  # LoCoMo's category-5 form
            reply = type(self).reply
            answer = self.gold.get(question, "") if reply is None else reply(question)
            content = answer + "\nThis is the answer."  # only line 1 counts
            type(self).answered += 1
            type(self).asked.append(body)
        self._send({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


@pytest.fixture
def fake_slm():
    (s,) = load_dataset(TINY)
    _FakeSLM.gold = {q.question: q.answer for q in s.qa}
    _FakeSLM.answered = 0
    _FakeSLM.asked = []
    _FakeSLM.reply = None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSLM)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_qa_questions_bounds_answers_not_retrieval(fake_slm):
    rep = run_eval(TINY, out_dir=None, embedder="hash", progress=False, slm=fake_slm, n_probe=[2],
                   qa_modes=["two_stage"], qa_questions=3)
    assert _FakeSLM.answered == 3 * 2  # 3 questions, one mode, two organisations
    assert rep["qa"]["vector/two_stage@auto"]["questions"] == 3
    assert rep["retrieval"]["vector/flat-vector"]["questions"] == 10


def test_qa_metrics_with_an_slm_server(fake_slm, tmp_path):
    """A model right on categories 1 and 4 (7 questions of the tiny file), wrong ("zebra") on
    categories 2 and 3 (one each), abstaining on the adversarial one: by hand, F1 = BLEU-1 =
    7/9 over categories 1-4, adversarial accuracy 1/1 beside it."""
    (s,) = load_dataset(TINY)
    cat = {q.question: q.category for q in s.qa}
    _FakeSLM.reply = lambda q: "zebra" if cat[q] in ("2", "3") else _FakeSLM.gold[q]
    rep = run_eval(TINY, out_dir=tmp_path, embedder="hash", progress=False, slm=fake_slm,
                   store_options=CLUSTERED, n_probe=[2, 4], plots=False)
    assert set(rep["organisation"]) == {"vector", "slm"}
    assert {n.split("/")[0] for n in rep["retrieval"]} == {"vector", "slm"}
    # every question answered once per (organisation, qa mode)
    assert _FakeSLM.answered == 10 * 2 * 2
    assert sorted(rep["qa"]) == ["slm/flat", "slm/two_stage@auto", "vector/flat", "vector/two_stage@auto"]
    for name, q in rep["qa"].items():
        assert q["questions"] == 9 and q["adversarial_questions"] == 1, name
        assert q["f1"] == pytest.approx(7 / 9) and q["bleu1"] == pytest.approx(7 / 9), name
        assert q["adversarial_accuracy"] == 1.0
        assert {c: b["f1"] for c, b in q["by_category"].items()} == {"1": 1.0, "2": 0.0, "3": 0.0, "4": 1.0, "5": 1.0}
    for org in ("vector", "slm"):
        assert rep["organisation"][org]["slm_calls_per_question_answer"] == pytest.approx(2.0)
    assert rep["organisation"]["vector"]["slm_calls_per_memory"] == 0
    answers = [a for rec in rep["per_sample"] for a in rec["answers"]]
    assert len(answers) == 40
    right = [a for a in answers if a["category"] not in ("2", "3")]
    assert all(a["prediction"] == a["gold"] and a["f1"] == 1.0 for a in right)  # 2nd line dropped
    assert all(a["prediction"] == "zebra" and a["f1"] == 0.0 for a in answers if a not in right)
    assert json.loads((tmp_path / "eval.json").read_text())["per_sample"][0]["answers"][0]["gold"]
    md = (tmp_path / "eval.md").read_text()
    assert "| slm/two_stage@auto | 9 | 0.778 | 0.778 | 1.000 (1) |" in md


def test_adversarial_scoring_by_hand():
    """Category 5: 1 for any abstention LoCoMo accepts, whatever the wording, 0 otherwise;
    other categories keep token F1 / BLEU-1 (an abstention there scores 0)."""
    from clag_fast.eval.answer import score_answer
    from clag_fast.locomo import UNANSWERABLE

    for reply in ("No information available.", "It is not mentioned.", "(a) Not mentioned in the conversation"):
        assert score_answer(reply, UNANSWERABLE, "5") == (1.0, 1.0), reply
    for reply in ("cello", "(b) cello", "", "It was mentioned: cello"):
        assert score_answer(reply, UNANSWERABLE, "5") == (0.0, 0.0), reply
    assert score_answer("No information available", UNANSWERABLE, "none", adversarial=True) == (1.0, 1.0)
    assert score_answer("Not mentioned", "Paris", "1") == (0.0, 0.0)
    assert score_answer("Paris", "Paris", "4") == (1.0, 1.0)
    assert score_answer("red car", "blue car", "2") == (0.5, 0.5)  # 1 of 2 tokens each way


def test_adversarial_questions_follow_the_locomo_protocol(fake_slm):
    """Category 5 is a two-way choice scored by abstention, and it stays out of the headline:
    a model that always abstains scores 0 on the answerable questions, one that takes the
    trap answer scores 0 on the adversarial one."""
    from clag_fast.eval.answer import ANSWER_SYSTEM

    kw = dict(out_dir=None, embedder="hash", progress=False, slm=fake_slm, n_probe=[2], qa_modes=["flat"])
    _FakeSLM.reply = lambda q: "Not mentioned in the conversation"
    rep = run_eval(TINY, **kw)
    # by hand: only "in" is shared with a gold answer ("in a vineyard near Porto": 1 of 4 tokens
    # each way, F1 = BLEU-1 = 1/4); every other answerable question scores 0
    for q in rep["qa"].values():
        assert q["f1"] == pytest.approx(0.25 / 9) and q["bleu1"] == pytest.approx(0.25 / 9)
        assert q["adversarial_accuracy"] == 1.0
    adv = [b for b in _FakeSLM.asked if "What instrument did Tom learn" in b["messages"][-1]["content"]]
    assert adv, "the adversarial question was asked"
    prompt = adv[0]["messages"][-1]["content"]
    assert "Select the correct answer: (a) " in prompt and "cello" in prompt  # both options offered
    assert "Not mentioned in the conversation" in prompt
    assert "not mentioned" not in ANSWER_SYSTEM.lower(), "the system prompt must not hand out the gold"
    other = [b for b in _FakeSLM.asked
             if "\nQuestion: What is the name of the cat Tom adopted?\n" in b["messages"][-1]["content"]]
    assert other and "Select the correct answer" not in other[0]["messages"][-1]["content"]
    _FakeSLM.reply = lambda q: "cello"
    rep = run_eval(TINY, **kw)
    for q in rep["qa"].values():
        assert q["adversarial_accuracy"] == 0.0 and q["by_category"]["5"]["bleu1"] == 0.0


def test_clag_fast_eval_subcommand(tmp_path, capsys):
    """The same run through the `clag-fast` command's `eval` subcommand (cli.py wires it)."""
    from clag_fast.cli import main as clag_fast_main

    rc = clag_fast_main(["eval", str(TINY), "--embedder", "hash", "--out", str(tmp_path), "--no-progress",
                         "--no-plots", *CLUSTERED_ARGS])
    assert rc == 0
    assert "| vector/two_stage-hybrid@8 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "eval.json").read_text())["counts"]["memories"] == 41


# --- hand-computed retrieval metrics, turn ids not in LoCoMo's form ---------------------


class _DictEmbedder:
    """Vectors chosen by hand: turn i is the unit vector e_i; a question is a weighted sum that
    puts the turns in a stated order (weights 12, 11, ... 1, all distinct, so cosines tie never)."""

    dim = 16

    def __init__(self, vectors: dict):
        self.vectors = vectors

    def encode(self, texts):
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)


def _ranked_fixture(tmp_path):
    n = 12
    turns = [{"speaker": "A", "dia_id": f"0:{i}", "text": f"turn number {i}"} for i in range(1, n + 1)]
    vecs = {f"A: turn number {i}": np.eye(16)[i - 1] for i in range(1, n + 1)}

    def query(order):  # order: turn numbers, best first (the rest follow in numeric order)
        order = order + [i for i in range(1, n + 1) if i not in order]
        v = sum((n - r) * np.eye(16)[t - 1] for r, t in enumerate(order))
        return v / np.linalg.norm(v)

    qa = [
        # evidence 0:3 at rank 1 -> R@5 = R@10 = 1, P@5 = 1/5
        ("where first?", ["0:3"], [3]),
        # evidence 0:5 at rank 2 and 0:7 at rank 8 -> R@5 = 1/2, R@10 = 1, P@5 = 1/5
        ("where second?", ["0:5", "0:7"], [1, 5, 2, 3, 4, 6, 8, 7]),
        # evidence 0:9 at rank 11 -> R@5 = R@10 = 0, P@5 = 0
        ("where third?", ["0:9"], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 9]),
        # evidence at ranks 5 and 6, either side of the cut -> R@5 = 1/2, R@10 = 1, P@5 = 1/5
        ("where fifth?", ["0:11", "0:12"], [1, 2, 3, 4, 11, 12]),
        # evidence naming no turn: left out of the retrieval metrics
        ("where fourth?", ["0:99"], [1]),
    ]
    for q, _, order in qa:
        vecs[q] = query(order)
    data = [{"sample_id": "ranked", "conversation": {"session_1": turns},
             "qa": [{"question": q, "answer": "x", "evidence": ev, "category": 1} for q, ev, _ in qa]}]
    path = tmp_path / "ranked.json"
    path.write_text(json.dumps(data))
    return path, _DictEmbedder(vecs)


def test_recall_by_hand_on_ids_in_another_scheme(tmp_path):
    path, emb = _ranked_fixture(tmp_path)
    rep = run_eval(path, out_dir=tmp_path / "out", embedder=emb, progress=False, n_probe=[2])
    assert rep["counts"]["questions_without_resolvable_evidence"] == 1
    r = rep["retrieval"]["vector/flat-vector"]
    assert r["questions"] == 4
    assert r["recall@5"] == pytest.approx((1 + 0.5 + 0 + 0.5) / 4)
    assert r["recall@10"] == pytest.approx((1 + 1 + 0 + 1) / 4)
    assert r["precision@5"] == pytest.approx((0.2 + 0.2 + 0 + 0.2) / 4)
    # nDCG@10 with 2 relevant: ideal 1 + 1/log2 3; ranks 2 and 8, and ranks 5 and 6
    ideal = 1 + 1 / math.log2(3)
    second = (1 / math.log2(3) + 1 / math.log2(9)) / ideal
    fifth = (1 / math.log2(6) + 1 / math.log2(7)) / ideal
    assert r["ndcg@10"] == pytest.approx((1 + second + 0 + fifth) / 4)
    assert r["search_fraction"] == 1.0
    assert (tmp_path / "out" / "recall_vs_fraction.png").stat().st_size > 0


def test_no_resolvable_evidence_is_a_clear_error(tmp_path):
    data = json.loads(TINY.read_text())
    for q in data[0]["qa"]:
        q["evidence"] = ["turn-7"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"no question's evidence matches a turn id.*'turn-7'.*'D1:1'"):
        run_eval(bad, out_dir=None, embedder="hash", progress=False)


# --- the QA table ------------------------------------------------------------------------


def test_select_questions_is_stratified_and_fixed():
    from clag_fast.locomo import parse_samples
    from clag_fast.eval.qa import select_questions

    cats = [1] * 5 + [2] * 5 + [3]
    data = [{"sample_id": f"s{j}", "conversation": {"session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "t"}]},
             "qa": [{"question": f"q{j}-{i}", "answer": "a", "evidence": [], "category": c}
                    for i, c in enumerate(cats)]} for j in range(2)]
    samples = parse_samples(data)
    picked = select_questions(samples, 6, seed=0)
    by_cat = [samples[si].qa[qi].category for si, qi in picked]
    assert sorted(by_cat) == ["1", "1", "2", "2", "3", "3"]  # ceil(6 / 3) = 2 per category
    assert picked == sorted(picked) == select_questions(parse_samples(data), 6, seed=0)
    assert len(select_questions(samples, 100, seed=0)) == 22  # every question, none twice


def _qa_records():
    """Three questions by hand. flat_vector: F1 .5/1/0, BLEU-1 .5/1/0. clag: F1 1/0/(2/3),
    BLEU-1 1/0/exp(-1) ("three" against "three dogs": precision 1, brevity penalty e^(1-2/1))."""
    rows = [
        ("q1", "1", "red car", {"flat_vector": "blue car", "clag": "red car"}),
        ("q2", "1", "Paris", {"flat_vector": "Paris", "clag": "London"}),
        ("q3", "2", "three dogs", {"flat_vector": "", "clag": "three"}),
    ]
    return [{"config": c, "sample_id": "s", "qa_index": i, "category": cat, "question": q, "gold": gold,
             "answer": ans, "f1": -1.0, "bleu1": -1.0}
            for i, (q, cat, gold, answers) in enumerate(rows) for c, ans in answers.items()]


def test_summarize_recomputes_the_table_by_hand(tmp_path, capsys):
    from clag_fast.eval.qa import main as qa_main
    from clag_fast.eval.qa import summarize

    s = summarize(_qa_records())
    flat, clag = s["configs"]["flat_vector"], s["configs"]["clag"]
    assert (flat["n"], flat["f1"], flat["bleu1"]) == (3, pytest.approx(0.5), pytest.approx(0.5))
    assert clag["f1"] == pytest.approx((1 + 0 + 2 / 3) / 3)
    assert clag["bleu1"] == pytest.approx((1 + 0 + np.exp(-1)) / 3)
    assert flat["by_category"]["1"] == {"n": 2, "f1": pytest.approx(0.75), "bleu1": pytest.approx(0.75)}
    assert clag["by_category"]["2"]["f1"] == pytest.approx(2 / 3)
    d = s["differences"]["clag - flat_vector"]["all"]["f1"]
    assert d["n"] == 3 and d["mean"] == pytest.approx((0.5 - 1 + 2 / 3) / 3)
    assert -1 <= d["lo"] <= d["mean"] <= d["hi"] <= 2 / 3  # a bootstrap mean lies within the data
    assert summarize(_qa_records()) == s  # the seed fixes the interval
    assert summarize(_qa_records(), rescore=False)["configs"]["clag"]["f1"] == -1.0  # stored values
    # the command line reads a JSONL; a torn last line (a killed run) is skipped
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _qa_records()) + '{"config": "cl')
    assert qa_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| flat_vector | 3 | 0.500 | 0.500 |" in out and "| clag | 3 | 0.556 | 0.456 |" in out
    assert "| clag - flat_vector | all | 3 | 0.056 [" in out


def test_answer_context_and_extraction():
    from clag_fast.eval.answer import answer_context, extract_answer
    from clag_fast.results import Hit

    hits = [Hit(1, "A: one", 0.9, 7, "pets", ["cat"], "memory", "default", 0.0, {"date": "May 1"}),
            Hit(2, "A: two", 0.8, 3, "", ["work", "job"], "memory", "default", 0.0, None),
            Hit(3, "A: three", 0.7, 7, "pets", ["cat"], "memory", "default", 0.0, None)]
    assert answer_context(hits, grouped=False) == "- (May 1) A: one\n- A: two\n- A: three"
    assert answer_context(hits, grouped=True) == "Topic: pets\n- (May 1) A: one\n- A: three\nTopic: work, job\n- A: two"
    assert answer_context(hits, grouped="tags") == (
        "Topic: cat\n- (May 1) A: one\n- A: three\nTopic: work, job\n- A: two")
    assert extract_answer("Memories:\nTopic: pets\nAnswer: a cat\nmore") == "a cat"
    assert extract_answer("\n\n") == ""


def test_qa_table_end_to_end_jsonl_and_resume(fake_slm, tmp_path, capsys):
    from clag_fast.eval.qa import DEFAULT_QA_CONFIGS, read_jsonl, run_qa_table, summarize

    out = tmp_path / "qa"
    summary = run_qa_table(TINY, out_dir=out, n_questions=5, slm=fake_slm, embedder="hash", progress=False,
                           store_options=CLUSTERED)
    recs = read_jsonl(out / "qa.jsonl")
    # one answer per distinct context: configurations that hand the model the same text share it
    distinct = len({(r["qa_index"], r["context"]) for r in recs})
    assert len(recs) == 5 * len(DEFAULT_QA_CONFIGS) and _FakeSLM.answered == distinct
    assert sorted({r["category"] for r in recs}) == ["1", "2", "3", "4", "5"]  # one per category
    for r in recs:
        assert len(r["retrieved"]) == 10 and {"memory_id", "dia_id", "score", "cluster_id"} <= set(r["retrieved"][0])
        assert r["answer"] == r["gold"] and r["f1"] == 1.0  # the fake SLM answers the gold
        assert ("Topic: " in r["context"]) == (r["config"] == "clag_labels")
    by = {(r["config"], r["qa_index"]): r for r in recs}
    for (c, qi), r in by.items():
        if c == "clag_labels":  # the same hits as clag, only grouped
            assert r["retrieved"] == by[("clag", qi)]["retrieved"]
    assert summary["configs"]["clag_labels"]["f1"] == 1.0
    assert summarize(recs)["configs"] == summary["configs"]
    assert (out / "qa.md").read_text().startswith("| configuration |")
    # a second run resumes: nothing is asked again
    run_qa_table(TINY, out_dir=out, n_questions=5, slm=fake_slm, embedder="hash", progress=False,
                 store_options=CLUSTERED)
    assert _FakeSLM.answered == distinct and len(read_jsonl(out / "qa.jsonl")) == len(recs)
    with pytest.raises(ValueError, match="other parameters"):
        run_qa_table(TINY, out_dir=out, n_questions=6, slm=fake_slm, embedder="hash", progress=False)
    # an extra configuration on its own, read together with the first file
    run_qa_table(TINY, out_dir=tmp_path / "tags", n_questions=5, slm=fake_slm, embedder="hash", progress=False,
                 store_options=CLUSTERED, configs=["clag_tags"])
    tags = read_jsonl(tmp_path / "tags" / "qa.jsonl")
    assert len(tags) == 5 and all(r["config"] == "clag_tags" and "Topic: " in r["context"] for r in tags)
    both = summarize(recs + tags)
    assert set(both["differences"]) == {f"{c} - flat_vector" for c in ("flat_hybrid", "clag", "clag_labels", "clag_tags")}
    with pytest.raises(ValueError, match="unknown"):
        run_qa_table(TINY, out_dir=tmp_path / "x", slm=fake_slm, embedder="hash", configs=["nope"])
    # the CLI path: --qa-table needs --slm
    assert main([str(TINY), "--qa-table", "--embedder", "hash", "--no-progress"]) == 2
    assert "--qa-table needs --slm" in capsys.readouterr().err


def test_report_explains_a_scanned_share_that_falls_with_n_probe():
    from clag_fast.eval.report import _scan_notes

    r = lambda frac, fb: {"search_fraction": frac, "fallback_flat": fb}  # noqa: E731
    notes = _scan_notes({"vector/two_stage-hybrid@2": r(0.446, 0.37), "vector/two_stage-hybrid@4": r(0.154, 0.02),
                         "vector/two_stage-hybrid@8": r(0.186, 0.0), "vector/two_stage-hybrid@auto": r(0.1, 0.0)})
    assert len(notes) == 2 and "44.6% at n_probe 2 but 15.4% at 4: at 2, 37.0%" in notes[1]
    assert _scan_notes({"vector/two_stage-hybrid@2": r(0.1, 0.0), "vector/two_stage-hybrid@4": r(0.2, 0.0)}) == []
