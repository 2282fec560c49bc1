"""Framework adapters: clag_fast behind the interfaces agent code already uses.

Each module imports its framework at import time, so import the one you need (its extra
installs the framework): ``clag_fast.integrations.langchain`` (``ClagVectorStore``, extra
``langchain``), ``clag_fast.integrations.langgraph`` (``ClagStore``, extra ``langgraph``),
``clag_fast.integrations.llamaindex`` (``ClagVectorStore``, extra ``llamaindex``).
``storehandle`` opens the store behind an adapter once the vector width is known.
"""
