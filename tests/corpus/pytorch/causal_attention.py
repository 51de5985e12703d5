"""Causal scaled dot-product attention over heads (F.scaled_dot_product_attention, no projections)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 1
HEADS = 4
SEQ_LEN = 256
HEAD_DIM = 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    shape = (BATCH, HEADS, SEQ_LEN, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
