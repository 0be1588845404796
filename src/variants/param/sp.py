"""`sp`, the standard parametrisation: initialisation, learning rates and the forward pass as the model's own
settings give them, at every width (today's behaviour, bit for bit)."""

from __future__ import annotations

from archsweep.variants.param import PARAM
from archsweep.variants.param.base import Parametrisation


@PARAM.register("sp")
class Standard(Parametrisation):
    label = "standard parametrisation"
