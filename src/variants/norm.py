"""Norm types: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019, no mean-centering, no bias).

The norm type is orthogonal to where the norm sits; placement lives in `residual.py`.
"""

from __future__ import annotations

from torch import nn


def make_norm(norm_type: str, d_model: int, eps: float) -> nn.Module:
    if norm_type == "layernorm":
        return nn.LayerNorm(d_model, eps=eps)
    if norm_type == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm_type={norm_type!r} is not a known option; valid options: layernorm, rmsnorm")
