"""Kernel tasks: the formats read unchanged (`task`: kernelbot's own; `jaxbench`, `kernelbench`), the entry point a
task or candidate is called by (`entry_point`), evaluator-owned inputs (`inputs`), safe parsing of Python source
(`pysource`), and checking a pasted reference before a session starts on it (`reference_check`, whose sandboxed
child is `check_child`)."""
