"""A bf16 matmul of two inputs (torch.matmul), as mixed-precision training feeds it."""

import torch
import torch.nn as nn

M = 256
K = 512
N = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
