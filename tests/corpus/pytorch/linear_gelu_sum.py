"""Linear (with its bias), GELU, then a sum over the features that keeps its dimension: the output is
(BATCH, 1), and the kept axis arrives in the ported program as a broadcast_in_dim after the reduction."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 256
IN_FEATURES = 512
OUT_FEATURES = 384


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.sum(F.gelu(self.linear(x)), dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
