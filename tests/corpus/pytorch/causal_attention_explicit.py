"""Causal attention written out as GPT implementations do: q @ k^T scaled, a lower-triangular mask made in
forward (torch.tril(torch.ones(T, T))), softmax, then @ v."""

import math

import torch
import torch.nn as nn

BATCH = 2
HEADS = 2
SEQ_LEN = 256
HEAD_DIM = 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        seq_len = q.size(-2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.tril(torch.ones(seq_len, seq_len))
        scores = scores.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    shape = (BATCH, HEADS, SEQ_LEN, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
