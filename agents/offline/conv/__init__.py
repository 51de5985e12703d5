"""Convolutions: a 2-D (NCHW x OIHW) or 3-D (NCDHW x OIDHW) conv_general_dilated with any padding, strides or
input dilation (a transposed convolution's; not strides and input dilation together), no kernel dilation and no
feature groups, followed by an epilogue: per-channel broadcasts (bias, affine weights), elementwise chains, and
reductions over all the spatial axes (a global pool to [N, C], or statistics per (sample, channel) plane such
as an instance norm's).

The kernel is an implicit GEMM on a flattened layout that needs no transpose of the input. One sample's input
is (C_in, D*H*W) with the spatial positions on the lanes; an output position p (flattened over the input's
row length, so p = r*W + c) takes tap (i, j) from the input at p + i*W + j. Positions with c >= W_out (and rows
r >= H_out in 3-D) are computed and thrown away: "wide" rows cost (W - W_out) / W_out extra MXU work and keep
every tap a plain shift of the lanes. Per grid step (sample, output-channel block, position block):
- the whole sample's input sits in VMEM (fetched once per sample: its index map ignores the other axes);
- per chunk of positions, each tap's window is loaded at a 128-aligned lane offset, rolled by the rest of its
  offset and stored into a (taps * C_in, chunk) patch in VMEM (FOLD_TAPS), then one MXU dot
  w (C_out, taps * C_in) @ patch gives the chunk in f32; without FOLD_TAPS, one dot per tap is accumulated;
- the epilogue runs on the f32 accumulator; spatial reductions mask the wide positions out, and a global pool
  accumulates across the position axis ('arbitrary'), so only [N, C] goes back to HBM.
A plane statistic (instance norm) needs the whole plane: its position block is the whole plane.
A transposed convolution (input dilation) with an elementwise epilogue is computed by output phase: each phase of
the dilation a group of output channels of a stride-1 convolution of the undilated image (its taps those of the
kernel that land on real samples), interleaved by XLA after the kernel; the dense form over the dilated image
multiplies the inserted zeros ((s^rank - 1) / s^rank of its MXU work and tap shifts).
The input is padded (channels to the sublane tile, positions past the last tap's reach) and the wide output is
cropped with XLA ops outside the kernel; that traffic is counted in the reasons.

Modules: `shape` (what was recognised, and the layout its sizes give), `epilogue` (the epilogue as block code on a
tile), `recognise`, `params` (the TUNABLE space and the brain's choice, typed), `source` (the kernel module's
text), `helpers` (the kernel's fixed helpers as real functions), `family` (all of it as one FamilySpec).
"""

from agents.offline.conv.family import Conv
from agents.offline.conv.params import ConvParams, choose_params, conv_space
from agents.offline.conv.recognise import recognise, recognise_conv
from agents.offline.conv.shape import ConvOperand, ConvShape, value_kind, writes_planes

__all__ = ["Conv", "ConvOperand", "ConvParams", "ConvShape", "choose_params", "conv_space", "recognise",
           "recognise_conv", "value_kind", "writes_planes"]
