"""Norm placement: how a sublayer is wrapped with its residual connection ("Add & Norm"), and its registry.

Every wrapper applies dropout to the sublayer output before the residual add, as the 2017 paper does. The norm
type (LayerNorm, Ba et al. 2016; RMSNorm, Zhang & Sennrich 2019: no mean-centering, no bias) is a separate
choice (`norm_type`), handed to the placement as a factory; `dyt` (Dynamic Tanh, Zhu et al. 2025, "Transformers
without Normalization", arXiv 2503.10622) stands in for a norm with no statistics at all: gamma * tanh(alpha x) +
beta.

A new placement is one file in this folder, `@NORM.register("<name>")` on its class, and `conf/norm/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from archsweep.variants.dropout import apply_dropout
from archsweep.variants.norm import NORM_TYPES

NormFactory = Callable[[], nn.Module]
Sublayer = Callable[..., Tensor]  # called as sublayer(normalised input, *args)
Branch = tuple["Residual", Sublayer, tuple[Any, ...]]  # the wrapper of a residual, its sublayer, the extra args

class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm calling the op directly: F.layer_norm's Python checks are a measurable share of a decoding step."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class DynamicTanh(nn.Module):
    """DyT(x) = gamma * tanh(alpha x) + beta (Zhu et al. 2025, equation 1): alpha one learnable scalar (the paper's
    default start 0.5), gamma and beta per channel (ones, zeros; beta only with `bias`). No eps: nothing is divided."""

    def __init__(self, d: int, bias: bool = True, alpha: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(alpha))
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.tanh(self.alpha * x) * self.weight
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}"


NORM_MODULES: dict[str, Callable[[int, float, bool], nn.Module]] = {
    "layernorm": lambda d, eps, bias: LayerNorm(d, eps=eps, bias=bias),
    "rmsnorm": lambda d, eps, bias: nn.RMSNorm(d, eps=eps),  # no bias in any case
    "dyt": lambda d, eps, bias: DynamicTanh(d, bias=bias),  # model.norm_bias keeps or drops beta; eps unused
}


def make_norm(norm_type: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """A norm of `norm_type`; `bias=False` drops LayerNorm's additive bias (`model.norm_bias`)."""
    if norm_type not in NORM_TYPES:
        raise ValueError(f"norm_type={norm_type!r} is not a known option; valid options: {', '.join(NORM_TYPES)}")
    return NORM_MODULES[norm_type](d_model, eps, bias)


class Residual(nn.Module):
    """Base of the placements. `final_norm` says whether the stack ends with a norm; `formula` is what the shape
    trace prints."""

    final_norm: ClassVar[bool] = False
    formula: ClassVar[str] = "x + sublayer(x)"

    def __init__(self, make_norm: NormFactory, dropout: float) -> None:
        super().__init__()
        self.norm = make_norm()
        self.p = dropout

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError if the placement cannot work with these sizes."""

    def dropout(self, x: Tensor) -> Tensor:
        # functional, and skipped at p = 0 or in eval without a call: per-sublayer calls count when decoding
        return x if self.p == 0.0 or not self.training else apply_dropout(x, self.p, True)

    def forward(self, x: Tensor, sublayer: Sublayer, *args: Any) -> Tensor:
        """The residual around `sublayer(input, *args)` (the arguments are passed on, not closed over: a lambda
        per sublayer and step is measurable when decoding)."""
        raise NotImplementedError

    def bind(self, wrappers: list[Residual]) -> None:
        """Called by the Block on its first wrapper with all of its wrappers, in sublayer order (self-attention,
        cross-attention where there is one, FFN): state shared across a block's sublayers is set up here."""

    def compose(self, x: Tensor, branches: list[Branch]) -> Tensor:
        """A whole block, called on its first wrapper: by default one sublayer after another, each with its own
        residual. A placement that arranges the sublayers otherwise (`parallel`) overrides this."""
        for wrapper, sublayer, args in branches:
            x = wrapper(x, sublayer, *args)
        return x

    def init_sublayer(self, sublayer: nn.Module) -> None:
        """Called once the model is initialised, with the sublayer this wraps (DeepNorm rescales it)."""

    def extra_repr(self) -> str:
        return f"dropout={self.p}"

