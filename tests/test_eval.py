"""``clag-fast eval`` end to end on the tiny LoCoMo-format file (vector-only, and QA against a
fake OpenAI-compatible server).

The runs use ``--embedder hash`` (feature-hashed bag of words): deterministic, no model files,
thousands of texts per second, so the whole file runs in about a second. The real MiniLM path
is the same code with another ``encode``; it is measured by the full LoCoMo run recorded in
BENCHMARKS.md.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from clag_fast.eval.runner import HashingEmbedder, add_eval_parser, main, run_eval
from clag_fast.eval.data import load_dataset
from clag_fast.eval.metrics import recall_at_k

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
    t0 = time.perf_counter()
    rc = main([str(TINY), "--embedder", "hash", "--out", str(tmp_path), "--no-progress", *CLUSTERED_ARGS])
    elapsed = time.perf_counter() - t0
    assert rc == 0
    assert elapsed < 30, f"the tiny file should run in seconds, took {elapsed:.1f}s"
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
    assert org["llm_calls_per_memory"] == 0


def test_flat_recall_matches_brute_force(tmp_path):
    """The report's flat Recall@10 equals a numpy brute force over the same vectors."""
    report = run_eval(TINY, out_dir=None, embedder="hash", progress=False, store_options=CLUSTERED)
    (s,) = load_dataset(TINY)
    emb = HashingEmbedder()
    mem = emb.encode([t.memory_text() for t in s.turns])
    qv = emb.encode([q.question for q in s.qa])
    recalls = []
    for q, v in zip(s.qa, qv):
        top = np.argsort(-(mem @ v), kind="stable")[:10]
        recalls.append(recall_at_k([s.turns[i].dia_id for i in top], set(q.evidence), 10))
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
        ({"llm": 42}, "llm must be None"),
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
    """Answers an eval answer prompt with the gold answer of its question (plain text, plus a
    second line the eval must drop); anything else
    (the store's organisation prompts) gets an empty JSON object, which fails their schemas,
    so the store falls back to vector decisions."""

    gold: dict[str, str] = {}
    answered = 0

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
            question = prompt.split("\nQuestion: ", 1)[1].split("\n", 1)[0]
            content = self.gold.get(question, "") + "\nThis is the answer."  # only line 1 counts
            type(self).answered += 1
        self._send({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


@pytest.fixture
def fake_slm():
    (s,) = load_dataset(TINY)
    _FakeSLM.gold = {q.question: q.answer for q in s.qa}
    _FakeSLM.answered = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSLM)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_qa_questions_bounds_answers_not_retrieval(fake_slm):
    rep = run_eval(TINY, out_dir=None, embedder="hash", progress=False, llm=fake_slm, n_probe=[2],
                   qa_modes=["two_stage"], qa_questions=3)
    assert _FakeSLM.answered == 3 * 2  # 3 questions, one mode, two organisations
    assert rep["qa"]["vector/two_stage@auto"]["questions"] == 3
    assert rep["retrieval"]["vector/flat-vector"]["questions"] == 10


def test_qa_metrics_with_an_slm_server(fake_slm, tmp_path):
    rep = run_eval(TINY, out_dir=tmp_path, embedder="hash", progress=False, llm=fake_slm,
                   store_options=CLUSTERED, n_probe=[2, 4], plots=False)
    assert set(rep["organisation"]) == {"vector", "slm"}
    assert {n.split("/")[0] for n in rep["retrieval"]} == {"vector", "slm"}
    # every question answered once per (organisation, qa mode), all with the gold answer
    assert _FakeSLM.answered == 10 * 2 * 2
    assert sorted(rep["qa"]) == ["slm/flat", "slm/two_stage@auto", "vector/flat", "vector/two_stage@auto"]
    for name, q in rep["qa"].items():
        assert q["questions"] == 10
        assert q["f1"] == pytest.approx(1.0) and q["bleu1"] == pytest.approx(1.0), name
        assert set(q["by_category"]) == {"1", "2", "3", "4", "5"}
    for org in ("vector", "slm"):
        assert rep["organisation"][org]["llm_calls_per_question_answer"] == pytest.approx(2.0)
    assert rep["organisation"]["vector"]["llm_calls_per_memory"] == 0
    answers = [a for rec in rep["per_sample"] for a in rec["answers"]]
    assert len(answers) == 40
    assert all(a["prediction"] == a["gold"] and a["f1"] == 1.0 for a in answers)  # 2nd line dropped
    assert json.loads((tmp_path / "eval.json").read_text())["per_sample"][0]["answers"][0]["gold"]
    md = (tmp_path / "eval.md").read_text()
    assert "| slm/two_stage@auto | 10 | 1.000 | 1.000 |" in md


def test_clag_fast_eval_subcommand(tmp_path, capsys):
    """The same run through the `clag-fast` command's `eval` subcommand (cli.py wires it)."""
    from clag_fast.cli import main as clag_fast_main

    rc = clag_fast_main(["eval", str(TINY), "--embedder", "hash", "--out", str(tmp_path), "--no-progress",
                         "--no-plots", *CLUSTERED_ARGS])
    assert rc == 0
    assert "| vector/two_stage-hybrid@8 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "eval.json").read_text())["counts"]["memories"] == 41
