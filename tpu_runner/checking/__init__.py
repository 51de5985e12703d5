"""Stage 4, correctness: which shapes are checked (`checkshapes`), running candidate and reference on the same inputs
and judging every leaf (`correctness`, `compare`), the reference's numerics as a TPU computes them or in float64
(`numerics`), and outputs as files passed between processes (`arrays`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "CheckShape": "checkshapes", "choose": "checkshapes", "derived_candidates": "checkshapes",
    "dot_flops": "checkshapes", "free_axes": "checkshapes", "Production": "checkshapes",
    "reference_cost": "checkshapes", "reference_form": "checkshapes",
    "CandidateFailed": "correctness", "CandidateRun": "correctness", "case_truth": "correctness",
    "check_configuration": "correctness", "Judge": "correctness", "judged": "correctness",
    "memory_allowance": "correctness", "scaled_atol": "correctness", "perturbed_truth": "correctness",
    "with_kept_values": "correctness",
    "ReferenceRun": "correctness", "run_candidate_case": "correctness", "run_reference_case": "correctness",
    "compare_outputs": "compare", "Comparison": "compare", "as_output_set": "compare", "output_scale": "compare",
    "as_on_tpu": "numerics", "widened": "numerics", "widened_program": "numerics", "sliced_widened_program": "numerics",
    "load_outputs": "arrays", "OutputSet": "arrays", "save_outputs": "arrays",
})
