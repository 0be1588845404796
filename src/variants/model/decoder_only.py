"""`decoder_only` (Radford et al. 2018, GPT): one causal stack. Sequence-to-sequence data runs through it as a
prefix LM: source, separator, target in one sequence, with the loss on target tokens only (`pack_prefix_lm`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archsweep.variants.blocks import Stack
from archsweep.variants.cache import KVCache
from archsweep.variants.embedding import LMHead
from archsweep.variants.model import CAUSAL, KIND
from archsweep.variants.model.base import ModelKind, Parts
from archsweep.variants.plugins.base import ModelPlugin, hooks_of


@KIND.register("decoder_only")
class DecoderOnly(ModelKind):
    """Its model plug-ins' `after_stack` hook runs in a training forward only (multi-token prediction,
    `archsweep.variants.plugins.mtp`); the logits returned are always the next-token head's."""

    form = CAUSAL
    model_hooks = True

    def __init__(self, decoder: Stack, head: LMHead, plugins: dict[str, ModelPlugin] | None = None) -> None:
        super().__init__()
        self.decoder, self.head = decoder, head
        self.plugins = nn.ModuleDict(plugins or {})
        self.after_stack = hooks_of(self.plugins, ModelPlugin)["after_stack"]

    @classmethod
    def assemble(cls, parts: Parts) -> DecoderOnly:
        s = parts.sizes
        embed = parts.embedding(s["vocab_size"])
        head = parts.head(embed)
        decoder = parts.stack("stack", embed, s["n_layers"], causal=True, cross=False)
        return cls(decoder, head, parts.model_plugins())

    def forward(self, tokens: Tensor, pad_mask: Tensor | None = None, positions: Tensor | None = None,
                cache: KVCache | None = None, doc_ids: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> logits (B, T, V). pad_mask (B, cached + T) True at real tokens; doc_ids (B, T) the
        document of each new token (block-causal attention, positions restarting per document)."""
        hidden = self.decoder(tokens, pad_mask=pad_mask, positions=positions, cache=cache, doc_ids=doc_ids)
        if self.after_stack and self.training and torch.is_grad_enabled() and cache is None:
            for name in self.after_stack:  # recorded for their auxiliary losses
                self.plugins[name].after_stack(hidden, tokens, self.decoder, self.head, pad_mask, doc_ids)
        return self.head(hidden)


def pack_prefix_lm(src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor, sep_id: int, pad_id: int,
                   ignore_index: int = -100) -> tuple[Tensor, Tensor, Tensor]:
    """Pack right-padded pairs into `src SEP tgt` rows for next-token prediction.

    src (B, S), tgt (B, T) with masks True at real tokens; tgt should end with the end token. Returns
    tokens (B, L), labels (B, L) (the next token where it is a target token, else ignore_index) and
    pad_mask (B, L), all right-padded, L = max(real src + 1 + real tgt).
    """
    b = src.shape[0]
    src_len, tgt_len = src_mask.sum(1), tgt_mask.sum(1)  # (B,)
    total = src_len + 1 + tgt_len
    width = int(total.max())
    col = torch.arange(width, device=src.device).expand(b, width)  # (B, L)
    in_src = col < src_len[:, None]
    is_sep = col == src_len[:, None]
    in_tgt = (col > src_len[:, None]) & (col < total[:, None])
    tokens = torch.full((b, width), pad_id, dtype=src.dtype, device=src.device)
    tokens[in_src] = src[src_mask]
    tokens[is_sep] = sep_id
    tokens[in_tgt] = tgt[tgt_mask]
    labels = torch.full_like(tokens, ignore_index)
    predicts_tgt = (col >= src_len[:, None]) & (col < total[:, None] - 1)  # positions whose next token is target
    labels[:, :-1] = torch.where(predicts_tgt[:, :-1], tokens[:, 1:], labels[:, :-1])
    return tokens, labels, col < total[:, None]
