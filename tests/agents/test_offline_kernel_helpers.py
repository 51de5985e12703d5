"""The helpers the offline brain pastes into its kernels are real functions: what is pasted is their own source,
and they compute what their docstrings say (run here on the CPU, outside any kernel)."""

from __future__ import annotations

import inspect
import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from agents.offline import kernel_helpers
from agents.offline.attention import helpers as attention_helpers
from agents.offline.conv import helpers as conv_helpers
from agents.offline.helper_text import helper_source
from agents.offline.scan import helpers as scan_helpers

MODULES = (kernel_helpers, attention_helpers, conv_helpers, scan_helpers)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_what_is_pasted_is_each_functions_own_source(module: object) -> None:
    functions = [(name, f) for name, f in vars(module).items()
                 if inspect.isfunction(f) and f.__module__ == module.__name__]  # type: ignore[attr-defined]
    assert functions
    for name, function in functions:
        assert helper_source(module.__name__, name) == inspect.getsource(function).rstrip("\n")  # type: ignore[attr-defined]


def test_a_renamed_helper_keeps_its_body_under_the_kernels_name() -> None:
    text = helper_source(attention_helpers.__name__, "_paired_ends", rename={"_paired_ends": "_ends"})
    assert text == "def _ends(i, j, qi, kv):\n    return kv == qi"
    with pytest.raises(KeyError, match="_nowhere"):
        helper_source(attention_helpers.__name__, "_nowhere")


def test_shared_block_sizes_and_padding() -> None:
    assert kernel_helpers._block(100, 512, 128) == 100  # all of it fits
    assert kernel_helpers._block(1536, 1024, 128) == 768  # the largest aligned divisor up to 1024
    assert kernel_helpers._block(1000, 512, 128) == 512  # none divides: padded to whole blocks
    assert kernel_helpers._round_up(5, 4) == 8
    assert kernel_helpers._padded(jnp.ones((2, 3)), 1, 8).shape == (2, 8)


@pytest.mark.parametrize("cols", [256, 1536])  # within one block of 128 groups; three blocks of 512 columns
def test_segment_sums_and_their_broadcast_back(cols: int) -> None:
    x = np.random.default_rng(0).standard_normal((8, cols)).astype(np.float32)
    sums = kernel_helpers._seg_sum(jnp.asarray(x), 4)
    np.testing.assert_allclose(np.asarray(sums), x.reshape(8, cols // 4, 4).sum(-1), rtol=1e-5, atol=1e-5)
    back = kernel_helpers._seg_expand(sums, 4)
    np.testing.assert_allclose(np.asarray(back), np.repeat(np.asarray(sums), 4, axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_q", [1, 2, 3, 4, 7])
def test_the_paired_causal_grid_visits_each_block_on_or_below_the_diagonal(n_q: int) -> None:
    seen = []
    for i, j in itertools.product(range((n_q + 1) // 2), range(n_q + 1)):
        qi, kv = (int(v) for v in attention_helpers._paired_positions(i, j, n_q))
        assert kv <= qi, (i, j, qi, kv)
        seen.append((qi, kv))
        if bool(attention_helpers._paired_starts(i, j, qi, kv)):
            assert kv == 0  # a query block's row starts at its first key block
    assert set(seen) == {(q, k) for q in range(n_q) for k in range(q + 1)}


def test_causal_mask_of_a_chunk_of_rows() -> None:
    s = jnp.zeros((2, 4))  # queries 2 and 3 of a block against its four keys
    kept = np.asarray(attention_helpers._causal_mask(s, 2)) == 0
    np.testing.assert_array_equal(kept, np.tril(np.ones((4, 4), bool))[2:])


def test_the_diagonal_block_is_cut_to_the_keys_each_chunk_of_rows_sees() -> None:
    calls: list[tuple[int, int, int, bool]] = []
    attention_helpers._diagonal_chunks(lambda *call: calls.append(call), 2, 4, 256, 1024)
    assert calls == [(h, c * 256, (c + 1) * 256, True) for h in range(2) for c in range(4)]
    calls.clear()  # one chunk: the whole block at once
    attention_helpers._each_chunk(lambda *call: calls.append(call), 1, 1, 512, 512, True)
    assert calls == [(0, 0, 512, True)]


def test_attention_blocks() -> None:
    assert attention_helpers._block(200, 512) == 200
    assert attention_helpers._block(1024, 512) == 512
    assert attention_helpers._block(384, 256) == 128


def test_space_to_depth_keeps_a_strided_convolution() -> None:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((1, 2, 9, 7)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 2, 3, 3)), jnp.float32)
    strided = lax.conv_general_dilated(x, w, (2, 2), "VALID", precision=lax.Precision.HIGHEST)
    xs, ws = conv_helpers._space_to_depth(x, w, (2, 2))
    dense = lax.conv_general_dilated(xs, ws, (1, 1), "VALID", precision=lax.Precision.HIGHEST)
    np.testing.assert_allclose(np.asarray(dense), np.asarray(strided), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("shape", "kernel", "dilation", "padding"), [
    ((2, 3, 7, 9), (5, 3, 4, 4), (2, 2), ((2, 2), (2, 2))),  # PyTorch's ConvTranspose2d(k=4, s=2, p=1)
    ((1, 2, 6, 5), (4, 2, 3, 5), (3, 2), ((1, 0), (3, 4))),  # uneven pads and strides: phases of unequal length
    ((1, 2, 5, 6), (3, 2, 2, 2), (3, 3), ((1, 1), (1, 1))),  # a stride beyond the window: phases with no tap
    ((2, 3, 4, 5, 6), (4, 3, 4, 4, 4), (2, 2, 2), ((2, 2),) * 3),
])
def test_stride_phases_keep_a_transposed_convolution(shape: tuple[int, ...], kernel: tuple[int, ...],
                                                     dilation: tuple[int, ...], padding: tuple) -> None:
    """The phases as channel groups of a stride-1 convolution of the undilated image, interleaved back, are the
    convolution over the dilated image."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal(kernel), jnp.float32)
    names = ("NCHW", "OIHW", "NCHW") if len(shape) == 4 else ("NCDHW", "OIDHW", "NCDHW")
    ones = (1,) * len(dilation)
    dense = lax.conv_general_dilated(x, w, ones, padding, lhs_dilation=dilation, dimension_numbers=names,
                                     precision=lax.Precision.HIGHEST)
    phases = tuple((d, lo, n) for d, (lo, _), n in zip(dilation, padding, dense.shape[2:], strict=True))
    xp, wp = conv_helpers._stride_phases(x, w, phases)
    assert wp.shape[0] == kernel[0] * int(np.prod(dilation)) and xp.shape[:2] == shape[:2]
    split = lax.conv_general_dilated(xp, wp, ones, "VALID", dimension_numbers=names, precision=lax.Precision.HIGHEST)
    np.testing.assert_allclose(np.asarray(conv_helpers._interleave_phases(split, phases)), np.asarray(dense),
                               rtol=1e-4, atol=1e-4)


def test_valid_mask_leaves_out_wide_and_padded_positions() -> None:
    mask = np.asarray(conv_helpers._valid_mask((4, 5), (2, 3), 16)).reshape(-1)
    want = [1.0 if p < 2 * 5 and p % 5 < 3 else 0.0 for p in range(16)]
    np.testing.assert_array_equal(mask, want)
    assert conv_helpers._padded(jnp.ones((2, 3)), 0, 8).shape == (8, 3)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_chunks_prefix_sums_along_and_across_the_lanes(reverse: bool) -> None:
    rng = np.random.default_rng(2)
    rows = rng.standard_normal((8, 128)).astype(np.float32)  # a block along the lanes: (lines, chunk)
    want = np.flip(np.cumsum(np.flip(rows, 1), 1), 1) if reverse else np.cumsum(rows, 1)
    triangle = scan_helpers._triangle_lanes_reverse if reverse else scan_helpers._triangle_lanes
    got = scan_helpers._prefix_lanes(jnp.asarray(rows), triangle(128))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    cols = rows.T.copy()  # a block across them: (chunk, lines)
    triangle = scan_helpers._triangle_sublanes_reverse if reverse else scan_helpers._triangle_sublanes
    got = scan_helpers._prefix_sublanes(jnp.asarray(cols), triangle(128))
    np.testing.assert_allclose(np.asarray(got), want.T, rtol=1e-4, atol=1e-4)
