"""`gelu` (Hendrycks & Gimpel 2016; BERT, GPT-2): down(gelu(up(x))); `approximate="tanh"` is GPT-2's gelu_new."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F

from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import FeedForward

APPROXIMATIONS = ("none", "tanh")


def check_approximate(options: Mapping[str, Any]) -> None:
    if options["approximate"] not in APPROXIMATIONS:
        raise ValueError(f"approximate={options['approximate']!r} is not a known option; valid options: "
                         f"{', '.join(APPROXIMATIONS)} (tanh: GPT-2's approximation)")


def gelu(approximate: str):
    return F.gelu if approximate == "none" else functools.partial(F.gelu, approximate=approximate)


@FFN.register("gelu")
class GELUFFN(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool, approximate: str = "none") -> None:
        super().__init__(d_model, d_ff, gelu(approximate), dropout, bias)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        check_approximate(options)
