"""`mup`, the maximal update parametrisation (Yang et al. 2022, "Tensor Programs V: Tuning Large Neural Networks
via Zero-Shot Hyperparameter Transfer", Table 3 and appendix B), for Adam-type updates and, through the spectral
condition (Yang, Simon and Bernstein 2023), for Muon: every layer's update moves its output by an amount that does
not depend on the width, so the best learning rate found at `base_width` holds at wider models.

Relative to the base model (d_model = base_width; d_ff, a ViT's head_hidden and head_dim scaled with it; heads,
layers and every variant's own sizes unchanged), for a parameter whose fan-in grew by m_in and fan-out by m_out:

| role: dimensions that scale | initial std | Adam learning rate | Muon learning rate |
| --- | --- | --- | --- |
| matrix: both | / sqrt(m_in) | / m_in | x sqrt(m_out / m_in) |
| matrix: the fan-in only (a readout) | / m_in | / m_in | x sqrt(1 / m_in) |
| matrix: the fan-out only | same | same | x sqrt(m_out) |
| embedding, vector | same | same | (AdamW) |

An untied output head (role head) starts at zero (`zero_readout`, the default, as Tensor Programs V's experiments and
the `mup` package recommend): its initial logits would vanish with the width anyway, and a classifier's initial
logits at the base width are otherwise what its first updates spend their change on cancelling (the coordinate check
measured a ViT classifier's change shrinking 1.8x from d_model 64 to 512 after 4 steps, 2.2x after 12, while its
output after training held within 1.1x). With `zero_readout=false` the model at the base width is the standard
one exactly.

A matrix is a parameter of role hidden, hidden_out, expert, head or router. Readouts: an untied head, a gate per
head, a projection to a fixed-rank latent; a patch projection widens only its fan-out. A router (an MoE's) starts
as a hidden matrix: its scores only select and weight experts, and from a readout's start they vanish with the width
while its first updates, with no consistent routing signal yet, are as good as random (the coordinate check measured
its change shrinking 2.7x from d_model 64 to 512 after 4 and after 12 steps; from the hidden start it holds).

The readout rule (TP5's initial variance 1/fan_in^2) matters beyond the head: a matrix that narrows the width to
a fixed size sees inputs whose change is aligned with its own initial weights, and a 1/sqrt(fan_in) start lets
that product grow with the width (the coordinate check shows it on a headwise attention gate).

The forward pass: attention scores sqrt(base head_dim) / head_dim instead of 1 / sqrt(head_dim); a head tied to
the input embedding multiplies its logits by base_width / d_model (the untied head's 1 / m_in is in its init and
rate, an equivalent form); a sqrt(d_model) embedding factor stays at sqrt(base_width). At the base width every
factor is 1 and the model is the standard one (but for a zeroed untied head, above). Adam's epsilon is not scaled
(1e-9 here, far below the gradients' root mean square at these widths), and decoupled weight decay follows the
scaled rate as in the authors' `mup` package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from archsweep.variants.param import PARAM
from archsweep.variants.param.base import ForwardScales, Parametrisation, Widths, scaled_widths
from archsweep.variants.roles import EXPERT, HEAD, HIDDEN, HIDDEN_OUT, ROUTER

MATRICES = (HIDDEN, HIDDEN_OUT, EXPERT, HEAD, ROUTER)


@PARAM.register("mup")
class MuP(Parametrisation):
    transfers_width = True
    label = "maximal update parametrisation"

    def __init__(self, base_width: int = 64, base_d_ff: int | None = None, zero_readout: bool = True) -> None:
        self.base_width, self.base_d_ff, self.zero_readout = base_width, base_d_ff, zero_readout

    def base_sizes(self, sizes: Mapping[str, Any]) -> dict[str, Any]:
        base = scaled_widths(sizes, self.base_width)
        return {**base, "d_ff": self.base_d_ff} if self.base_d_ff else base

    def init_scale(self, role: str | None, widths: Widths) -> float:
        if role == HEAD and self.zero_readout:
            return 0.0  # the output head starts at zero at every width (TP5's and the `mup` package's choice)
        if role not in MATRICES:
            return 1.0
        readout = widths.fan_out == 1.0 and role != ROUTER
        return 1.0 / widths.fan_in if readout else widths.fan_in ** -0.5

    def adam_lr(self, role: str | None, widths: Widths) -> float:
        return 1.0 / widths.fan_in if role in MATRICES else 1.0

    def spectral_lr(self, role: str | None, widths: Widths) -> float:
        return math.sqrt(widths.fan_out / widths.fan_in) if role in MATRICES else 1.0

    def forward_scales(self, sizes: Mapping[str, Any], base: Mapping[str, Any]) -> ForwardScales:
        width = sizes["d_model"] / base["d_model"]
        return ForwardScales(scores=math.sqrt(base["head_dim"] / sizes["head_dim"]), logits=1.0 / width,
                             embedding=width ** -0.5)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        base, d_ff = options["base_width"], options["base_d_ff"]
        if not isinstance(base, int) or base < 1:
            raise ValueError(f"param.base_width={base!r} must be a positive width (the d_model the learning rate is "
                             f"tuned at)")
        if base % sizes["n_heads"]:
            raise ValueError(f"param.base_width={base} must be a multiple of n_heads={sizes['n_heads']} (the base "
                             f"model keeps the heads and scales head_dim)")
        if d_ff is not None and d_ff < 1:
            raise ValueError(f"param.base_d_ff={d_ff} must be a positive width or null (d_ff scaled like d_model)")
