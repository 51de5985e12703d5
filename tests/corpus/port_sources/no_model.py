"""A PyTorch file whose module is not called Model: `kernelbot port` must say so."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def get_inputs():
    return [torch.randn(8, 128)]
