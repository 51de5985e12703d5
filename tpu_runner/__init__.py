"""Task loading and the evaluation pipeline: static check, lower, compile, correctness, performance, profile."""
