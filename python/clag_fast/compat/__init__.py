"""Drop-in shapes of other memory libraries, needing no extra package:
``clag_fast.compat.mem0.Memory`` (mem0's ``Memory``) and
``clag_fast.compat.amem.AgenticMemorySystem`` (A-MEM's memory system).
"""
