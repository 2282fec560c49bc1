"""BENCHMARKS.md is rendered from benches/results/*.json, every figure there names its machine
and the command that produced it, and the README's benchmark table quotes BENCHMARKS.md."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))

import record  # noqa: E402
import render  # noqa: E402

DOC = (ROOT / "BENCHMARKS.md").read_text()


def test_benchmarks_md_is_what_the_results_render():
    rendered, changed = render.render(DOC)
    assert changed == [], f"run `python benches/render.py`: out of date in {changed}"
    assert rendered == DOC
    assert render.unused_tables(DOC) == []


def test_every_row_names_a_known_machine_and_its_command():
    machines = record.load("machines")["machines"]
    seen = set()
    for topic in record.topics():
        for name, tab in record.load(topic)["tables"].items():
            assert tab["rows"], f"{topic}/{name} has no rows"
            for row in tab["rows"]:
                where = f"{topic}/{name} {row['key']}"
                assert (topic, name, row["key"]) not in seen, f"{where}: key used twice"
                seen.add((topic, name, row["key"]))
                ids = row["machine"] if isinstance(row["machine"], list) else [row["machine"]]
                assert ids and all(m in machines for m in ids), where
                assert isinstance(row["command"], str) and row["command"].strip(), where
                assert list(row["cells"]) == tab["columns"], where


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A copy of the results directory that record() writes to."""
    copy = tmp_path / "results"
    shutil.copytree(record.RESULTS, copy)
    monkeypatch.setattr(record, "RESULTS", copy)
    return copy


def _cells(tab: dict, value: str) -> dict:
    return {c: value for c in tab["columns"]}


def test_record_replaces_this_machines_row_and_keeps_the_others(results, monkeypatch):
    monkeypatch.setattr(record, "machine_id", lambda machines=None: "xeon-avx512")
    tab = record.load("search")["tables"]["store"]
    others = [r for r in tab["rows"] if r["key"] != "1M@xeon-avx512"]
    key = record.record("search", "store", "1M", _cells(tab, "9.99"), command="python benches/x.py --n 1")
    assert key == "1M@xeon-avx512"
    rows = record.load("search")["tables"]["store"]["rows"]
    mine = [r for r in rows if r["key"] == key]
    assert len(mine) == 1 and set(mine[0]["cells"].values()) == {"9.99"}
    assert mine[0]["command"] == "python benches/x.py --n 1" and mine[0]["machine"] == "xeon-avx512"
    assert [r for r in rows if r["key"] != key] == others
    record.record("search", "store", "2M", _cells(tab, "1.00"), command="python benches/x.py --n 2")
    assert len(record.load("search")["tables"]["store"]["rows"]) == len(rows) + 1


def test_record_drops_the_remeasure_mark_of_the_row_it_replaces(results, monkeypatch):
    monkeypatch.setattr(record, "machine_id", lambda machines=None: "epyc-avx2")
    data = record.load("quality")
    row = next(r for r in data["tables"]["fusion"]["rows"] if r["key"] == "minmax-0.5@epyc-avx2")
    row["remeasure"] = "a change affects this figure"
    record.save("quality", data)
    tab = record.load("quality")["tables"]["fusion"]
    record.record("quality", "fusion", "minmax-0.5", _cells(tab, "0.7"), command="python benches/eval_hybrid.py x")
    row = next(r for r in record.load("quality")["tables"]["fusion"]["rows"] if r["key"] == "minmax-0.5@epyc-avx2")
    assert "remeasure" not in row and set(row["cells"].values()) == {"0.7"}


def test_record_refuses_cells_that_are_not_the_columns(results):
    before = (results / "search.json").read_text()
    tab = record.load("search")["tables"]["store"]
    with pytest.raises(ValueError, match="missing"):
        record.record("search", "store", "1M", {tab["columns"][0]: "1"}, command="x")
    with pytest.raises(ValueError, match="unknown"):
        record.record("search", "store", "1M", {**_cells(tab, "1"), "colour": "red"}, command="x")
    with pytest.raises(KeyError, match="no table"):
        record.record("search", "nope", "1M", {}, command="x")
    assert (results / "search.json").read_text() == before


def test_record_adds_an_unknown_machine(results, monkeypatch):
    monkeypatch.setattr(record, "_cpuinfo", lambda: {"vendor": "ARM", "model": "Neoverse V2", "flags": {"asimd"}})
    tab = record.load("adapters")["tables"]["adapters"]
    key = record.record("adapters", "adapters", "langchain", _cells(tab, "1.1"), command="x")
    mid = key.split("@", 1)[1]
    assert mid.startswith("neoverse-v2-")
    machines = json.loads((results / "machines.json").read_text())["machines"]
    assert machines[mid]["cpu"] == "Neoverse V2"
    assert record.machine_id() == mid


@pytest.mark.parametrize("vendor, flags, want", [
    ("AuthenticAMD", {"avx2", "avx512f", "avx512_vnni"}, "epyc-avx512"),
    ("AuthenticAMD", {"avx2", "fma"}, "epyc-avx2"),
    ("GenuineIntel", {"avx2", "avx512f", "avx512_vnni"}, "xeon-avx512"),
])
def test_machine_id_follows_the_match_rules(vendor, flags, want):
    machines = record.load("machines")["machines"]
    assert record.machine_id(machines, {"vendor": vendor, "model": "x", "flags": flags}, 2) == want
    assert record.machine_id(machines, {"vendor": vendor, "model": "Some CPU", "flags": flags}, 64) == "some-cpu-64c"


def test_render_names_a_missing_table_or_machine():
    with pytest.raises(KeyError, match="no table"):
        render.render("<!-- results: search/nope -->\n<!-- end results -->")
    tab = {"columns": ["a"], "rows": [{"key": "k", "machine": "mars", "command": "x", "cells": {"a": "1"}}]}
    with pytest.raises(KeyError, match="unknown machine"):
        render.render_table(tab, record.load("machines")["machines"])


def test_rendered_table_lists_each_command_once():
    tab = {"columns": ["a"], "rows": [
        {"key": "1", "machine": "xeon-avx512", "command": "python one.py", "cells": {"a": "1"}},
        {"key": "2", "machine": "epyc-avx2", "command": "python two.py", "cells": {"a": "2"}, "note": "load 3"},
        {"key": "3", "machine": ["xeon-avx512", "epyc-avx2"], "command": "python one.py", "cells": {"a": "3"}}]}
    out = render.render_table(tab, record.load("machines")["machines"])
    assert "| 2 | load 3 | EPYC Zen 2 | [2] |" in out
    assert "| 3 |  | Xeon, EPYC Zen 2 | [1] |" in out
    assert out.count("`python one.py`") == 1 and "[2] `python two.py`" in out


def _readme_benchmark_rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    assert rows[0] == ["what", "clag_fast", "compared with", "machine", "command"]
    return rows[1:]


def test_readme_benchmark_figures_come_from_benchmarks_md():
    rows = _readme_benchmark_rows()
    assert 5 <= len(rows) <= 16
    shorts = {m["short"] for m in record.load("machines")["machines"].values()}
    commands = {r["command"] for t in record.topics() for tab in record.load(t)["tables"].values() for r in tab["rows"]}
    for what, ours, theirs, machine, command in rows:
        assert machine in shorts, f"{what}: machine {machine!r}"
        for cmd in re.findall(r"`([^`]+)`", command):
            assert cmd in commands, f"{what}: {cmd!r} produced no figure in benches/results"
        for number in re.findall(r"\d[\d,]*(?:\.\d+)?", ours + " " + theirs):
            assert re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d,]|\.\d)", DOC), f"{what}: {number} is not in BENCHMARKS.md"
