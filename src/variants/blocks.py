"""A Transformer layer (self-attention, optional cross-attention, FFN, each wrapped by the chosen norm
placement) and a stack of them with its embedding and positional encoding (Vaswani et al. 2017, figure 1)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from archsweep.variants.attention.base import AttnContext
from archsweep.variants.attention.layers import CrossAttention, SelfAttention
from archsweep.variants.cache import KVCache
from archsweep.variants.dropout import Dropout
from archsweep.variants.embedding import TokenEmbedding
from archsweep.variants.flops import Shape, children_flops
from archsweep.variants.norm.base import Branch, Residual
from archsweep.variants.pos.base import PositionalEncoding


class Block(nn.Module):
    def __init__(self, self_attn: SelfAttention, ffn: nn.Module, wrap: Callable[[], Residual],
                 cross_attn: CrossAttention | None = None) -> None:
        super().__init__()
        self.self_attn, self.attn_res = self_attn, wrap()
        self.cross_attn = cross_attn
        self.cross_res = wrap() if cross_attn is not None else None
        self.ffn, self.ffn_res = ffn, wrap()
        self.attn_res.bind([r for r in (self.attn_res, self.cross_res, self.ffn_res) if r is not None])
        # the placement keeps the default order: call the sublayers directly (no branch list per call, which is
        # a measurable share of a one-token decoding step)
        self.sequential = type(self.attn_res).compose is Residual.compose

    def forward(self, x: Tensor, ctx: AttnContext, memory: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        if self.sequential:
            x = self.attn_res(x, self.self_attn, ctx)
            if self.cross_attn is not None:
                x = self.cross_res(x, self.cross_attn, memory, memory_mask, ctx.cache)
            return self.ffn_res(x, self.ffn)
        branches: list[Branch] = [(self.attn_res, self.self_attn, (ctx,))]
        if self.cross_attn is not None:
            branches.append((self.cross_res, self.cross_attn, (memory, memory_mask, ctx.cache)))
        branches.append((self.ffn_res, self.ffn, ()))
        return self.attn_res.compose(x, branches)  # the placement arranges them: in sequence, or in parallel

    def after_init(self) -> None:
        """Let each residual wrapper adjust its sublayer's initialised weights (DeepNorm scales them)."""
        self.attn_res.init_sublayer(self.self_attn)
        if self.cross_attn is not None:
            self.cross_res.init_sublayer(self.cross_attn)
        self.ffn_res.init_sublayer(self.ffn)


class Stack(nn.Module):
    """Token embedding + absolute positions + dropout, N blocks, and a final norm where the placement wants one.

    `causal` makes self-attention masked (decoders). Tensors: tokens (B, T); pad_mask (B, Tk) True at real
    tokens, covering cached keys first and then the T new ones; positions (B or 1, T), default consecutive
    after the cache; memory (B, S, D) and memory_mask (B, S) for cross-attention; doc_ids (B, T) the document of
    each new token, non-decreasing along a row: a token attends only within its document, and positions (when
    not given) restart at 0 at each document's first token. A cache keeps the doc_ids of the tokens it holds.
    """

    def __init__(self, embed: TokenEmbedding, pos: PositionalEncoding, blocks: list[Block],
                 final_norm: nn.Module | None, causal: bool, emb_dropout: float) -> None:
        super().__init__()
        self.embed = embed
        self.pos = pos
        self.emb_dropout = Dropout(emb_dropout)  # a module: diagnostics hook the embedding output here
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.causal = causal
        self.checkpointing = False  # activation checkpointing: recompute each block in backward

    def forward(self, tokens: Tensor, pad_mask: Tensor | None = None, positions: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                cache: KVCache | None = None, doc_ids: Tensor | None = None) -> Tensor:
        t = tokens.shape[1]
        start = cache.length if cache is not None else 0
        self._check_lengths(tokens, pad_mask, start)
        docs = self._documents(tokens, doc_ids, cache)  # (B, cached + T) or None
        if positions is None and docs is not None:
            positions = document_positions(docs)[:, start:]  # (B, T): index within the document
        elif positions is None:
            positions = torch.arange(start, start + t, device=tokens.device).unsqueeze(0)  # (1, T)
        x = self.emb_dropout(self.pos.embed(self.embed(tokens), positions))  # (B, T, D)
        ctx = AttnContext(pad_mask, self.causal, t, start + t, positions, self.pos.rotate_qk, self.pos.attn_bias,
                          cache, tokens.device, self.pos.content_bias, doc_ids=docs)
        if self.training:
            for block in self.blocks:
                block.self_attn.kernel.on_forward()
        cross_mask = memory_mask[:, None, None, :] if memory_mask is not None else None  # (B, 1, 1, S)
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = checkpoint(block, x, ctx, memory, cross_mask, use_reentrant=False)
            else:
                x = block(x, ctx, memory, cross_mask)
        if cache is not None:
            cache.doc_ids = docs
            cache.advance(t)
        return self.final_norm(x)

    def flops(self, shape: Shape) -> float:
        """Its blocks (and the encoding's products) over `shape`, masked as this stack masks."""
        return children_flops(self, shape.replace(causal=self.causal))

    def _documents(self, tokens: Tensor, doc_ids: Tensor | None, cache: KVCache | None) -> Tensor | None:
        """The documents of the cached and the new tokens (B, cached + T), None without document masking."""
        cached = cache.doc_ids if cache is not None else None
        if doc_ids is None:
            if cached is not None:
                raise ValueError("doc_ids=None, but the KV cache was filled with doc_ids; pass the new tokens' doc_ids "
                                 "on every call with this cache, or start a new cache")
            return None
        if tuple(doc_ids.shape) != tuple(tokens.shape[:2]) or doc_ids.is_floating_point() or doc_ids.is_complex():
            raise ValueError(f"doc_ids has shape {tuple(doc_ids.shape)} and dtype {doc_ids.dtype} but must be an "
                             f"integer tensor shaped like the new tokens (batch, tokens) = {tuple(tokens.shape[:2])}")
        if doc_ids.device != tokens.device:
            raise ValueError(f"doc_ids are on {doc_ids.device} but the tokens on {tokens.device}; move them to the "
                             f"tokens' device")
        if cache is not None and cache.length and cached is None:
            raise ValueError(f"doc_ids were given, but the KV cache holds {cache.length} tokens decoded without "
                             f"them; pass doc_ids from the first call on, or start a new cache")
        return doc_ids if cached is None else torch.cat([cached, doc_ids], dim=1)

    def _check_lengths(self, tokens: Tensor, pad_mask: Tensor | None, start: int) -> None:
        total = start + tokens.shape[1]
        if self.pos.max_len is not None and total > self.pos.max_len:
            raise ValueError(f"sequence length {total} exceeds the learned position table "
                             f"(max_seq_len={self.pos.max_len}); raise max_seq_len or use a positional "
                             f"encoding without a table (sinusoidal, relative, rotary, alibi)")
        if pad_mask is not None and tuple(pad_mask.shape) != (tokens.shape[0], total):
            raise ValueError(f"pad_mask has shape {tuple(pad_mask.shape)} but must be (batch, cached + new "
                             f"tokens) = {(tokens.shape[0], total)}")


def document_positions(doc_ids: Tensor) -> Tensor:
    """(B, T) document ids, non-decreasing along a row -> (B, T) index of each token within its document."""
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)  # (B, T)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]  # a document's first token
    first = torch.where(starts, index, 0).cummax(dim=1).values  # (B, T): index of the document's first token
    return index - first
