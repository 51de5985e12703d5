"""A reduction: the mean over the last dimension (one value per row)."""

import torch
import torch.nn as nn

BATCH = 256
DIM = 1024


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.mean(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [-1]
