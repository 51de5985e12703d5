"""Stage 4, correctness: which shapes are checked (`checkshapes`), running candidate and reference on the same inputs
and judging every leaf (`correctness`, `compare`), the reference's numerics as a TPU computes them or in float64
(`numerics`), and outputs as files passed between processes (`arrays`)."""
