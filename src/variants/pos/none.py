"""`none`: no positional information at all (causal models can still infer position, Haviv et al. 2022)."""

from __future__ import annotations

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding


@POS.register("none")
class NoPosition(PositionalEncoding):
    pass
