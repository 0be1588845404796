"""`sliding_window` (local attention, as in Longformer, Beltagy et al. 2020, and Mistral 7B): each query sees
only the `window` nearest keys, so the cost per token is capped at `window` instead of growing with the length.

Causal: key j is visible from query i iff i - window < j <= i. Bidirectional (encoders): iff |i - j| < window.
`layer_pattern` mixes local (`L`) and global (`G`, full attention) layers, repeated over the depth: `LLLG` is
three windowed layers then one full one. Decoding keeps a rolling cache of the last `window - 1` keys and values
in local layers, so their memory stays constant however long the generation.

Without a cache and on inputs longer than twice the window, queries are processed in blocks of `window`, each
against its neighbouring key blocks only (the chunked form of Longformer), so time and memory grow as T x window.
Otherwise backends: `sdpa` (a boolean band mask over all keys); `flex` (FlexAttention with a block mask, which
skips the blocks outside the band, compiled; for inputs without a score bias, attention dropout or recorded maps);
`auto` is `sdpa`, so the default path is the same on every device (one compiled FlexAttention per sequence
length costs a CPU tens of seconds). Both give the same outputs.
Document masking (`ctx.doc_ids`) joins the band in the SDPA mask (and in the blocked form); `flex` refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.base import AttentionKernel, AttnContext, attend, combine_mask, mean_keys, repeat_kv

BACKENDS = ("auto", "sdpa", "flex")
_compiled_flex: Any = None


def band(q_len: int, n_keys: int, window: int, causal: bool, device: torch.device) -> Tensor:
    """(Tq, n_keys) True where a query may see a key; the queries are the last q_len of n_keys positions."""
    keys = torch.arange(n_keys, device=device)
    distance = keys[None, :] - keys[n_keys - q_len:, None]  # key index minus query index
    return (distance > -window) & (distance <= 0 if causal else distance < window)


@ATTENTION.register("sliding_window")
class SlidingWindowAttention(AttentionKernel):
    def __init__(self, layer: int, causal: bool, window: int = 16, layer_pattern: str = "L",
                 backend: str = "auto") -> None:
        super().__init__()
        self.layer, self.causal, self.window, self.backend = layer, causal, window, backend
        self.local = layer_pattern[layer % len(layer_pattern)] == "L"
        self.label = f"sliding window of {window} keys" if self.local else "full (a global layer of the pattern)"

    @classmethod
    def check(cls, sizes: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        if options["window"] < 1:
            raise ValueError(f"attention.window={options['window']} must be at least 1 (keys each query sees, "
                             f"itself included)")
        pattern = options["layer_pattern"]
        if not pattern or set(pattern) - {"L", "G"}:
            raise ValueError(f"attention.layer_pattern={pattern!r} must be a non-empty string of L (local, "
                             f"windowed) and G (global, full) layers, e.g. LLLG")
        if options["backend"] not in BACKENDS:
            raise ValueError(f"attention.backend={options['backend']!r} must be one of {', '.join(BACKENDS)}")

    @classmethod
    def doc_mask_refusal(cls, options: Mapping[str, Any]) -> str | None:
        if options["backend"] != "flex":
            return None
        return ("its backend=flex block mask holds only the window band (documents need the SDPA mask of "
                "attention.backend=auto or sdpa)")

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, dropout: float,
                record: list[Tensor] | None) -> Tensor:
        if not self.local:
            if ctx.cache is not None:
                k, v = ctx.cache.append(self.layer, k, v)
            mask, is_causal = ctx.layer_mask(q, k, self.layer)
            return attend(q, k, v, mask, is_causal, dropout, record, ctx.score_mod, ctx.sink)
        if ctx.cache is not None:
            k, v = self._roll(ctx, k, v)  # (B, Hkv, kept + Tq, Dh)
        n_keys = k.shape[2]
        extra = ctx.content_bias(q, k, self.layer)  # (B, H, Tq, n_keys) or None
        if extra is None and ctx.cache is None and record is None and self.backend != "flex" \
                and n_keys > 2 * self.window:
            return self._blocked(q, k, v, ctx, dropout)
        bias = ctx.bias(n_keys)
        if extra is not None:
            bias = extra if bias is None else bias + extra
        explicit = ctx.score_mod is not None or ctx.sink is not None  # neither has a FlexAttention form here
        if not explicit and self._use_flex(q, bias, dropout, record, ctx.doc_ids is not None):
            return self._flex(q, k, v, ctx)
        if extra is not None:
            mask = combine_mask(band(ctx.q_len, n_keys, self.window, self.causal, ctx.device),
                                ctx.key_padding(n_keys), bias, ctx.same_doc(n_keys))
        else:
            mask = ctx.once(("window", self.window, n_keys), lambda: combine_mask(
                band(ctx.q_len, n_keys, self.window, self.causal, ctx.device), ctx.key_padding(n_keys), bias,
                ctx.same_doc(n_keys)))
        return attend(q, k, v, mask, False, dropout, record, ctx.score_mod, ctx.sink)

    def _blocked(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, dropout: float) -> Tensor:
        """Long inputs: queries in blocks of `window`, each attending to its own and the neighbouring key blocks
        (the previous one; the next one too when bidirectional), so time and memory grow as T * window."""
        w, (b, h, t, d) = self.window, q.shape
        k, v = repeat_kv(q, k, v)
        n = -(-t // w)
        span = 2 if self.causal else 3  # key blocks per query block
        before, after = w, n * w - t + (0 if self.causal else w)
        qb = F.pad(q, (0, 0, 0, n * w - t)).view(b, h, n, w, d)
        kb, vb = ((F.pad(x, (0, 0, before, after)).unfold(2, span * w, w).transpose(-1, -2)) for x in (k, v))
        mask = ctx.once(("blocked", w, t), lambda: self._block_mask(ctx, n, span))  # (B or 1, H or 1, n, w, S)
        out = attend(qb, kb, vb, mask, False, dropout, None, ctx.score_mod, ctx.sink)  # (B, H, n, w, Dh)
        return out.reshape(b, h, n * w, d)[:, :, :t]

    def _block_mask(self, ctx: AttnContext, n: int, span: int) -> Tensor:
        w, t = self.window, ctx.q_len
        slot = torch.arange(span * w, device=ctx.device)
        distance = slot[None, :] - w - torch.arange(w, device=ctx.device)[:, None]  # key - query, (w, S)
        keep = (distance > -w) & (distance <= 0 if self.causal else distance < w)
        real = ctx.pad_mask if ctx.pad_mask is not None else torch.ones(1, t, dtype=torch.bool, device=ctx.device)
        real = F.pad(real, (w, n * w - t + (0 if self.causal else w)), value=False).unfold(1, span * w, w)
        keep = keep & real[:, None, :, None, :]  # (B or 1, 1, n, w, S): keys outside the input are masked
        if ctx.doc_ids is not None:  # a key of another document is masked too
            docs = F.pad(ctx.doc_ids, (w, n * w - t + (0 if self.causal else w))).unfold(1, span * w, w)  # (B, n, S)
            own = F.pad(ctx.doc_ids, (0, n * w - t)).view(-1, n, w)  # (B, n, w): the queries' documents
            keep = keep & (own[:, None, :, :, None] == docs[:, None, :, None, :])
        keep = keep | ~keep.any(dim=-1, keepdim=True)
        bias = ctx.score_bias(span * w - w, span * w, ctx.device)  # queries at slots w .. 2w - 1 come first
        if bias is None:
            return keep
        return bias[:, :, None, :w].masked_fill(~keep, float("-inf"))

    def _roll(self, ctx: AttnContext, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Prepend the kept keys/values; keep the last window - 1 for the next step."""
        state = ctx.cache.states.get(self.layer)
        if state is not None:
            k, v = torch.cat([state["k"], k], dim=2), torch.cat([state["v"], v], dim=2)
        start = k.shape[2] - min(self.window - 1, k.shape[2])
        ctx.cache.states[self.layer] = {"k": k[:, :, start:].clone(), "v": v[:, :, start:].clone()}
        return k, v

    def _use_flex(self, q: Tensor, bias: Tensor | None, dropout: float, record: list[Tensor] | None,
                  docs: bool) -> bool:
        if docs and self.backend == "flex":
            raise ValueError(f"doc_ids were given, but attention={self.option_name} cannot keep documents apart: "
                             f"{self.doc_mask_refusal({'backend': 'flex'})}")
        if self.backend == "sdpa" or docs:
            return False
        plain = bias is None and dropout == 0.0 and record is None
        if self.backend == "flex" and not plain:
            raise ValueError("attention.backend=flex cannot add a score bias, drop attention probabilities or "
                             "record attention maps; use backend=auto (falls back to sdpa) or model.attn_dropout=0")
        return plain and self.backend == "flex"

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext) -> Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        global _compiled_flex
        n_keys, window, causal = k.shape[2], self.window, self.causal
        offset = n_keys - ctx.q_len
        pad = ctx.key_padding(n_keys)

        def keep(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
            distance = ki - (qi + offset)
            visible = (distance > -window) & ((distance <= 0) if causal else (distance < window))
            return visible if pad is None else visible & pad[b, ki]

        batch = None if pad is None else q.shape[0]
        block_mask = ctx.once(("flex", window, n_keys), lambda: create_block_mask(
            keep, batch, None, ctx.q_len, n_keys, device=q.device))
        if _compiled_flex is None:  # compiled on every device (torch 2.13 compiles it for CPUs too)
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])

    def flops_per_token(self, seq_len: int, causal: bool, n_heads: int, head_dim: int) -> float:
        return 4.0 * n_heads * head_dim * mean_keys(seq_len, causal, self.window if self.local else None)
