"""Running untrusted code under limits: the supervising side (`process`: wall clock, CPU, memory, files, an environment
without secrets), the child's first code (`entry`: `python -m tpu_runner.sandbox.entry LIMITS MODULE`), Landlock
(`landlock`), and the check that a candidate left JAX's functions alone (`integrity`)."""
