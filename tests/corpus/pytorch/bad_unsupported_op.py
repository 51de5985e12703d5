"""Not portable: adaptive max pooling (a classifier head's pooling), which torchax has no lowering for."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
CHANNELS = 32
SIZE = 16


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return F.adaptive_max_pool2d(x, 4)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
