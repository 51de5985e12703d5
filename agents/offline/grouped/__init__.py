"""Grouped (ragged) matmul: `lax.ragged_dot` of rows sorted by group, lhs [m, k] with rows [offset[g], offset[g] +
size[g]) multiplied by rhs[g] ([k, n], or [n, k] transposed), the group sizes an input.

The kernel walks, for each block of output columns, the (group, row tile) pairs the groups cover in row order: a
tile on a group boundary is visited once per group it holds, each visit storing only its own group's rows. The
schedule is made from the group sizes on the device (a few small XLA ops) and reaches the kernel by scalar
prefetch, so the index maps pick each visit's row tile and its group's weights. The work is the dense matmul's
plus one row tile per group boundary, never a matmul per group over all rows.

Modules: `shape` (what was recognised, the parameters), `recognise`, `source` (the kernel module's text), `family`
(all of it as one FamilySpec).
"""

from agents.offline.grouped.family import Grouped
from agents.offline.grouped.recognise import recognise_grouped
from agents.offline.grouped.shape import GroupedParams, GroupedShape

__all__ = ["Grouped", "GroupedParams", "GroupedShape", "recognise_grouped"]
