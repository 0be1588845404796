"""Positional encodings, one file per option; see `base.py` for the three hooks they share."""

from src.variants.pos.alibi import ALiBi
from src.variants.pos.base import NoPosition, PositionalEncoding
from src.variants.pos.learned import LearnedPosition
from src.variants.pos.relative import RelativeBias
from src.variants.pos.rotary import Rotary
from src.variants.pos.sinusoidal import Sinusoidal

__all__ = ["ALiBi", "LearnedPosition", "NoPosition", "PositionalEncoding", "RelativeBias", "Rotary", "Sinusoidal"]
