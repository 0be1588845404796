"""Base class of the self-attention kinds, and what the layers of one stack forward share.

A kind receives projected, rotated queries, keys and values and returns the per-head context; it owns what
differs about it: which keys a query sees (its mask), what it keeps for decoding (`ctx.cache`), whether it forms
softmax probabilities (`forms_scores`: additive score biases and attention maps need them), whether it can apply
document masking (`doc_mask_refusal`) and its FLOPs.
Masks follow SDPA: a boolean mask is True where a query may attend a key; a float mask is added to the scores.
Document masking (`ctx.doc_ids`) is one more boolean term of that mask, the same computation on every device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archsweep.variants.cache import KVCache


@dataclass
class AttnContext:
    """What every self-attention layer of one stack forward shares; masks are built once and memoised."""

    pad_mask: Tensor | None  # (B, Tk) True at real tokens: cached keys first, then the Tq new ones
    causal: bool
    q_len: int
    k_len: int  # cached + new
    positions: Tensor  # (B or 1, Tq) absolute positions of the queries
    rotate_qk: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
    score_bias: Callable[[int, int, torch.device], Tensor | None]  # the positional encoding's additive bias
    cache: KVCache | None
    device: torch.device
    content_bias: Callable[[Tensor, Tensor, int], Tensor | None] = lambda q, k, layer: None  # per layer (Shaw)
    first_values: Tensor | None = None  # value residual: the first layer's new values (B, Hkv, Tq, Dh), set by it
    doc_ids: Tensor | None = None  # (B, Tk) document of every key, cached first; a query sees only its own document
    sink: Tensor | None = None  # (H,) sink logits of the layer attending now (set by it: a plug-in's `sink()`)
    score_mod: Callable[[Tensor], Tensor] | None = None  # the layer's plug-ins' `score_mod` on the scores; None: off
    # (key, value) pairs, found by equality, not by hashing: a key holds lengths (the cached length when decoding)
    # that torch.compile(dynamic=True) keeps symbolic, and hashing one fixes its value, a recompile per new token
    memo: list[tuple[Any, Any]] = field(default_factory=list)
    full: tuple[Tensor | None, bool] | None = None  # full_mask's, asked by every layer

    def once(self, key: Any, make: Callable[[], Any]) -> Any:
        for known, value in self.memo:
            if known == key:
                return value
        value = make()
        self.memo.append((key, value))
        return value

    def bias(self, n_keys: int) -> Tensor | None:
        """Score bias (1, H, Tq, n_keys) over the last n_keys keys (biases depend only on distances)."""
        return self.once(("bias", n_keys), lambda: self.score_bias(self.q_len, n_keys, self.device))

    def key_padding(self, n_keys: int) -> Tensor | None:
        """(B, n_keys) True at the real ones among the last n_keys keys."""
        return None if self.pad_mask is None else self.pad_mask[:, self.pad_mask.shape[1] - n_keys:]

    def same_doc(self, n_keys: int) -> Tensor | None:
        """(B, 1, Tq, n_keys) True where a query and one of the last n_keys keys share a document; None: no
        document masking."""
        if self.doc_ids is None:
            return None

        def make() -> Tensor:
            queries, keys = self.doc_ids[:, -self.q_len:], self.doc_ids[:, -n_keys:]
            return (queries[:, :, None] == keys[:, None, :])[:, None]  # (B, 1, Tq, n_keys)

        return self.once(("docs", n_keys), make)

    def full_mask(self) -> tuple[Tensor | None, bool]:
        """(mask, is_causal) over every key so far: padding, causality and the score bias."""
        full = self.full  # asked by every layer: no closure per call
        if full is None:
            full = self.full = self_attn_mask(self.pad_mask, self.causal, self.q_len, self.k_len,
                                                      self.bias(self.k_len), self.device, self.same_doc(self.k_len))
        return full

    def layer_mask(self, q: Tensor, k: Tensor, layer: int) -> tuple[Tensor | None, bool]:
        """`full_mask` plus the encoding's content bias of this layer, for k holding every key so far."""
        extra = self.content_bias(q, k, layer)
        if extra is None:
            return self.full_mask()
        static = self.bias(self.k_len)
        return self_attn_mask(self.pad_mask, self.causal, self.q_len, self.k_len,
                              extra if static is None else static + extra, self.device, self.same_doc(self.k_len))


def self_attn_mask(pad_mask: Tensor | None, causal: bool, q_len: int, k_len: int, bias: Tensor | None,
                   device: torch.device, docs: Tensor | None = None) -> tuple[Tensor | None, bool]:
    """Combine padding, causality, documents and an additive bias into one SDPA mask; returns (mask, is_causal).

    pad_mask: (B, Tk) True at real tokens; docs: (B, 1, Tq, Tk) True where query and key share a document. Keys
    cached earlier come first, so the causal diagonal is offset by Tk - Tq. A query that can see no key at all (a
    pad before a left-padded prompt) is allowed to see every key, which keeps its (ignored) output finite instead
    of NaN.
    """
    if pad_mask is None and bias is None and docs is None:
        if not causal or q_len == 1:
            return None, False
        if q_len == k_len:
            return None, True
    keep = None
    if causal and q_len > 1:
        keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)  # (Tq, Tk)
    return combine_mask(keep, pad_mask, bias, docs), False


def combine_mask(keep: Tensor | None, pad_mask: Tensor | None, bias: Tensor | None,
                 docs: Tensor | None = None) -> Tensor | None:
    """A (Tq, Tk) keep-mask, (B, Tk) key padding, (B, 1, Tq, Tk) same-document mask and a (1, H, Tq, Tk) float
    bias as one SDPA mask."""
    if docs is not None:
        keep = docs if keep is None else keep & docs  # (B, 1, Tq, Tk)
    if pad_mask is not None:
        pad = pad_mask[:, None, None, :]  # (B, 1, 1, Tk)
        keep = pad if keep is None else keep & pad  # (B, 1, Tq or 1, Tk)
    if keep is not None:
        keep = keep | ~keep.any(dim=-1, keepdim=True)  # a query seeing no key sees all (finite, ignored output)
    if bias is None:
        return keep
    return bias if keep is None else bias.masked_fill(~keep, float("-inf"))


def repeat_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Grouped-query keys/values (B, Hkv, Tk, Dh) repeated to the query heads (B, H, Tk, Dh)."""
    if k.shape[1] == q.shape[1]:
        return k, v
    repeat = q.shape[1] // k.shape[1]
    return k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout: float,
           record: list[Tensor] | None, score_mod: Callable[[Tensor], Tensor] | None = None,
           sink: Tensor | None = None) -> Tensor:
    """Softmax attention. q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh).

    SDPA, with its own `dropout_p`, on every device. Two things need the probabilities themselves and take the
    explicit path (the same on every device; without dropout its outputs equal SDPA's): `record` (a list: the
    probabilities are appended to it) and `score_mod`, a function of the (B, H, Tq, Tk) scores applied before
    masking (a soft-cap, a temperature: SDPA has no hook for it). There dropout is `F.dropout` on the
    probabilities. `sink` (H,): one more logit per head in the denominator (`with_sink`); recorded probabilities
    leave its share out.
    """
    k, v = repeat_kv(q, k, v)
    if sink is not None:
        k, v, mask = with_sink(q, k, v, mask, is_causal, sink)
        is_causal = False
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if record is None and score_mod is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if score_mod is not None:
        scores = score_mod(scores)
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    probs = scores.softmax(dim=-1)
    if sink is not None:  # the sink column's value is zero: dropping it changes no output
        probs, v = probs[..., :-1], v[..., :-1, :]
    if record is not None:
        record.append(probs.detach())
    return F.dropout(probs, dropout, training=dropout > 0) @ v


def with_sink(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
              sink: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One more key per head, always visible, with key and value zero and score sink[h] (H,): k, v (..., Tk + 1,
    Dh) and a float mask (..., Tq, Tk + 1) whose last column is the sink logit. The sink's score comes only from
    the mask, after every bias and masking term (ALiBi, padding, documents, windows), so they leave it alone."""
    tq, tk = q.shape[-2], k.shape[-2]
    if is_causal:
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    if mask is None:
        mask = q.new_zeros(tq, tk)
    elif mask.dtype == torch.bool:
        mask = q.new_zeros(mask.shape).masked_fill(~mask, float("-inf"))
    column = sink.to(q.dtype).view(1, -1, *([1] * (q.dim() - 2)))  # (1, H, 1, 1): heads on q's dim 1
    lead = torch.broadcast_shapes(mask.shape[:-1], column.shape[:-1])
    mask = torch.cat([mask.to(q.dtype).expand(*lead, tk), column.expand(*lead, 1)], dim=-1)  # (..., Tq, Tk + 1)
    zero_k, zero_v = k.new_zeros(*k.shape[:-2], 1, k.shape[-1]), v.new_zeros(*v.shape[:-2], 1, v.shape[-1])
    return torch.cat([k, zero_k], dim=-2), torch.cat([v, zero_v], dim=-2), mask


class AttentionKernel(nn.Module):
    """One self-attention layer's way of attending. Subclasses set `forms_scores` and implement `forward`."""

    forms_scores: ClassVar[bool] = True  # softmax over Q K^T: score biases (ALiBi, T5) and probabilities exist
    # True: the kind projects the layer input itself (latent attention): the layer calls `project_attend(x, ...)`
    # and builds no q/k/v or output projection of its own
    projects: ClassVar[bool] = False
    label: str = ""  # shape trace: what this layer does, e.g. "window 64"

    @classmethod
    def rotary_dim(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> int:
        """Channels per head a rotary encoding rotates (the encoding is built with this `head_dim`): all of them."""
        return sizes["head_dim"]

    @classmethod
    def pos_refusal(cls, pos: type, pos_options: Mapping[str, Any]) -> str | None:
        """Why this kind cannot take the positional encoding class `pos` with these options; None: it can."""
        return None

    @classmethod
    def doc_mask_refusal(cls, options: Mapping[str, Any]) -> str | None:
        """Why this kind, with these options, cannot keep documents apart (`task.doc_mask`); None: it can."""
        return None

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """Raise ValueError (naming the field, the value and the fix) if the sizes or options cannot work."""

    def on_forward(self) -> None:
        """Called once per training forward of the stack, outside activation checkpointing (random features)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, dropout: float,
                record: list[Tensor] | None) -> Tensor:
        """q: (B, H, Tq, Dh) new queries; k, v: (B, Hkv, Tq, Dh) new keys/values -> (B, H, Tq, Dh).

        The kind keeps what it needs for decoding in `ctx.cache`; `record`, when a list, gets the (B, H, Tq, Tk)
        attention probabilities (or the implied weights of a kernel method)."""
        raise NotImplementedError

    def flops_per_token(self, seq_len: int, causal: bool, n_heads: int, head_dim: int) -> float:
        """Forward FLOPs per query token of the attention core (scores, weighting of values, feature maps),
        averaged over a sequence of seq_len tokens; projections are counted by the layer around it. Document
        masking leaves the count as it is: the boolean mask still computes the full score matrix."""
        return 4.0 * n_heads * head_dim * mean_keys(seq_len, causal, None)


def mean_keys(seq_len: int, causal: bool, window: int | None) -> float:
    """Average number of keys a query sees in a sequence of seq_len tokens (a window caps it)."""
    w = seq_len if window is None else min(window, seq_len)
    if causal:  # query i sees min(i + 1, w) keys
        return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len
    # bidirectional: keys j with |i - j| < w, clipped to the sequence
    total = seq_len * (2 * w - 1) - w * (w - 1)
    return total / seq_len
