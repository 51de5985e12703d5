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

