"""Not portable: a boolean mask selects elements, so the output's length depends on the values."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        positive = x[x > 0]
        return positive * 2.0


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return []
