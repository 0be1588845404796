"""The full product kind x norm x positional x FFN x attention builds, runs forward and backward with finite
values, and every parameter that should learn gets a gradient; a combination the variants refuse is refused at
validation with the reason."""

from __future__ import annotations

import itertools

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.attention import ATTENTION
from archsweep.variants.ffn import FFN
from archsweep.variants.model import KIND
from archsweep.variants.norm import NORM
from archsweep.variants.pos import POS

PRODUCT = list(itertools.product(KIND.names(), NORM.names(), POS.names(), FFN.names(), ATTENTION.names()))
# options small enough to act on a 7-token input: a window that excludes keys, a global layer in the pattern
ATTENTION_OPTIONS = {"sliding_window": {"window": 3, "layer_pattern": "LG"}, "performer": {"n_features": 8},
                     "linear": {"chunk_size": 4}}


@pytest.mark.parametrize("kind, norm, pos, ffn, attention", PRODUCT, ids=["-".join(c) for c in PRODUCT])
def test_every_combination_trains(kind, norm, pos, ffn, attention):
    torch.manual_seed(0)
    norm_type = "rmsnorm" if ffn in ("swiglu", "geglu") else "layernorm"  # rmsnorm with gated FFNs
    cfg = ModelConfig(kind=kind, norm=norm, pos=pos, ffn=ffn, norm_type=norm_type, vocab_size=13, d_model=16,
                      n_heads=2, n_layers=2, d_ff=32, max_seq_len=16, dropout=0.1, n_classes=3,
                      attention={"name": attention, **ATTENTION_OPTIONS.get(attention, {})})
    if not ATTENTION.get(attention).forms_scores and POS.get(pos).score_bias:
        with pytest.raises(ValueError, match=f"attention={attention} never forms the score matrix.*pos={pos}"):
            cfg.validate()
        return
    model = build_model(cfg)
    x = torch.randint(1, 13, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    if kind == "encoder_decoder":
        out = model(x, x[:, :6], src_mask=mask, tgt_mask=mask[:, :6])
        loss = out.logsumexp(-1).mean()
    elif kind == "decoder_only":
        out = model(x, pad_mask=mask)
        loss = out.logsumexp(-1).mean()
    else:
        out = model(x, pad_mask=mask)
        loss = out.logsumexp(-1).mean() + model.classify(x, pad_mask=mask).logsumexp(-1).mean()
    loss.backward()
    assert out.shape[-1] == 13 and torch.isfinite(out).all() and torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
        if "pos.table" not in name:  # learned rows for positions never used stay zero, the rest must move
            assert param.grad.abs().sum() > 0, f"{name} has an all-zero gradient"
