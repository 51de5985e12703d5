"""Not portable: a syntax error: the parenthesis opened on line 9 is never closed."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.relu(x
        return y * 2.0


def get_inputs():
    return [torch.randn(8, 128)]


def get_init_inputs():
    return []
