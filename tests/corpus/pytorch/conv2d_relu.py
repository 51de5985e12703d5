"""A 3x3 convolution with padding 1 and a bias, then ReLU (NCHW, as PyTorch lays it out)."""

import torch
import torch.nn as nn

BATCH = 2
IN_CHANNELS = 64
OUT_CHANNELS = 128
HEIGHT = 16
WIDTH = 16
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
