"""Evaluation on LoCoMo-format data: ``clag-fast eval`` / ``python -m clag_fast.eval``.

  runner      run_eval in named steps and the eval command line
  sample_run  one sample under one organisation: build, search, answer
  settings    each store's configuration, the retrieval table's rows, RunSettings
  embedders   HashingEmbedder, LookupEmbedder, make_embedder, embed_texts (cached)
  endpoint    the SLM server a run asks (a URL or a managed SmolLM2), call counts
  qa          the QA table: flat vector RAG vs clag_fast without and with labels
  answer      answer prompts and scoring
  metrics     retrieval and QA metrics
  report      tables, plots and eval.json
  data        the LoCoMo dataset names (defined in clag_fast.locomo)
  labels      the label measures and the cluster map (defined in labels.measures, cluster_map)
"""
