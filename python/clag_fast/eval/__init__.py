"""Evaluation on LoCoMo-format data: ``clag-fast eval`` / ``python -m clag_fast.eval``.

  runner  the evaluation loop (stores per sample, retrieval, QA with an SLM)
  data    the LoCoMo dataset names (defined in clag_fast.locomo)
  metrics retrieval and QA metrics
  report  tables, plots and eval.json
"""
