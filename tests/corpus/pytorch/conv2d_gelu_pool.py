"""A 3x3 convolution without padding, GELU, then a global average pool over the spatial axes (NCHW)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
IN_CHANNELS = 16
OUT_CHANNELS = 32
HEIGHT = 34
WIDTH = 34


class Model(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3)

    def forward(self, x):
        return F.gelu(self.conv(x)).mean(dim=(2, 3))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
