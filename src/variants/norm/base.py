"""Norm placement: how a sublayer is wrapped with its residual connection ("Add & Norm"), and its registry.

Every wrapper applies dropout to the sublayer output before the residual add, as the 2017 paper does. The norm
type (`norm_type`: LayerNorm, RMSNorm, Dynamic Tanh, ...; `archsweep.variants.norm_type`) is a separate choice,
handed to the placement as a factory.

A new placement is one file in this folder, `@NORM.register("<name>")` on its class, and `conf/norm/<name>.yaml`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from archsweep.variants.dropout import apply_dropout

NormFactory = Callable[[], nn.Module]
Sublayer = Callable[..., Tensor]  # called as sublayer(normalised input, *args)
Branch = tuple["Residual", Sublayer, tuple[Any, ...]]  # the wrapper of a residual, its sublayer, the extra args

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

