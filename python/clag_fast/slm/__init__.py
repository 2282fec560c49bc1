"""The SLM side: the client, the managed llama.cpp server, the prompts, the organiser's
decisions and the re-organisation triggers. It decides and never applies: it is given texts,
scores, candidate phrases and cluster briefs and returns routes, picks and profiles, which the
store applies (``store.slm_scheduler``).

  client     LLMClient: OpenAI-compatible chat with JSON-schema answers
  server     ManagedServer: llama_cpp.server with the bundled SmolLM2 on a loopback port
  connection SLMConnection: the SLM a store asks, connected on first need
  prompts    every prompt and answer schema
  organizer  Organizer: prompts in, decisions out, vector fallbacks
  triggers   Triggers: periodic / drift / confusion / explicit
"""

from clag_fast.config import SLMConfig
from clag_fast.slm.client import LLMClient
from clag_fast.slm.organizer import ClusterBrief, Organizer, OrganizerConfig, Profile, Route
from clag_fast.slm.server import ManagedServer
from clag_fast.slm.triggers import Triggers

__all__ = ["ClusterBrief", "LLMClient", "ManagedServer", "Organizer", "OrganizerConfig", "Profile", "Route",
           "SLMConfig", "Triggers"]
