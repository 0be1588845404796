"""`parallel` (GPT-J, Wang & Komatsuzaki 2021; PaLM, Chowdhery et al. 2022, section 2): the sublayers of a block
read the same input and their outputs are added to it at once, x + attn(norm(x)) + ffn(norm(x)), instead of the
FFN reading the attention's output; the two matrix products can then run together. Final norm after the stack.

`shared_norm` (default, as GPT-J and PaLM): one norm feeds every branch; false: one norm per branch (GPT-NeoX's
`use_parallel_residual`). A decoder layer with cross-attention adds it as a third parallel branch,
x + self_attn(norm(x)) + cross_attn(norm(x), memory) + ffn(norm(x)): one residual add per layer, as in the
decoder-only block (no published recipe fixes this case; the encoder-decoder follows the same rule)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from archsweep.variants.norm import NORM
from archsweep.variants.norm.base import Branch, NormFactory, Residual, Sublayer


@NORM.register("parallel")
class Parallel(Residual):
    final_norm = True
    formula = "x + attn(norm(x)) + ffn(norm(x))"

    def __init__(self, make_norm: NormFactory, dropout: float, shared_norm: bool = True) -> None:
        super().__init__(make_norm, dropout)
        self.shared_norm = shared_norm

    def forward(self, x: Tensor, sublayer: Sublayer, *args: Any) -> Tensor:  # one sublayer alone: pre-norm
        return x + self.dropout(sublayer(self.norm(x), *args))

    def bind(self, wrappers: list[Residual]) -> None:
        if self.shared_norm:  # this wrapper's norm serves the block; the others keep none (no unused weights)
            for wrapper in wrappers[1:]:
                wrapper.norm = nn.Identity()

    def compose(self, x: Tensor, branches: list[Branch]) -> Tensor:
        shared = self.norm(x) if self.shared_norm else None  # (B, T, D)
        out = x
        for wrapper, sublayer, args in branches:
            out = out + wrapper.dropout(sublayer(shared if shared is not None else wrapper.norm(x), *args))
        return out

    def extra_repr(self) -> str:
        return f"shared_norm={self.shared_norm}, dropout={self.p}"
