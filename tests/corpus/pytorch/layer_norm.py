"""LayerNorm over the last dimension, with its learned scale and shift."""

import torch
import torch.nn as nn

BATCH = 256
HIDDEN = 512


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)
        with torch.no_grad():  # not the identity affine of a fresh LayerNorm
            self.norm.weight.add_(0.1 * torch.randn(hidden))
            self.norm.bias.add_(0.1 * torch.randn(hidden))

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
