"""A transformer MLP block: Linear, ReLU, Linear (both with biases)."""

import torch
import torch.nn as nn

BATCH = 256
HIDDEN = 256
FFN = 512


class Model(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, FFN]
