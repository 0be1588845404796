"""Analytic FLOP counts, assembled from what each part declares.

`forward_flops(module, shape)` is the forward pass's floating-point operations (a multiply-add counts 2) of a
module on a batch of this shape. A module that defines `flops(shape)` says its own count, its children
included; an `nn.Linear` costs 2 x in x out per token; any other module is the sum of its children. So a new FFN
made of `nn.Linear`s needs nothing, and a part doing other matmuls (an attention kernel's scores, a relative
encoding's position terms, a pooled head) declares them.

Only matrix products are counted (as `torch.utils.flop_counter` does): norms, activations, softmax, rotary
rotations and masking are elementwise and left out. Attention honours its masks: a query counts the keys it
actually sees (causal: (T + 1) / 2 on average, a window caps it), which is what a masked kernel needs, not what a
dense kernel executes. A training step costs 3 x the forward (the backward takes two products per forward
product: the input's gradient and the weight's); activation checkpointing recomputes the forward, which
model-FLOP utilisation does not count (it is hardware, not model, work).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing this module stays torch-free (shapes are planned before torch is loaded)
    from torch import nn

TRAIN_FACTOR = 3  # forward + backward = 3 x forward


@dataclass(frozen=True)
class Shape:
    """What one stack computes over: `batch` sequences of `length` tokens each; `causal` masks the future;
    `memory` is the source length an encoder-decoder's encoder reads and its decoder cross-attends to (0: none);
    `pooled`: the head reads one vector per sequence (classification) instead of every position; `total`: count
    the work of every parameter, as if each token used them all (a module that sends a token through part of its
    parameters, e.g. some experts, reads it; the default counts what a token uses)."""

    batch: int
    length: int
    causal: bool = False
    memory: int = 0
    pooled: bool = False
    total: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.length

    def replace(self, **changes: object) -> Shape:
        return dataclasses.replace(self, **changes)


def linear_flops(module: nn.Linear, tokens: int) -> float:
    return 2.0 * module.in_features * module.out_features * tokens


def forward_flops(module: nn.Module, shape: Shape) -> float:
    """Forward FLOPs of `module` on `shape` (see the module docstring)."""
    from torch import nn

    own = getattr(module, "flops", None)
    if callable(own):
        return float(own(shape))
    if isinstance(module, nn.Linear):
        return linear_flops(module, shape.tokens)
    return sum(forward_flops(child, shape) for child in module.children())


def children_flops(module: nn.Module, shape: Shape, skip: tuple[nn.Module, ...] = ()) -> float:
    """The children's FLOPs on `shape`, except those in `skip` (which the caller counts on another shape)."""
    return sum(forward_flops(child, shape) for child in module.children() if not any(child is s for s in skip))
