"""Stage 5 and 6, time and profile: the compile-based timing model (`model`) with its fitted factors (`calibration`)
and error bands (`band`), bytes and roofline flags (`roofline`), measurement on a device from a profiler trace
(`measure`), the performance record of either (`performance`), and the profile an agent or a person reads
(`profile`, `chart`, `trace_export`)."""
