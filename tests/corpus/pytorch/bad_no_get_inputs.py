"""Not portable: there is no get_inputs(), so nothing says what forward takes."""

import torch
import torch.nn as nn

BATCH = 8
DIM = 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x)


def get_init_inputs():
    return []
