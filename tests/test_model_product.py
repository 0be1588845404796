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
from archsweep.variants.model import BIDIRECTIONAL, IMAGE, KIND, SOURCE_TARGET, form_of
from archsweep.variants.norm import NORM
from archsweep.variants.pos import POS

PRODUCT = list(itertools.product(KIND.names(), NORM.names(), POS.names(), FFN.names(), ATTENTION.names()))
# options small enough to act on a 7-token input: a window that excludes keys, a global layer in the pattern
ATTENTION_OPTIONS = {"sliding_window": {"window": 3, "layer_pattern": "LG"}, "performer": {"n_features": 8},
                     "linear": {"chunk_size": 4}}


IMAGE_SIZES = {"image_size": [4, 6], "patch_size": 2, "in_channels": 3}  # 2 x 3 patches + a class token: 7 tokens


def run(model, kind, x, mask):
    """Outputs and a loss of the kind's forward, by the data form it reads; image kinds read images of
    IMAGE_SIZES, which make as many tokens as the 7-token input of the others."""
    form = form_of(kind)
    if form == SOURCE_TARGET:
        out = model(x, x[:, :6], src_mask=mask, tgt_mask=mask[:, :6])
    elif form == IMAGE:
        out = model(torch.randn(2, 3, 4, 6))  # (B, n_classes)
        return out, out.logsumexp(-1).mean()
    else:
        out = model(x, pad_mask=mask)
    loss = out.logsumexp(-1).mean()
    if form == BIDIRECTIONAL:
        loss = loss + model.classify(x, pad_mask=mask).logsumexp(-1).mean()
    return out, loss


@pytest.mark.parametrize("kind, norm, pos, ffn, attention", PRODUCT, ids=["-".join(c) for c in PRODUCT])
def test_every_combination_trains(kind, norm, pos, ffn, attention):
    torch.manual_seed(0)
    norm_type = "rmsnorm" if ffn in ("swiglu", "geglu") else "layernorm"  # rmsnorm with gated FFNs
    image = form_of(kind) == IMAGE
    cfg = ModelConfig(kind=kind, norm=norm, pos=pos, ffn=ffn, norm_type=norm_type, vocab_size=13, d_model=16,
                      n_heads=2, n_layers=2, d_ff=32, max_seq_len=16, dropout=0.1, n_classes=3,
                      attention={"name": attention, **ATTENTION_OPTIONS.get(attention, {})},
                      **(IMAGE_SIZES if image else {}))
    if not ATTENTION.get(attention).forms_scores and POS.get(pos).score_bias:
        with pytest.raises(ValueError, match=f"attention={attention} never forms the score matrix.*pos={pos}"):
            cfg.validate()
        return
    if getattr(POS.get(pos), "image_only", False) and not image:  # positions on a patch grid need an image
        with pytest.raises(ValueError, match=f"pos={pos} .* needs an image input"):
            cfg.validate()
        return
    model = build_model(cfg)
    x = torch.randint(1, 13, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    out, loss = run(model, kind, x, mask)
    loss.backward()
    assert out.shape[-1] == (3 if image else 13) and torch.isfinite(out).all() and torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{name} has a non-finite gradient"
        if "pos.table" not in name:  # learned rows for positions never used stay zero, the rest must move
            assert param.grad.abs().sum() > 0, f"{name} has an all-zero gradient"
