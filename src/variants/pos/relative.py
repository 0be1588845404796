"""`relative` (Raffel et al. 2020, T5): a learned scalar bias per head and per bucket of query-key distance.

Distances below num_buckets/2 (per direction) get a bucket each; longer ones share log-spaced buckets up to
max_distance. Encoders use bidirectional buckets (half for keys after the query); causal self-attention uses
only past distances. One table per stack, shared by all its layers, as in T5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from archsweep.variants.pos import POS
from archsweep.variants.pos.base import PositionalEncoding, query_key_distance


def relative_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Map key-minus-query distances to bucket ids in [0, num_buckets)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets  # keys after the query use the upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # only the past counts; future keys are masked anyway
    exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


@POS.register("relative")
class RelativeBias(PositionalEncoding):
    score_bias = True

    def __init__(self, n_heads: int, causal: bool, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.bidirectional = not causal
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bias = nn.Embedding(num_buckets, n_heads)

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        for key in ("num_buckets", "max_distance"):
            if options[key] < 1:
                raise ValueError(f"pos=relative: {key}={options[key]!r} must be a positive integer")
        if options["num_buckets"] < 4:
            raise ValueError(f"pos=relative: num_buckets={options['num_buckets']} is too small; use at least 4 "
                             f"(T5 uses 32)")

    def attn_bias(self, q_len: int, k_len: int, device: torch.device) -> Tensor:
        relative = query_key_distance(q_len, k_len, device)  # (Tq, Tk)
        buckets = relative_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, Tq, Tk)

    def extra_repr(self) -> str:
        return f"bidirectional={self.bidirectional}, num_buckets={self.num_buckets}, max_distance={self.max_distance}"
