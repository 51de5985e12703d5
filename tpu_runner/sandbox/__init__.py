"""Running untrusted code under limits: the supervising side (`process`: wall clock, CPU, memory, files, an environment
without secrets), the child's first code (`entry`: `python -m tpu_runner.sandbox.entry LIMITS MODULE`), Landlock
(`landlock`), and the check that a candidate left JAX's functions alone (`integrity`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "child_environment": "process", "ChildOutcome": "process", "exit_words": "process", "Gate": "process",
    "import_path": "process", "kill_running_children": "process", "run_child": "process", "run_one_shot": "process",
    "rss_mib": "process", "SandboxProcess": "process", "spawn": "process", "untrusted_reads": "process",
    "isolate_network": "entry",
})
