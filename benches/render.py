"""Render BENCHMARKS.md's tables from ``benches/results/*.json``.

BENCHMARKS.md keeps its prose (what is measured, how, why the defaults are what they are)
and marks each table's place with ``<!-- results: TOPIC/TABLE -->`` ... ``<!-- end results -->``
(``<!-- results: machines -->`` for the machine list). This script rewrites every marked
block from the results files; the prose around them is left as it is.

    python benches/render.py              # rewrite BENCHMARKS.md
    python benches/render.py --check      # exit 1, naming the blocks, when it is out of date
    python benches/render.py --remeasure  # list the rows marked for re-measurement

Every row shows its machine (the ``short`` label of machines.json) and a number that points at
the command which produced it, listed under the table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

DOC = record.ROOT / "BENCHMARKS.md"
BLOCK = re.compile(r"(<!-- results: (?P<name>[\w/-]+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.S)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _machines_label(row: dict, machines: dict) -> str:
    ids = row["machine"] if isinstance(row["machine"], list) else [row["machine"]]
    for mid in ids:
        if mid not in machines:
            raise KeyError(f"row {row['key']!r}: unknown machine {mid!r} (machines.json)")
    return ", ".join(machines[m]["short"] for m in ids)


def render_table(tab: dict, machines: dict) -> str:
    """One results table as markdown: its columns, a note column when a row has a note, the
    machine and the command's number; the commands listed below it."""
    cols = list(tab["columns"])
    with_note = any(r.get("note") for r in tab["rows"])
    commands: list[str] = []
    head = cols + (["note"] if with_note else []) + ["machine", "run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in tab["rows"]:
        if not r.get("command"):
            raise ValueError(f"row {r['key']!r} has no command")
        if r["command"] not in commands:
            commands.append(r["command"])
        cells = [_cell(r["cells"][c]) for c in cols]
        if with_note:
            cells.append(_cell(r.get("note", "")))
        cells += [_machines_label(r, machines), f"[{commands.index(r['command']) + 1}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"[{i}] `{c}`  " for i, c in enumerate(commands, 1)]
    lines[-1] = lines[-1].rstrip()
    return "\n".join(lines) + "\n"


def render_machines(data: dict) -> str:
    lines = ["| machine | CPU | cores | memory |", "|---|---|---|---|"]
    for m in data["machines"].values():
        lines.append(f"| {m['short']} | {_cell(m['cpu'])} | {m['cores']} | {m.get('memory') or '-'} |")
    return "\n".join(lines) + "\n\n" + data["software"] + "\n"


def render_block(name: str) -> str:
    machines = record.load("machines")
    if name == "machines":
        return render_machines(machines)
    topic, _, table = name.partition("/")
    tables = record.load(topic)["tables"]
    if table not in tables:
        raise KeyError(f"BENCHMARKS.md asks for {name}, but {topic}.json has no table {table!r}")
    return render_table(tables[table], machines["machines"])


def render(text: str) -> tuple[str, list[str]]:
    """``text`` with every marked block rendered, and the names of the blocks that changed."""
    changed: list[str] = []

    def one(m: re.Match) -> str:
        body = render_block(m["name"])
        if body != m["body"]:
            changed.append(m["name"])
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, text), changed


def unused_tables(text: str) -> list[str]:
    """Tables in the results files that BENCHMARKS.md does not show."""
    shown = {m["name"] for m in BLOCK.finditer(text)}
    return [f"{t}/{name}" for t in record.topics() for name in record.load(t)["tables"] if f"{t}/{name}" not in shown]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when BENCHMARKS.md is not what the results give")
    ap.add_argument("--remeasure", action="store_true", help="list the rows marked for re-measurement")
    ap.add_argument("--doc", type=Path, default=DOC)
    a = ap.parse_args(argv)
    if a.remeasure:
        for t in record.topics():
            for name, tab in record.load(t)["tables"].items():
                for r in tab["rows"]:
                    if r.get("remeasure"):
                        print(f"{t}/{name} {r['key']}: {r['remeasure']} (`{r['command']}`)")
        return 0
    text = a.doc.read_text("utf-8")
    new, changed = render(text)
    missing = unused_tables(text)
    if missing:
        print("results tables BENCHMARKS.md does not show: " + ", ".join(missing), file=sys.stderr)
    if a.check:
        if changed:
            print("BENCHMARKS.md is out of date in: " + ", ".join(changed) + " (run python benches/render.py)")
        return 1 if changed or missing else 0
    if changed:
        a.doc.write_text(new, "utf-8")
        print("rendered: " + ", ".join(changed))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
