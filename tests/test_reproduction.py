"""The switches a faithful reproduction of a published recipe needs (issue 15), each off by default: LayerNorm
without bias (`model.norm_bias`), weight decay on the embedding tables (`optim.decay_embeddings`), and a
character vocabulary that is exactly the text's characters (`task.exact_vocab`, tests/test_data.py's text task
fixtures)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.checks import check_optimiser
from archsweep.core.train.optim import make_optimizer

SIZES = dict(vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0)


def layer_norms(model: nn.Module) -> list[nn.LayerNorm]:
    return [m for m in model.modules() if isinstance(m, nn.LayerNorm)]


@pytest.mark.parametrize("kind,norm", [("encoder_decoder", "post"), ("decoder_only", "pre"),
                                       ("encoder_only", "sandwich"), ("decoder_only", "deepnorm")])
def test_layernorm_without_bias(kind, norm):
    with_bias = build_model(ModelConfig(kind=kind, norm=norm, **SIZES))
    without = build_model(ModelConfig(kind=kind, norm=norm, norm_bias=False, **SIZES))
    norms = layer_norms(without)
    assert norms and all(n.bias is None and n.weight is not None for n in norms)
    assert all(n.bias is not None for n in layer_norms(with_bias))  # the default keeps it
    assert ModelConfig(kind=kind, **SIZES).norm_bias is True
    n_params = lambda m: sum(p.numel() for p in m.parameters())
    assert n_params(with_bias) - n_params(without) == len(norms) * SIZES["d_model"]
    tokens = torch.randint(4, 30, (2, 6))
    args = (tokens, tokens) if kind == "encoder_decoder" else (tokens,)
    assert torch.isfinite(without(*args)).all()


def optim_cfg(**over) -> dict:
    return {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.98], "eps": 1e-9, "weight_decay": 0.1, **over}


def test_weight_decay_on_embeddings_is_a_switch_off_by_default():
    model = build_model(ModelConfig(kind="encoder_decoder", pos="learned", max_seq_len=16, **SIZES))
    names = {id(p): n for n, p in model.named_parameters()}

    def decayed(cfg: dict) -> set[str]:
        groups = make_optimizer(model, cfg).param_groups
        return {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}

    default, on = decayed(optim_cfg()), decayed(optim_cfg(decay_embeddings=True))
    assert decayed(optim_cfg(decay_embeddings=False)) == default
    tables = {n for n in on - default}
    assert "encoder.embed.weight" in tables and "decoder.pos.table.weight" in tables
    assert all("embed" in n or "pos" in n for n in tables)
    assert not any("norm" in n or n.endswith("bias") for n in on)  # norms and biases are never decayed
    with pytest.raises(ValueError, match="optim.decay_embeddings='yes' must be true or false"):
        from omegaconf import OmegaConf

        check_optimiser(OmegaConf.create(optim_cfg(decay_embeddings="yes")))
