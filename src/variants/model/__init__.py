"""The three model kinds, each assembled from the same parts."""

from archsweep.variants.model.decoder_only import DecoderOnly, pack_prefix_lm
from archsweep.variants.model.encoder_decoder import EncoderDecoder
from archsweep.variants.model.encoder_only import EncoderOnly

__all__ = ["DecoderOnly", "EncoderDecoder", "EncoderOnly", "pack_prefix_lm"]
