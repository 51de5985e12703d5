"""LLM and offline brains, the sub-agent pool and the HITL / Auto / Search paradigms (issue 4 onwards)."""
