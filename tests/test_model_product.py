"""The full product kind x norm x positional x FFN builds, runs forward and backward with finite values, and
every parameter that should learn gets a gradient."""

from __future__ import annotations

import itertools

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.ffn import FFN
from archsweep.variants.model import KIND
from archsweep.variants.norm import NORM
from archsweep.variants.pos import POS

PRODUCT = list(itertools.product(KIND.names(), NORM.names(), POS.names(), FFN.names()))


@pytest.mark.parametrize("kind, norm, pos, ffn", PRODUCT, ids=["-".join(c) for c in PRODUCT])
def test_every_combination_trains(kind, norm, pos, ffn):
    torch.manual_seed(0)
    norm_type = "rmsnorm" if ffn in ("swiglu", "geglu") else "layernorm"  # rmsnorm with gated FFNs
    model = build_model(ModelConfig(kind=kind, norm=norm, pos=pos, ffn=ffn, norm_type=norm_type, vocab_size=13,
                                    d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16, dropout=0.1,
                                    n_classes=3))
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
