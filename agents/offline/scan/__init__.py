"""Scans: prefix sums and the first-order linear recurrence, as kernels of their own family.

- Prefix sum: the `cumsum` primitive (jnp.cumsum, lax.cumsum, either direction, any axis) with elementwise work
  before and after it on arrays of its shape (`cumsum(x * x)`, the exclusive `cumsum(x) - x`, ...), or
  `lax.associative_scan(jnp.add, x)`.
- Linear recurrence h_t = a_t * h_{t-1} + x_t (h_{-1} = 0), as `lax.associative_scan` writes it with the combine
  (a1, x1), (a2, x2) -> (a1 a2, a2 x1 + x2). The flat program holds that as strided slices, pads and
  concatenations along one axis; it is confirmed by running those ops in numpy (along the scan axis only) beside
  the recurrence itself, in both directions and with either input as `a`, so anything merely shaped like it is
  refused. A `lax.scan` loop is refused with the reason: the program reader inlines its body as one step, which
  loses its length and direction.

Kernels read each input once and write the output once (a scan is memory-bound):
- prefix sum: a grid over (blocks across the scan, chunks along it), chunks last and 'arbitrary'. Within a chunk
  of C elements the prefix sum is one matmul with a C x C triangle of ones on the MXU; the f32 data is split into
  bf16 parts whose sum is the f32 value, each part times the exact 0/1 triangle accumulating in f32, so the result
  is f32-accurate. A running total in VMEM scratch carries each line's sum from chunk to chunk.
- recurrence: the same grid; within a chunk (time steps on sublanes, features on lanes) a loop over the steps
  updates h for a block of features, and h is carried across chunks in VMEM scratch.

Modules: `shape` (what was recognised), `recognise` (by structure), `confirm` (an associative scan, by numbers),
`params` (the TUNABLE spaces and the brain's choices, typed), `source` (the kernel modules' text), `helpers` (the
prefix-sum kernel's fixed helpers as real functions), `family` (each scan as one FamilySpec).
"""

from agents.offline.scan.confirm import confirm_associative
from agents.offline.scan.family import Cumsum, Recurrence
from agents.offline.scan.params import (
    CumsumParams,
    RecurrenceParams,
    choose_cumsum,
    choose_recurrence,
    cumsum_space,
    recurrence_space,
)
from agents.offline.scan.recognise import recognise_scan
from agents.offline.scan.shape import SCANS_WRITTEN, CumsumShape, RecurrenceShape

__all__ = ["SCANS_WRITTEN", "Cumsum", "CumsumParams", "CumsumShape", "Recurrence", "RecurrenceParams",
           "RecurrenceShape", "choose_cumsum", "choose_recurrence", "confirm_associative", "cumsum_space",
           "recognise_scan", "recurrence_space"]
