"""Norm placement: how a sublayer is wrapped with its residual connection ("Add & Norm").

- post (Vaswani et al. 2017): x = norm(x + sublayer(x)); no norm after the stack.
- pre (Wang et al. 2019, GPT-2): x = x + sublayer(norm(x)); one final norm after the stack.
- sandwich (Ding et al. 2021, CogView): x = x + norm_out(sublayer(norm_in(x))); final norm after the stack.
- deepnorm (Wang et al. 2022, DeepNet): x = norm(alpha * x + sublayer(x)), with sublayer weights initialised
  scaled by beta (see `init.deepnorm_constants`); no final norm.

Every wrapper applies dropout to the sublayer output before the residual add, as the 2017 paper does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

NormFactory = Callable[[], nn.Module]
Sublayer = Callable[[Tensor], Tensor]


class Residual(nn.Module):
    """Base of the placements. `final_norm` says whether the stack ends with a norm."""

    final_norm = False

    def __init__(self, norm: NormFactory, dropout: float) -> None:
        super().__init__()
        self.norm = norm()
        self.p = dropout

    def dropout(self, x: Tensor) -> Tensor:
        # functional, and skipped at p = 0: a module call per sublayer is measurable overhead when decoding
        return F.dropout(x, self.p, self.training) if self.p > 0 else x

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"dropout={self.p}"


class PostNorm(Residual):
    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return self.norm(x + self.dropout(sublayer(x)))


class PreNorm(Residual):
    final_norm = True

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return x + self.dropout(sublayer(self.norm(x)))


class SandwichNorm(Residual):
    final_norm = True

    def __init__(self, norm: NormFactory, dropout: float) -> None:
        super().__init__(norm, dropout)
        self.out_norm = norm()

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return x + self.dropout(self.out_norm(sublayer(self.norm(x))))


class DeepNorm(Residual):
    def __init__(self, norm: NormFactory, dropout: float, alpha: float) -> None:
        super().__init__(norm, dropout)
        self.alpha = alpha

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return self.norm(x * self.alpha + self.dropout(sublayer(x)))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4f}, dropout={self.p}"


PLACEMENTS: dict[str, type[Residual]] = {
    "post": PostNorm,
    "pre": PreNorm,
    "sandwich": SandwichNorm,
    "deepnorm": DeepNorm,
}
