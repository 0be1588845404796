"""Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2), with grouped-query key/value
heads (Ainslie et al. 2023; one head is multi-query, Shazeer 2019).

The fast path is `torch.nn.functional.scaled_dot_product_attention`. Inside `capture_attention(model)` the same
attention is computed explicitly so the probabilities can be kept for visualisation; outputs are identical.
Masks follow SDPA: a boolean mask is True where a query may attend a key; a float mask is added to the scores.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.cache import KVCache


@dataclass
class AttnContext:
    """What every self-attention layer of one stack forward shares (computed once per forward)."""

    mask: Tensor | None  # bool keep-mask or float bias, broadcastable to (B, H, Tq, Tk)
    is_causal: bool  # let SDPA apply the causal mask itself (only when mask is None and Tq == Tk)
    positions: Tensor  # (B or 1, Tq) absolute positions of the queries
    rotate_qk: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
    cache: KVCache | None


def self_attn_mask(pad_mask: Tensor | None, causal: bool, q_len: int, k_len: int, bias: Tensor | None,
                   device: torch.device) -> tuple[Tensor | None, bool]:
    """Combine padding, causality and an additive bias into one SDPA mask; returns (mask, is_causal).

    pad_mask: (B, Tk) True at real tokens. Keys cached earlier come first, so the causal diagonal is offset by
    Tk - Tq. A query that can see no key at all (a pad before a left-padded prompt) is allowed to see every key,
    which keeps its (ignored) output finite instead of NaN.
    """
    if pad_mask is None and bias is None:
        if not causal or q_len == 1:
            return None, False
        if q_len == k_len:
            return None, True
    keep = None
    if causal and q_len > 1:
        keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)  # (Tq, Tk)
    if pad_mask is not None:
        pad = pad_mask[:, None, None, :]  # (B, 1, 1, Tk)
        keep = pad if keep is None else keep & pad  # (B, 1, Tq or 1, Tk)
        keep = keep | ~keep.any(dim=-1, keepdim=True)
    if bias is None:
        return keep, False
    if keep is None:
        return bias, False
    return bias.masked_fill(~keep, float("-inf")), False


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float,
           record: list[Tensor] | None) -> Tensor:
    """q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh)."""
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if record is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = scores.softmax(dim=-1)
    record.append(probs.detach())
    return F.dropout(probs, dropout, training=dropout > 0) @ v


class Attention(nn.Module):
    """Shared sizes and output projection of self- and cross-attention."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.layer = layer  # index into the KV cache
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.record: list[Tensor] | None = None  # set by capture_attention

    def split_heads(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, Dh)

    def merge_heads(self, y: Tensor) -> Tensor:
        b, _, t, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))  # (B, T, D)

    def p_drop(self) -> float:
        return self.dropout if self.training else 0.0


class SelfAttention(Attention):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, dropout, bias, layer)
        self.qkv_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)

    def forward(self, x: Tensor, ctx: AttnContext) -> Tensor:
        qkv = self.split_heads(self.qkv_proj(x), self.n_heads + 2 * self.n_kv_heads)  # (B, H + 2 Hkv, T, Dh)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = ctx.rotate_qk(q, k, ctx.positions)
        if ctx.cache is not None:
            k, v = ctx.cache.append(self.layer, k, v)  # (B, Hkv, cached + T, Dh)
        return self.merge_heads(attend(q, k, v, ctx.mask, ctx.is_causal, self.p_drop(), self.record))


class CrossAttention(Attention):
    """Decoder queries over encoder output ("memory"); no positional encoding acts here, as in T5."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, dropout: float, bias: bool, layer: int) -> None:
        super().__init__(d_model, n_heads, n_kv_heads, dropout, bias, layer)
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=bias)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None, cache: KVCache | None) -> Tensor:
        q = self.split_heads(self.q_proj(x), self.n_heads)
        if cache is not None and self.layer in cache.cross:
            k, v = cache.cross[self.layer]
        else:
            k, v = self.kv_proj(memory).chunk(2, dim=-1)
            k, v = self.split_heads(k, self.n_kv_heads), self.split_heads(v, self.n_kv_heads)
            if cache is not None:
                cache.cross[self.layer] = (k, v)
        return self.merge_heads(attend(q, k, v, mask, False, self.p_drop(), self.record))


@contextlib.contextmanager
def capture_attention(model: nn.Module) -> Iterator[dict[str, list[Tensor]]]:
    """Record attention probabilities of every attention module while the block runs.

    Yields {module name: [probabilities (B, H, Tq, Tk) for each forward call]}; names look like
    `decoder.blocks.0.self_attn`. Uses the explicit (slower) path; outputs equal the SDPA path.
    """
    captured: dict[str, list[Tensor]] = {}
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, Attention)]
    for name, module in modules:
        module.record = captured.setdefault(name, [])
    try:
        yield captured
    finally:
        for _, module in modules:
            module.record = None
