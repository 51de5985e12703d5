"""RMSNorm as LLMs write it: x * rsqrt(mean(x^2) + eps) * weight."""

import torch
import torch.nn as nn

BATCH = 256
HIDDEN = 768


class Model(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x):
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
