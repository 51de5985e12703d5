"""Retention: two chained matmuls without a softmax (RetNet's parallel form). The scores q k^T are multiplied by a
causal decay made from positions, D[h, n, m] = exp(rate_h * (n - m)) for m <= n and 0 above the diagonal, each row
is divided by max(sum of its absolute values, eps), and the result times v is the output.

Recognised by structure, then by numbers: the ops between the two matmuls are matched one by one (the decay's
multiply, the absolute row sum, its floor, the division, a cast), and the decay is evaluated from the program's
positions with numpy at the production shapes: its mask must be causal, its exponent a per-head rate times the
query-minus-key distance, every rate a decay (not above zero).

The kernel is flash-style, in two passes over a grid of (batch x heads, query block, key block) that visits only
the blocks on or below the diagonal: the first sums each row's decayed scores' absolute values, the second computes
the scores again, normalises and rounds them as the reference does and multiplies them by V into an f32 accumulator.
No score matrix and no decay mask ever reach HBM.

Modules: `shape` (what was recognised, the parameters), `recognise`, `source` (the kernel module's text),
`helpers` (the kernel's fixed helpers as real functions), `family` (all of it as one FamilySpec).
"""

from agents.offline.retention.family import Retention
from agents.offline.retention.recognise import recognise_retention
from agents.offline.retention.shape import RetentionParams, RetentionShape

__all__ = ["Retention", "RetentionParams", "RetentionShape", "recognise_retention"]
