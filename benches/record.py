"""Benchmark results as data: ``benches/results/<topic>.json``, one file per BENCHMARKS.md topic.

Each file holds named tables; a table has its columns and rows, and every row says which
machine measured it and the command that produced it::

    {"topic": "Search", "tables": {"store": {"columns": ["memories", ...], "rows": [
        {"key": "1M@xeon-avx512", "machine": "xeon-avx512", "command": "python benches/...",
         "cells": {"memories": "1M", ...}, "note": "...", "remeasure": "why (optional)"}]}}}

``machines.json`` describes the machines (``short`` label, CPU, cores, and a ``match`` rule
that recognises the machine a bench runs on). A bench run with ``--record`` calls
:func:`record`, which replaces its row (same key on the same machine) with the new cells;
``python benches/render.py`` then rewrites BENCHMARKS.md's tables from the files, so the
document shows what was run and cannot drift from it. ``remeasure`` marks a row whose figure
predates a change that affects it (``python benches/render.py --remeasure`` lists them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent


def load(topic: str) -> dict:
    """The results of one topic (``machines`` for the machine list)."""
    return json.loads((RESULTS / f"{topic}.json").read_text("utf-8"))


def save(topic: str, data: dict) -> None:
    """Write a topic's results (a temp file renamed over the old one: never half a file)."""
    path = RESULTS / f"{topic}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", "utf-8")
    os.replace(tmp, path)


def topics() -> list[str]:
    """Every topic with a results file, machines.json aside."""
    return sorted(p.stem for p in RESULTS.glob("*.json") if p.stem != "machines")


def _cpuinfo() -> dict:
    """vendor, model name and flags of the first CPU in /proc/cpuinfo."""
    info: dict = {"vendor": "", "model": "", "flags": set()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id" and not info["vendor"]:
            info["vendor"] = value
        elif key == "model name" and not info["model"]:
            info["model"] = value
        elif key == "flags" and not info["flags"]:
            info["flags"] = set(value.split())
    return info


def machine_id(machines: dict | None = None, cpu: dict | None = None, cores: int | None = None) -> str:
    """The machines.json id of the machine this runs on: the first whose ``match`` rule (vendor,
    flags it must have, flags it must not have) and core count fit; else an id made from the CPU
    model and core count (:func:`record` adds such a machine to machines.json)."""
    machines = load("machines")["machines"] if machines is None else machines
    cpu = _cpuinfo() if cpu is None else cpu
    cores = os.cpu_count() if cores is None else cores
    for mid, m in machines.items():
        rule = m.get("match", {})
        if (rule.get("vendor") in (None, cpu["vendor"]) and set(rule.get("flags", [])) <= cpu["flags"]
                and not set(rule.get("without", [])) & cpu["flags"] and m.get("cores") in (None, cores)):
            return mid
    slug = re.sub(r"[^a-z0-9]+", "-", (cpu["model"] or "unknown cpu").lower()).strip("-")
    return f"{slug}-{cores}c"


def command_line(argv: list[str] | None = None) -> str:
    """How this process was started, as a user would type it from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        argv[0] = str(script.relative_to(ROOT))
    except ValueError:
        pass
    return "python " + shlex.join(argv)


def record(topic: str, table: str, key: str, cells: dict[str, str], *, note: str | None = None,
           command: str | None = None) -> str:
    """Put this run's ``cells`` in row ``key`` of ``table`` in ``results/<topic>.json``, on this
    machine, replacing the row that machine measured before (its ``remeasure`` mark goes too).
    Every cell must be one of the table's columns, and every column needs a cell. Returns the
    row's key (``key@machine``)."""
    data = load(topic)
    tab = data["tables"].get(table)
    if tab is None:
        raise KeyError(f"{topic}.json has no table {table!r} (tables: {', '.join(data['tables'])})")
    unknown = set(cells) - set(tab["columns"])
    missing = set(tab["columns"]) - set(cells)
    if unknown or missing:
        raise ValueError(f"{topic}/{table}: cells must be exactly the columns {tab['columns']} "
                         f"(unknown: {sorted(unknown)}, missing: {sorted(missing)})")
    machines = load("machines")
    mid = machine_id(machines["machines"])
    if mid not in machines["machines"]:
        cpu = _cpuinfo()
        machines["machines"][mid] = {"short": mid, "cpu": cpu["model"] or "unknown CPU", "cores": os.cpu_count(),
                                     "memory": "", "match": {"vendor": cpu["vendor"]}}
        save("machines", machines)
    row = {"key": f"{key}@{mid}", "machine": mid, "command": command or command_line(),
           "cells": {c: str(cells[c]) for c in tab["columns"]}}
    if note:
        row["note"] = note
    rows = tab["rows"]
    at = next((i for i, r in enumerate(rows) if r["key"] == row["key"]), None)
    if at is None:
        rows.append(row)
    else:
        rows[at] = row
    save(topic, data)
    return row["key"]
