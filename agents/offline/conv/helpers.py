"""The convolution kernel's helpers, as real functions: a written kernel is self-contained, so source.py pastes
their text into it (agents.offline.helper_text); here ruff reads them and the tests call them. (`_round_up` is the
shared one of agents.offline.kernel_helpers.)"""

import math

import jax.numpy as jnp
from jax import lax


def _space_to_depth(x, w, strides):
    """A strided convolution as a stride-1 one: phase (a, b) of the stride becomes input channels of the image
    (cropped or zero-padded to whole phases) and the kernel's taps (zero-padded to whole phases) split alike, so
    y[o, i, j] = sum of w[o, c, s*i1 + a, ...] * x[c, s*(i + i1) + a, ...] is unchanged."""
    n, c, o = x.shape[0], x.shape[1], w.shape[0]
    rank = len(strides)
    small = tuple(-(-k // s) for k, s in zip(w.shape[2:], strides))
    out = tuple((p - k) // s + 1 for p, k, s in zip(x.shape[2:], w.shape[2:], strides))
    size = tuple((q - 1 + k) * s for q, k, s in zip(out, small, strides))
    zero = jnp.zeros((), x.dtype)
    x = lax.pad(x, zero, ((0, 0, 0),) * 2 + tuple((0, t - p, 0) for t, p in zip(size, x.shape[2:])))
    w = lax.pad(w, jnp.zeros((), w.dtype), ((0, 0, 0),) * 2
                + tuple((0, k * s - kk, 0) for k, s, kk in zip(small, strides, w.shape[2:])))
    perm = (0, 1) + tuple(3 + 2 * i for i in range(rank)) + tuple(2 + 2 * i for i in range(rank))
    phases = math.prod(strides)
    split = sum(((t // s, s) for t, s in zip(size, strides)), ())
    image = tuple(t // s for t, s in zip(size, strides))
    x = x.reshape((n, c) + split).transpose(perm).reshape((n, c * phases) + image)
    taps = sum(((k, s) for k, s in zip(small, strides)), ())
    w = w.reshape((o, c) + taps).transpose(perm).reshape((o, c * phases) + small)
    return x, w


def _phase_taps(stride, lo, k):
    """One axis of a transposed convolution (its input dilated by `stride`, padded by `lo` in front, a window of
    k): output o = stride * q + r reads input sample q + (r + t - lo) / stride through tap t, where that divides.
    The first such offset over every phase r and tap t, and the window covering them all."""
    offsets = [(r + t - lo) // stride for r in range(stride) for t in range(k) if (r + t - lo) % stride == 0]
    return min(offsets), max(offsets) - min(offsets) + 1


def _stride_phases(x, w, phases):
    """A transposed convolution as a stride-1 convolution of the undilated input: each output phase (o mod the
    stride, per axis) becomes a group of output channels (phase-major) whose taps are w's that land on real input
    samples, zero elsewhere, so no MXU work multiplies the dilation's zeros. `phases` holds per spatial axis the
    dilation, the front pad in the dilated image and the output's length; `_interleave_phases` undoes the split."""
    zero = jnp.zeros((), x.dtype)
    pads = []
    for a, (stride, lo, length) in enumerate(phases):
        axis, k = 2 + a, w.shape[2 + a]
        first, width = _phase_taps(stride, lo, k)
        rows = -(-length // stride)  # outputs per phase; the last phases' extra ones are cropped
        pads.append((-first, rows + width - 1 - x.shape[axis] + first, 0))
        none = jnp.zeros_like(lax.slice_in_dim(w, 0, 1, axis=axis))
        taps = [stride * (j + first) - r + lo for r in range(stride) for j in range(width)]
        w = jnp.concatenate([lax.slice_in_dim(w, t, t + 1, axis=axis) if 0 <= t < k else none for t in taps],
                            axis=axis)
    x = lax.pad(x, zero, ((0, 0, 0),) * 2 + tuple(pads))
    rank = len(phases)
    split = sum(((stride, w.shape[2 + a] // stride) for a, (stride, _, _) in enumerate(phases)), ())
    w = w.reshape(w.shape[:2] + split)  # [C_out, C_in, s1, K1, s2, K2, ...]
    perm = tuple(2 + 2 * a for a in range(rank)) + (0, 1) + tuple(3 + 2 * a for a in range(rank))
    w = w.transpose(perm)  # [s1, s2, ..., C_out, C_in, K1, K2, ...]
    return x, w.reshape((-1,) + w.shape[rank + 1:])


def _interleave_phases(y, phases):
    """[N, phases * C, Q1, ...] from a `_stride_phases` convolution back to [N, C, length1, ...]: output o of an
    axis is phase o mod s at q = o // s."""
    rank = len(phases)
    strides = tuple(stride for stride, _, _ in phases)
    n, rows = y.shape[0], y.shape[2:]
    y = y.reshape((n,) + strides + (-1,) + rows)
    perm = (0, rank + 1) + sum(((rank + 2 + a, 1 + a) for a in range(rank)), ())
    y = y.transpose(perm).reshape((n, y.shape[rank + 1]) + tuple(q * s for q, s in zip(rows, strides)))
    return lax.slice(y, (0,) * y.ndim, y.shape[:2] + tuple(length for _, _, length in phases))


def _padded(x, axis, size):
    # lax.pad even when nothing is added: the program keeps one form at every shape (checked = timed).
    widths = [(0, 0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis], 0)
    return lax.pad(x, jnp.zeros((), x.dtype), widths)


def _valid_mask(in_spatial, out_spatial, p_pad):
    """1.0 where a flattened wide position is a real output position, 0.0 where it is wide or padding."""
    p = jnp.arange(p_pad)
    valid = p < out_spatial[0] * math.prod(in_spatial[1:])
    stride = 1
    for axis in range(len(in_spatial) - 1, 0, -1):
        valid &= (p // stride) % in_spatial[axis] < out_spatial[axis]
        stride *= in_spatial[axis]
    return valid.astype(jnp.float32).reshape(1, p_pad)

