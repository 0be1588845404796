"""`rotary` (Su et al. 2021, RoFormer): rotate each query/key channel pair by an angle proportional to position.

Rotate-half convention of Hugging Face Llama and GPT-NeoX: channel i pairs with channel i + head_dim/2, and
frequency theta_i = base^(-2i/head_dim). Scores then depend on positions only through their difference.

`scaling` stretches a model trained at `original_length` tokens to `factor` times that (factor 1: plain RoPE):
- `linear`, position interpolation (Chen et al. 2023): position m rotates as m / factor does without it;
- `ntk`, the NTK-aware change of base: base * factor^(Dh / (Dh - 2)), so the lowest frequency is interpolated
  and the highest barely moves;
- `yarn` (Peng et al. 2023): per frequency, interpolate those whose wavelength is long against the original
  context (fewer than `beta_slow` turns in it), keep those with more than `beta_fast` turns, blend linearly in
  between; and scale q and k each by 0.1 ln(factor) + 1 (the paper's attention temperature, sqrt(1/t)).
  `yarn_ramp` says how "in between" is blended. `paper`: linear in the number of turns, the paper's ramp
  gamma(r) = (r - beta_slow) / (beta_fast - beta_slow). `code` (the default): linear in the channel-pair index
  between the indices where the turns cross beta_fast and beta_slow (rounded outwards), what the YaRN authors' code
  and Hugging Face's `_compute_yarn_parameters` compute, so results compare with the published models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding

SCALINGS = ("none", "linear", "ntk", "yarn")
YARN_RAMPS = ("code", "paper")


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def yarn_frequencies(inv_freq: Tensor, factor: float, original_length: int, beta_fast: float,
                     beta_slow: float, ramp: str = "code", base: float = 10000.0) -> Tensor:
    """Blend interpolated (inv_freq / factor) and original frequencies by how many turns each makes in the
    original context: all interpolated below beta_slow turns, all original above beta_fast; in between linearly in
    the turns (`ramp="paper"`) or in the channel-pair index (`"code"`; inv_freq must then be base^(-2i / Dh))."""
    turns = original_length * inv_freq / (2 * math.pi)  # rotations of each channel pair over the context
    if ramp == "paper":
        keep = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)  # 1: keep, 0: interpolate
    else:
        dim = 2 * inv_freq.numel()

        def index(n_turns: float) -> float:  # the channel pair (a real number) making n_turns turns
            return dim * math.log(original_length / (n_turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(index(beta_fast)), 0), min(math.ceil(index(beta_slow)), dim - 1)
        high = high + 0.001 if high == low else high  # as the reference code: no division by zero
        pair = torch.arange(inv_freq.numel(), dtype=torch.float32, device=inv_freq.device)
        keep = 1 - ((pair - low) / (high - low)).clamp(0.0, 1.0)
    return inv_freq / factor * (1 - keep) + inv_freq * keep


@POS.register("rotary")
class Rotary(PositionalEncoding):
    def __init__(self, head_dim: int, base: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                 original_length: int | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 max_seq_len: int | None = None, yarn_ramp: str = "code") -> None:
        super().__init__()
        self.scaling, self.factor = scaling, factor
        if scaling == "ntk":
            base = base * factor ** (head_dim / (head_dim - 2))
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        if scaling == "yarn" and factor != 1:
            inv_freq = yarn_frequencies(inv_freq, factor, original_length or max_seq_len or 512, beta_fast,
                                        beta_slow, yarn_ramp, base)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.position_scale = 1.0 / factor if scaling == "linear" else 1.0
        self.magnitude = 0.1 * math.log(factor) + 1.0 if scaling == "yarn" and factor > 1 else 1.0

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        name = cls.option_name
        if sizes["head_dim"] % 2:
            raise ValueError(f"pos={name} needs an even head dimension, but d_model/n_heads = "
                             f"{sizes['d_model']}/{sizes['n_heads']} = {sizes['head_dim']}; change d_model or n_heads")
        if options["base"] <= 1:
            raise ValueError(f"pos={name}: base={options['base']} must be greater than 1 (10000 is the usual value)")
        if "scaling" not in options:
            return
        if options["scaling"] not in SCALINGS:
            raise ValueError(f"pos=rotary: scaling={options['scaling']!r} must be one of {', '.join(SCALINGS)}")
        if options["factor"] < 1:
            raise ValueError(f"pos=rotary: factor={options['factor']} must be >= 1 (the context is stretched "
                             f"factor times; 1 is plain RoPE)")
        if options["scaling"] == "ntk" and sizes["head_dim"] <= 2:
            raise ValueError("pos=rotary: scaling=ntk needs head_dim > 2")
        if options["yarn_ramp"] not in YARN_RAMPS:
            raise ValueError(f"pos=rotary: yarn_ramp={options['yarn_ramp']!r} must be code (linear in the channel "
                             f"index, as the YaRN authors' and Hugging Face's code) or paper (linear in the turns)")
        if options["scaling"] == "yarn" and not options["beta_fast"] > options["beta_slow"] > 0:
            raise ValueError(f"pos=rotary: scaling=yarn needs beta_fast > beta_slow > 0, got beta_fast="
                             f"{options['beta_fast']}, beta_slow={options['beta_slow']} (the paper: 32 and 1)")

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles = (positions.float() * self.position_scale).unsqueeze(-1) * self.inv_freq  # (B, T, Dh/2)
        angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)  # (B, 1, T, Dh)
        return (angles.cos() * self.magnitude).to(dtype), (angles.sin() * self.magnitude).to(dtype)

    def rotate_qk(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(positions, q.dtype)  # q, k: (B, H, T, Dh)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
