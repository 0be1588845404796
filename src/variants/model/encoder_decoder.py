"""`encoder_decoder` (Vaswani et al. 2017): a bidirectional encoder over the source and a causal decoder that
cross-attends to the encoder output."""

from __future__ import annotations

from torch import Tensor

from archsweep.variants.blocks import Stack
from archsweep.variants.cache import KVCache
from archsweep.variants.embedding import LMHead
from archsweep.variants.flops import Shape, forward_flops
from archsweep.variants.model import KIND, SOURCE_TARGET
from archsweep.variants.model.base import ModelKind, Parts


@KIND.register("encoder_decoder")
class EncoderDecoder(ModelKind):
    form = SOURCE_TARGET
    own_fields = ("src_vocab_size", "n_decoder_layers", "share_src_tgt_embeddings")

    def __init__(self, encoder: Stack, decoder: Stack, head: LMHead) -> None:
        super().__init__()
        self.encoder, self.decoder, self.head = encoder, decoder, head

    @classmethod
    def assemble(cls, parts: Parts) -> EncoderDecoder:
        s = parts.sizes
        tgt_embed = parts.embedding(s["vocab_size"])
        head = parts.head(tgt_embed)
        src_embed = tgt_embed if s["share_src_tgt_embeddings"] else parts.embedding(
            s["src_vocab_size"] or s["vocab_size"])
        encoder = parts.stack("encoder", src_embed, s["n_layers"], causal=False, cross=False)
        decoder = parts.stack("decoder", tgt_embed, s["n_decoder_layers"], causal=True, cross=True)
        return cls(encoder, decoder, head)

    @classmethod
    def check(cls, sizes, options) -> None:
        if sizes["share_src_tgt_embeddings"] and sizes["src_vocab_size"] not in (None, sizes["vocab_size"]):
            raise ValueError(f"share_src_tgt_embeddings=True needs one vocabulary, but src_vocab_size="
                             f"{sizes['src_vocab_size']} != vocab_size={sizes['vocab_size']}; use a joint vocabulary "
                             f"or set share_src_tgt_embeddings=false")

    @classmethod
    def doc_mask_refusal(cls, options) -> str | None:
        return ("a continuation splits a window into source and target halves, so a target document can have no "
                "source tokens")

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

    def flops(self, shape: Shape) -> float:
        """`shape.memory` source tokens through the encoder; `shape.length` target tokens through the decoder
        (cross-attending to them) and the head."""
        source = Shape(shape.batch, shape.memory)
        decoder = forward_flops(self.decoder, shape) + forward_flops(self.head, shape)
        return forward_flops(self.encoder, source) + decoder
