"""Evaluation on LoCoMo-format data: ``clag-fast eval`` / ``python -m clag_fast.eval``.

  runner  the evaluation loop (stores per sample, retrieval, QA with an SLM)
  data    dataset loading and evidence normalisation
  metrics retrieval and QA metrics
  report  tables, plots and eval.json
"""
