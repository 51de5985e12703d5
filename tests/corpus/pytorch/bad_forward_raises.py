"""Not portable: forward multiplies by the weight untransposed, so PyTorch itself raises."""

import torch
import torch.nn as nn

BATCH = 16
IN_FEATURES = 128
OUT_FEATURES = 64


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features))

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
