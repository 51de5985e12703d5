"""Each family's parameters are a typed, frozen dataclass that checks itself; at the family's edge they become the
TUNABLE dict the plans, the search and the written module use, and back, unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from agents.offline.attention import AttentionParams
from agents.offline.conv import ConvParams
from agents.offline.kernel_family import as_tunable, dividing, first_vmem_limit, from_tunable
from tpu_runner.hardware import get_chip


def test_attention_parameters_as_tunable_values_and_back() -> None:
    square = AttentionParams(block_q=512, heads_per_step=2, chunk_rows=256, transpose_k=True,
                             vmem_limit_bytes=64 * 2**20)
    values = as_tunable(square)
    # A square causal grid has no BLOCK_KV (its key blocks are the query blocks), a V of 64 columns no row sums on
    # the MXU: those names are not in its space.
    assert values == {"BLOCK_Q": 512, "HEADS_PER_STEP": 2, "CHUNK_ROWS": 256, "TRANSPOSE_K": True,
                      "VMEM_LIMIT_BYTES": 64 * 2**20}
    assert from_tunable(AttentionParams, {**values, "BLOCK_M": 7}) == square  # other families' names are ignored
    full = dataclasses.replace(square, block_kv=256, batch_per_step=2, row_sums_on_mxu=False)
    assert list(as_tunable(full)) == ["BLOCK_Q", "BLOCK_KV", "HEADS_PER_STEP", "BATCH_PER_STEP", "CHUNK_ROWS",
                                      "ROW_SUMS_ON_MXU", "TRANSPOSE_K", "VMEM_LIMIT_BYTES"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.block_q = 128  # type: ignore[misc]


def test_parameters_check_themselves() -> None:
    with pytest.raises(ValueError, match="block_q=0"):
        AttentionParams(block_q=0, heads_per_step=1, chunk_rows=128, transpose_k=False, vmem_limit_bytes=2**20)
    with pytest.raises(ValueError, match="batch_per_step=0"):
        AttentionParams(block_q=128, heads_per_step=1, batch_per_step=0, chunk_rows=128, transpose_k=False,
                        vmem_limit_bytes=2**20)
    with pytest.raises(ValueError, match="chunk=0"):
        ConvParams(block_co=64, chunk=0, vmem_limit_bytes=2**20, elementwise_dtypes="float32")


def test_conv_parameters_leave_out_what_the_mode_has_no_axis_for() -> None:
    pool = ConvParams(block_co=128, block_p=4096, chunk=1024, vmem_limit_bytes=2**26, elementwise_dtypes="float32")
    assert list(as_tunable(pool)) == ["BLOCK_CO", "BLOCK_P", "CHUNK", "FOLD_TAPS", "VMEM_LIMIT_BYTES",
                                      "ELEMENTWISE_DTYPES"]
    assert from_tunable(ConvParams, as_tunable(pool)) == pool


def test_the_families_shared_choices() -> None:
    # Blocks that divide the size, else the whole size (a block that divides nothing would leave rows unwritten).
    assert dividing(1536, (256, 512, 1024)) == (256, 512)
    assert dividing(200, (256, 512)) == (200,)
    # Within the chip's VMEM, not all of it: v5e and v6e have 128 MiB, v5p 64, a 16 MiB chip gets 8.
    assert first_vmem_limit(get_chip("v5e").vmem_bytes) == 64 * 2**20
    assert first_vmem_limit(get_chip("v5p").vmem_bytes) == 32 * 2**20
    assert first_vmem_limit(16 * 2**20) == 8 * 2**20
