"""Stage 5 and 6, time and profile: the compile-based timing model (`model`) with its fitted factors (`calibration`)
and error bands (`band`), bytes and roofline flags (`roofline`), measurement on a device from a profiler trace
(`measure`), the performance record of either (`performance`), and the profile an agent or a person reads
(`profile`, `chart`, `trace_export`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "program_time": "model", "programs_time": "model", "static_profile_time": "model",
    "GRID_STEP_CYCLES": "calibration", "HBM_EFFICIENCY": "calibration", "Calibration": "calibration",
    "for_target": "calibration", "UNCALIBRATED": "calibration",
    "band_text": "band", "clear_gain": "band", "clear_improvement": "band", "describe_speedup": "band",
    "measured_band": "band", "program_band": "band", "speedup_band": "band",
    "candidate_hbm_bytes": "roofline", "estimate": "roofline", "performance_flags": "roofline",
    "PHYSICS_MARGIN": "roofline", "TimeEstimate": "roofline", "traffic_flags": "roofline",
    "device_ops": "measure", "accepted_while_timing": "measure", "Judgement": "measure", "measure_pair": "measure",
    "per_call_durations": "measure",
    "CandidateProgram": "performance", "estimated_performance": "performance", "grid_steps": "performance",
    "measured_performance": "performance", "untiled_traffic": "performance",
    "DEFAULT_SCOPED_VMEM": "profile", "hints": "profile", "kernel_facts": "profile", "summarise": "profile",
    "render_profile_chart": "chart", "right_panel": "chart", "TOP_OPS": "chart",
    "RAISED": "trace_export", "trace_json": "trace_export",
})
