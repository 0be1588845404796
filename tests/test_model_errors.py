"""Every invalid model input a user can give fails with a ValueError that names the field, value and fix."""

from __future__ import annotations

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.cache import KVCache


def cfg(**overrides) -> ModelConfig:
    base = dict(kind="decoder_only", vocab_size=20, d_model=32, n_heads=4, n_layers=1, d_ff=64, max_seq_len=16)
    return ModelConfig(**{**base, **overrides})


@pytest.mark.parametrize("overrides, message", [
    (dict(d_model=512, n_heads=6), r"n_heads=6 must divide d_model=512"),
    (dict(d_model=36, n_heads=4, pos="rotary"), r"pos=rotary needs an even head dimension.*36/4 = 9"),
    (dict(n_kv_heads=3), r"n_kv_heads=3 must divide n_heads=4"),
    (dict(pos="rope"), r"pos='rope' is not a known option; valid options: alibi, deberta, learned, none, relative, "
                       r"rotary, shaw, sincos2d, sinusoidal, xpos"),
    (dict(norm="prenorm"), r"norm='prenorm' is not a known option.*did you mean 'pre'"),
    (dict(ffn="swish"), r"ffn='swish' is not a known option; valid options: geglu, gelu, moe, relu, relu2, swiglu"),
    (dict(kind="gpt"), r"kind='gpt' is not a known option; valid options: decoder_only, encoder_decoder, encoder_only"),
    (dict(norm_type="batchnorm"), r"norm_type='batchnorm'.*layernorm, rmsnorm"),
    (dict(init="kaiming"), r"init='kaiming'.*xavier, gpt2"),
    (dict(ffn={"name": "gelu", "approximate": "fast"}),
     r"approximate='fast' is not a known option; valid options: none, tanh"),
    (dict(ffn={"name": "gelu", "aproximate": "tanh"}),
     r"ffn=gelu has no option 'aproximate'; did you mean 'approximate'"),
    (dict(pos={"name": "rotary", "base": "big"}), r"pos=rotary: option base='big' must be float"),
    (dict(pos={"name": "rotary", "base": 0.5}), r"base=0.5 must be greater than 1"),
    (dict(pos={"name": "relative", "num_buckets": 0}), r"num_buckets=0 must be a positive integer"),
    (dict(ffn={"name": "swiglu", "gated_d_ff": 0}), r"gated_d_ff=0 must be a positive integer"),
    (dict(pos={"base": 2.0}), r"names no variant; give `name`"),
    (dict(pos={"_target_": "no_such_module.XPos"}), r"cannot import _target_=no_such_module.XPos"),
    (dict(pos={"_target_": "torch.nn.Linear"}), r"Linear is not registered"),
    (dict(dropout=1.5), r"dropout=1.5 must be in \[0, 1\)"),
    (dict(d_model=0), r"d_model=0 must be a positive integer"),
    (dict(share_src_tgt_embeddings=True), r"share_src_tgt_embeddings=True only applies to kind=encoder_decoder"),
    (dict(kind="encoder_decoder", src_vocab_size=30, share_src_tgt_embeddings=True),
     r"src_vocab_size=30 != vocab_size=20; use a joint vocabulary"),
    (dict(src_vocab_size=30), r"src_vocab_size=30 only applies to kind=encoder_decoder"),
    (dict(n_decoder_layers=3), r"n_decoder_layers=3 only applies to kind=encoder_decoder"),
    (dict(pos={"name": "relative", "num_buckets": 2}), r"num_buckets=2 is too small"),
])
def test_invalid_config_is_refused_at_build(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model(cfg(**overrides))


def test_unknown_config_field_is_refused():
    with pytest.raises(ValueError, match=r"unknown model config field\(s\): 'n_head' \(did you mean 'n_heads'\?\)"):
        ModelConfig.from_dict({**cfg().to_dict(), "n_head": 4})


def test_config_round_trips_through_dict():
    original = cfg(pos="alibi", n_kv_heads=2).validate()  # canonical: {"name": "alibi"}
    assert ModelConfig.from_dict(original.to_dict()) == original


def test_sequence_longer_than_learned_table_is_refused():
    model = build_model(cfg(pos="learned"))
    with pytest.raises(ValueError, match=r"sequence length 17 exceeds the learned position table \(max_seq_len=16\)"):
        model(torch.ones(1, 17, dtype=torch.long))
    build_model(cfg(pos="sinusoidal"))(torch.ones(1, 40, dtype=torch.long))  # no table, any length


def test_kv_cache_overflow_is_refused():
    model = build_model(cfg(pos="rotary"))
    cache = KVCache(max_len=4)
    model(torch.ones(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"KV cache holds max_len=4 tokens but 5 were requested"):
        model(torch.ones(1, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"max_len=0 must be a positive"):
        KVCache(0)


def test_pad_mask_of_wrong_shape_is_refused():
    model = build_model(cfg())
    with pytest.raises(ValueError, match=r"pad_mask has shape \(1, 5\) but must be .* = \(1, 6\)"):
        model(torch.ones(1, 6, dtype=torch.long), pad_mask=torch.ones(1, 5, dtype=torch.bool))
