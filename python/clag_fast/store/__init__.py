"""The store: ``MemoryStore`` and the state it owns.

Modules, each owning one thing:
  memory_store  the public facade (``MemoryStore``)
  state         ``StoreState``: what one open store owns (catalog, index, row table, caches, lock)
  catalog       the SQLite database: schema, migrations and every SQL statement
  rowtable      per-row columns for filters and decay, in memory
  fields        metadata fields as per-row columns (built per filtered field), for where=
  filters       the where= grammar: parsing and compiling to a row mask
  routing       the vector routing policy (pure numpy)
  placement     routing new rows into clusters, applying the SLM's routes
  organize      cold start, topics, split, merge, profile bookkeeping
  slm_scheduler when the store asks the SLM, its background worker, applying the answers
  search        filters, probe rule, native search, hits with labels
  recovery      checks and repairs on open
  forgetting    applying the decay / prune policy
  topics        a cluster's members forgotten, moved or merged by hand
  dimension     the vectors' width (fixed at creation, or by the first vectors)
  transfer      export and import (JSONL, Parquet), importers from other stores
  locks         readers-writer lock and the writer's lock file
"""

from clag_fast.store.memory_store import MemoryStore

__all__ = ["MemoryStore"]
