"""Dropout (Srivastava et al. 2014) with a cheaper mask: every layer of the package drops out through here, except
attention probabilities, which SDPA drops itself (`dropout_p`).

`F.dropout` on a CPU draws one Bernoulli sample per element (`bernoulli_`), which measured about a quarter of a
training step of the default model. Here one 64-bit random draw gives the keep/drop decisions of four elements
(four 16-bit lanes compared with round(p * 2^16)), so the drop rate is p to within 2^-17 and kept elements are
scaled by 1 / (1 - p), as `F.dropout` does. The same computation runs on every device and under `torch.compile`
(an out-of-place `randint`, which dynamo traces; inductor draws it from its own generator); p = 0 or eval mode does
no work at all. The stream is the device's default generator, so a seed repeats the same masks.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

LANES = 4  # 16-bit lanes per 64-bit draw


def apply_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Zero each element with probability p and scale the others by 1 / (1 - p); identity at p = 0 or in eval."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0  # every element dropped (as F.dropout at p = 1)
    return x * keep_mask(x, p)


class Dropout(nn.Module):
    """`apply_dropout` as a module (a place for hooks, e.g. after the embedding); no work at p = 0 or in eval."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability {p} must be between 0 and 1")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return apply_dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A mask shaped like x: 1 / (1 - p) where kept, 0 where dropped, from one int64 draw per four elements."""
    n = x.numel()
    draws = torch.randint(-2**63, 2**63 - 1, ((n + LANES - 1) // LANES,), dtype=torch.int64, device=x.device)
    lanes = draws.view(torch.int16)[:n].view(x.shape)  # uniform in [-2^15, 2^15)
    threshold = round(p * 65536) - 32768  # a lane below it drops its element
    return (lanes >= threshold).to(x.dtype).mul_(1.0 / (1.0 - p))
