"""An elementwise chain on a bf16 activation: x * sigmoid(x) + 1 (a shifted SiLU)."""

import torch
import torch.nn as nn

BATCH = 128
DIM = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * torch.sigmoid(x) + 1.0


def get_inputs():
    return [torch.randn(BATCH, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
