"""Kernel (feature-map) attention, the shared part of `linear` and `performer` (Katharopoulos et al. 2020,
"Transformers are RNNs", section 3.2): with a feature map phi, softmax(q k^T) is replaced by phi(q) phi(k)^T,
so attention is phi(q_i)^T S / (phi(q_i)^T z + eps) with S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j). No
T x T matrix is formed: the cost is linear in the length.

Causal form: a chunked prefix sum. Within a chunk of C tokens the masked quadratic form is used; across chunks a
prefix sum of per-chunk states, so memory is O(T Dh^2 / C) rather than a T x Dh x Dh cumulative sum. Decoding
keeps (S, z) in the cache: a constant-size recurrent state instead of a growing KV cache. Padding keys get zero
features. Everything is accumulated in fp32, also under bf16 autocast. There are no attention probabilities to
drop out: the layer's attention dropout does not apply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from archsweep.variants.attention.base import AttentionKernel, AttnContext, repeat_kv

State = dict[str, Tensor]  # "S" (B, H, F, Dh), "z" (B, H, F), optionally "m" (B, H, 1, 1): keys' log-scale


def causal_linear(fq: Tensor, fk: Tensor, v: Tensor, s0: Tensor, z0: Tensor, chunk: int,
                  eps: float | Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """fq, fk: (B, H, T, F) features, v: (B, H, T, Dv), prior state s0 (B, H, F, Dv), z0 (B, H, F); eps a number
    or (B, H, T) per query.

    Returns the outputs (B, H, T, Dv) and the state after the last token."""
    b, h, t, f = fq.shape
    n = -(-t // chunk)
    extra = n * chunk - t
    if extra:  # zero features past the end contribute nothing; their outputs are dropped
        fq, fk, v = (F.pad(x, (0, 0, 0, extra)) for x in (fq, fk, v))
        if isinstance(eps, Tensor):
            eps = F.pad(eps, (0, extra), value=1.0)
    if isinstance(eps, Tensor):
        eps = eps.view(b, h, n, chunk)
    fq, fk = fq.view(b, h, n, chunk, f), fk.view(b, h, n, chunk, f)
    v = v.view(b, h, n, chunk, v.shape[-1])
    kv = fk.transpose(-1, -2) @ v  # (B, H, n, F, Dv): each chunk's sum of phi(k) v^T
    zc = fk.sum(dim=3)  # (B, H, n, F)
    s_before = s0[:, :, None] + torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1].cumsum(2)], dim=2)
    z_before = z0[:, :, None] + torch.cat([torch.zeros_like(zc[:, :, :1]), zc[:, :, :-1].cumsum(2)], dim=2)
    inner = (fq @ fk.transpose(-1, -2)).tril()  # (B, H, n, C, C) within-chunk, causal
    num = fq @ s_before + inner @ v  # (B, H, n, C, Dv)
    den = (fq * z_before[:, :, :, None, :]).sum(-1) + inner.sum(-1)  # (B, H, n, C)
    out = (num / (den + eps)[..., None]).view(b, h, n * chunk, -1)[:, :, :t]
    return out, s_before[:, :, -1] + kv[:, :, -1], z_before[:, :, -1] + zc[:, :, -1]


def global_linear(fq: Tensor, fk: Tensor, v: Tensor, eps: float | Tensor) -> Tensor:
    """Non-causal: every query reads every (non-padding) key. eps: a number or (B, H, Tq) per query."""
    s, z = fk.transpose(-1, -2) @ v, fk.sum(dim=2)  # (B, H, F, Dv), (B, H, F)
    eps = eps[..., None] if isinstance(eps, Tensor) else eps
    return (fq @ s) / ((fq * z[:, :, None, :]).sum(-1, keepdim=True) + eps)


def implied_weights(fq: Tensor, fk: Tensor, causal: bool, eps: float | Tensor) -> Tensor:
    """The (B, H, Tq, Tk) attention matrix the kernel method implies: phi(q_i).phi(k_j) / (row sum + eps)."""
    a = fq @ fk.transpose(-1, -2)
    if causal:
        a = a.tril(fk.shape[2] - fq.shape[2])
    return a / (a.sum(-1, keepdim=True) + (eps[..., None] if isinstance(eps, Tensor) else eps))


class FeatureMapAttention(AttentionKernel):
    """Subclasses give `query_features` and `key_features`, each with an optional log-scale m: the features
    returned are phi(x) / exp(m), which keeps exp() in range. The normaliser's eps is applied on the true scale,
    so results do not depend on m (and cached decoding equals the full forward)."""

    forms_scores = False
    DOC_MASK_REFUSAL = "its kernel feature map sums keys without a score matrix to mask"

    def __init__(self, layer: int, causal: bool, chunk_size: int, eps: float) -> None:
        super().__init__()
        self.layer, self.causal, self.chunk_size, self.eps = layer, causal, chunk_size, eps

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if options["chunk_size"] < 1:
            raise ValueError(f"attention.chunk_size={options['chunk_size']} must be at least 1 (tokens per chunk "
                             f"of the causal prefix sum; 64 is a good default)")
        if options["eps"] <= 0:
            raise ValueError(f"attention.eps={options['eps']} must be positive (it keeps the normaliser off zero)")

    @classmethod
    def doc_mask_refusal(cls, options: Mapping[str, Any]) -> str | None:
        return cls.DOC_MASK_REFUSAL

    def query_features(self, q: Tensor) -> tuple[Tensor, Tensor | None]:
        """phi(q) / exp(m) and m (B, H, T, 1) per query, or None when no rescaling is needed."""
        raise NotImplementedError

    def key_features(self, k: Tensor) -> tuple[Tensor, Tensor | None]:
        """phi(k) / exp(m) and m (B, H, 1, 1) shared by the keys, or None when no rescaling is needed."""
        raise NotImplementedError

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, dropout: float,
                record: list[Tensor] | None) -> Tensor:
        if ctx.doc_ids is not None:
            raise ValueError(f"doc_ids were given, but attention={self.option_name} cannot keep documents apart: "
                             f"{self.DOC_MASK_REFUSAL}; call without doc_ids (task.doc_mask=false) or choose an "
                             f"attention kind that forms a score matrix")
        with torch.autocast(q.device.type, enabled=False):
            k, v = repeat_kv(q, k, v)
            wide = torch.promote_types(q.dtype, torch.float32)  # float32 at least (float64 stays float64)
            q_wide, k, v = q.to(wide), k.to(wide), v.to(wide)
            (fq, mq), (fk, m) = self.query_features(q_wide), self.key_features(k)  # (B, H, T, F)
            pad = ctx.key_padding(k.shape[2])
            if pad is not None:
                fk = fk * pad[:, None, :, None]
            if record is not None:
                record.append(implied_weights(fq, fk, self.causal, self._eps(mq, m)).detach())
            if not self.causal:
                return global_linear(fq, fk, v, self._eps(mq, m)).to(q.dtype)
            state = ctx.cache.states.get(self.layer) if ctx.cache is not None else None
            s0, z0, fk, m = self._prior(state, fk, m, v)
            out, s, z = causal_linear(fq, fk, v, s0, z0, self.chunk_size, self._eps(mq, m))
            if ctx.cache is not None:
                ctx.cache.states[self.layer] = {"S": s, "z": z} if m is None else {"S": s, "z": z, "m": m}
            return out.to(q.dtype)

    def _eps(self, mq: Tensor | None, mk: Tensor | None) -> float | Tensor:
        """eps on the scale of the rescaled features: eps / exp(mq + mk), (B, H, T) per query."""
        if mq is None and mk is None:
            return self.eps
        log = math.log(self.eps) - (mq[..., 0] if mq is not None else 0.0) - (mk[..., 0] if mk is not None else 0.0)
        return torch.exp(log)

    def _prior(self, state: State | None, fk: Tensor, m: Tensor | None,
               v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The cached state and the new key features on one common scale (the larger of the two log-scales)."""
        b, h, _, f = fk.shape
        if state is None:
            return fk.new_zeros(b, h, f, v.shape[-1]), fk.new_zeros(b, h, f), fk, m
        s0, z0 = state["S"], state["z"]
        if m is not None:
            top = torch.maximum(state["m"], m)
            old, new = torch.exp(state["m"] - top), torch.exp(m - top)  # (B, H, 1, 1)
            s0, z0, fk, m = s0 * old, z0 * old[..., 0], fk * new, top
        return s0, z0, fk, m

    def flops_per_token(self, seq_len: int, causal: bool, n_heads: int, head_dim: int) -> float:
        f = self.n_features(head_dim)
        flops = 2 * f * head_dim * 2 + 2 * f * 2  # phi(k) v^T into S, phi(q) S; z and phi(q) z
        if causal:  # the masked quadratic form inside a chunk: scores and values over (C + 1) / 2 keys
            c = min(self.chunk_size, seq_len)
            flops += 2 * (f + head_dim) * (c + 1) / 2
        return float(n_heads * (flops + self.feature_flops(head_dim)))

    def n_features(self, head_dim: int) -> int:
        return head_dim

    def feature_flops(self, head_dim: int) -> float:
        """FLOPs per token and head of the feature maps of one query and one key."""
        return 0.0
