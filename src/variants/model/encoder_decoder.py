"""`encoder_decoder` (Vaswani et al. 2017): a bidirectional encoder over the source and a causal decoder that
cross-attends to the encoder output."""

from __future__ import annotations

from torch import Tensor, nn

from archsweep.variants.blocks import Stack
from archsweep.variants.cache import KVCache
from archsweep.variants.embedding import LMHead


class EncoderDecoder(nn.Module):
    def __init__(self, encoder: Stack, decoder: Stack, head: LMHead) -> None:
        super().__init__()
        self.encoder, self.decoder, self.head = encoder, decoder, head

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src (B, S) -> memory (B, S, D); src_mask (B, S) True at real tokens."""
        return self.encoder(src, pad_mask=src_mask)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
               positions: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """tgt (B, T) -> logits (B, T, V). With a cache, tgt holds only the new tokens and tgt_mask covers all."""
        hidden = self.decoder(tgt, pad_mask=tgt_mask, positions=positions, memory=memory, memory_mask=src_mask,
                              cache=cache)
        return self.head(hidden)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)
