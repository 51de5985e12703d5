"""A KernelBench-style module whose forward raises in PyTorch: `kernelbot port` must name the line."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight  # x is [8, 128]: the shapes do not fit


def get_inputs():
    return [torch.randn(8, 128)]


def get_init_inputs():
    return []
