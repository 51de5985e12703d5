"""The brains (an LLM's and the offline one), the sub-agent pool, the HITL / Auto / Search paradigms, porting a
PyTorch module to a task, and the job kinds through which runners advance them."""
