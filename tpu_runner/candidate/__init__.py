"""The candidate's side of an evaluation: the static check of its source (`static_check`), its sandboxed child
(`child`), that child seen from the parent (`process`), and children and compile servers started ahead of need
(`spares`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "check_source": "static_check", "StaticReport": "static_check", "StaticViolation": "static_check",
    "target_context": "child",
    "CandidateCompiles": "process", "IrGate": "process", "run_candidate": "process", "stopped_error": "process",
    "spare_pool": "spares", "SparePool": "spares",
})
