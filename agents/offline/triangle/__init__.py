"""The triangle multiplicative update (AlphaFold's pair-representation update): two gated projections of one pair
input x [N, N, C_in], left and right, contracted over a shared axis channel by channel, t[i, j, c] = sum_k
left[i, k, c] right[j, k, c] ("outgoing" edges; "incoming": sum_k left[k, i, c] right[k, j, c]), RMS-normalised
over the channels, then an output projection times a gate. The contraction's batch axis (the channel) is the minor
one: XLA transposes around it.

The kernel is three pallas_calls, each operand in the layout the next one reads: the projections write left and
right channel-major ([C, N, N]); the per-channel contraction is an MXU matmul per (channel, row block, column
block); the last call normalises a block of positions over its channels, projects them and gates them, writing the
reference's layout. Neither x's projections nor t make an extra pass through HBM for a transpose.

Modules: `shape` (what was recognised, the parameters), `recognise`, `source` (the kernel module's text), `family`
(all of it as one FamilySpec).
"""

from agents.offline.triangle.family import Triangle
from agents.offline.triangle.recognise import recognise_triangle
from agents.offline.triangle.shape import Projection, TriangleParams, TriangleShape

__all__ = ["Projection", "Triangle", "TriangleParams", "TriangleShape", "recognise_triangle"]
