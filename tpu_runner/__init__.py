"""Everything below the agents that runs kernels and tasks, in sub-packages by the evaluator's stages and concerns,
each importing only those listed before it: `reports` (results, errors, the parent-child protocol), `hardware` (the
chips), `sandbox` (untrusted code under limits), `tasks` (the task formats), `analysis` (programs read without running
them), `compiler` (ahead-of-time compiles), `checking` (correctness), `timing` (estimate, measurement, profile),
`reference` and `candidate` (the two sides of an evaluation), `jobs` (the job-kind contract that handlers and the
daemon share), `evaluation` (the pipeline), `runner` (the daemon and the evaluator's job kinds), and `porting`
(PyTorch modules made tasks).

Callers import a module by its full path (`tpu_runner.timing.measure`): the packages do not re-export, so importing
one module never loads JAX or libtpu for the others (the sandboxed children and the CLI start on what they need)."""
