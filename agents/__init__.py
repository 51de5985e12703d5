"""The brains (an LLM's and the offline one), the sub-agent pool, the HITL / Auto / Search paradigms, porting a
CUDA or Triton kernel to a task (a PyTorch module is `tpu_runner.porting`'s), and the job kinds through which
runners advance them."""
