"""Write the standard-library docstrings set (``eval_hybrid.stdlib_docs_set``) as a
LoCoMo-format dataset, so ``clag-fast eval`` measures it like any conversation: one session
whose turns are the docstring bodies (speaker "Docs", ids ``doc:<n>``), one question per body
(its summary line) with that body as the evidence.

    .venv/bin/python benches/docs_dataset.py /tmp/stdlib_docs.json
    .venv/bin/clag-fast eval /tmp/stdlib_docs.json --n-probe auto --no-plots
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_hybrid import stdlib_docs_set  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    rs = stdlib_docs_set()
    turns = [{"speaker": "Docs", "dia_id": f"doc:{i}", "text": t} for i, t in enumerate(rs.texts)]
    qa = [{"question": q, "answer": rs.texts[i], "evidence": [f"doc:{i}"], "category": 4}
          for i, q in enumerate(rs.questions)]
    sample = {"sample_id": "stdlib-docs", "conversation": {"speaker_a": "Docs", "speaker_b": "Reader",
                                                          "session_1_date_time": "", "session_1": turns}, "qa": qa}
    Path(argv[0]).write_text(json.dumps([sample]))
    print(f"wrote {argv[0]}: {len(turns)} memories, {len(qa)} questions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
