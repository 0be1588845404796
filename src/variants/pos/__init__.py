"""Positional encodings, one file per option; see `base.py` for the three hooks they share."""

from archsweep.variants.pos.alibi import ALiBi
from archsweep.variants.pos.base import NoPosition, PositionalEncoding
from archsweep.variants.pos.learned import LearnedPosition
from archsweep.variants.pos.relative import RelativeBias
from archsweep.variants.pos.rotary import Rotary
from archsweep.variants.pos.sinusoidal import Sinusoidal

__all__ = ["ALiBi", "LearnedPosition", "NoPosition", "PositionalEncoding", "RelativeBias", "Rotary", "Sinusoidal"]
