"""The parametrisation axis (`model.param`, src/variants/param): `sp` leaves everything as it was; `mup` gives each
parameter the initial scale, learning-rate factor and forward constants of Tensor Programs V's table, read from its
role and its shape beside the base model, and equals `sp` at the base width."""

from __future__ import annotations

import math

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model, parameter_widths
from archsweep.core.train.optimisers.optim import adamw, muon
from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.base import AttnContext
from archsweep.variants.attention.layers import Attention
from archsweep.variants.embedding import LMHead, TokenEmbedding

LR = 1e-3
BASE = dict(kind="decoder_only", vocab_size=50, n_heads=4, n_kv_heads=2, n_layers=2, d_model=32, d_ff=64,
            norm="pre", ffn="relu", dropout=0.0, tie_embeddings=False, init="gpt2")


def mup(base_width: int = 32, **extra) -> dict:
    return {"name": "mup", "base_width": base_width, **extra}


def model_at(width: int, param, seed: int = 0, **fields) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = ModelConfig(**{**BASE, "d_model": width, "d_ff": 2 * width, **fields}, param=param)
    return build_model(cfg)


def rates(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, float]:
    """{parameter name: the learning rate its group gives it}."""
    by_id = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    return adamw(model, LR, [0.9, 0.98], 1e-9, 0.01)


def test_mup_at_its_base_width_is_the_standard_model():
    sp, mp = model_at(32, "sp"), model_at(32, mup(32, zero_readout=False))
    for (name, a), (_, b) in zip(sp.state_dict().items(), mp.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    tokens = torch.randint(0, 50, (2, 12))
    assert torch.equal(sp(tokens), mp(tokens))
    assert rates(adam(sp), sp) == rates(adam(mp), mp)


def test_the_standard_parametrisation_keeps_the_two_weight_decay_groups():
    model = model_at(128, "sp")
    groups = adam(model).param_groups
    assert len(groups) == 2 and all("lr_scale" not in g and g["lr"] == LR for g in groups)
    assert parameter_widths(model) == {}


def test_mup_learning_rates_follow_the_table():
    """4x the base width: hidden matrices, the untied head and the MoE router at a quarter of the rate (1 / fan-in
    ratio); the embedding, norms and biases at the rate itself."""
    model = model_at(128, mup(32), ffn={"name": "moe", "expert": "relu"}, bias=True)
    got = rates(adam(model), model)
    quarter = [n for n in got if n.endswith(("qkv_proj.weight", "out_proj.weight", "router.weight", "_proj"))
               or n == "head.weight"]
    assert len(quarter) == 2 * 5 + 1  # per block qkv, out, router, the experts' up and down stacks; the head
    for name, lr in got.items():
        assert lr == pytest.approx(LR / 4 if name in quarter else LR, rel=1e-12), name


def test_mup_initial_scales_follow_the_table():
    """At 4x the base width each parameter starts at the standard deviation its namesake drew in the base model (the
    init scheme at the base shape; the base model is built with seed 0), times muP's factor: hidden matrices 1/2
    (1/sqrt 4), readouts (the untied head, a per-head gate: only the fan-in grows) 1/4, the router as a hidden
    matrix, the embedding 1."""
    fields = dict(ffn={"name": "moe", "expert": "relu"}, plugins={"attn_gate": {"per": "head"}})
    params = dict(model_at(128, mup(32, zero_readout=False), seed=5, **fields).named_parameters())
    base = dict(model_at(32, "sp", seed=0, **fields).named_parameters())
    factors = {"decoder.embed.weight": 1.0, "decoder.blocks.0.self_attn.qkv_proj.weight": 1 / 2,
               "decoder.blocks.1.self_attn.out_proj.weight": 1 / 2, "decoder.blocks.0.ffn.router.weight": 1 / 2,
               "decoder.blocks.1.ffn.experts.down_proj": 1 / 2,
               "decoder.blocks.1.self_attn.plugins.attn_gate.gate_proj.weight": 1 / 4, "head.weight": 1 / 4}
    for name, factor in factors.items():
        got, drawn = float(params[name].detach().std()), float(base[name].detach().std())
        assert got == pytest.approx(drawn * factor, rel=1e-5), name
    # and the base draws are the scheme's: gpt2's 0.02 (0.02 / sqrt(2 n_layers) writing into the residual stream),
    # LMHead's own d_model^-1/2, within the sampling error of tensors of 256 to 4,096 entries
    nominal = {"decoder.embed.weight": 0.02, "decoder.blocks.0.self_attn.qkv_proj.weight": 0.02,
               "decoder.blocks.1.self_attn.out_proj.weight": 0.01, "decoder.blocks.0.ffn.router.weight": 0.02,
               "head.weight": 32 ** -0.5}
    for name, value in nominal.items():
        assert float(base[name].detach().std()) == pytest.approx(value, rel=0.15), name


@pytest.mark.parametrize("width", [32, 128])
def test_an_untied_head_starts_at_zero_at_every_width_unless_asked_not_to(width):
    assert not model_at(width, mup(32)).head.weight.any()
    assert model_at(width, mup(32, zero_readout=False)).head.weight.std() > 0
    tied = model_at(width, mup(32), tie_embeddings=True)
    assert tied.head.weight is tied.decoder.embed.weight and tied.head.weight.std() > 0  # the embedding is kept


def test_mup_forward_constants():
    tied = model_at(128, mup(32), tie_embeddings=True, scale_embedding=True)
    attention = [m for m in tied.modules() if isinstance(m, Attention)]
    assert attention and all(m.score_scale == pytest.approx(0.5) for m in attention)  # sqrt(8) / 32 * sqrt(32)
    head = next(m for m in tied.modules() if isinstance(m, LMHead))
    assert head.logit_scale == pytest.approx(0.25)
    embed = next(m for m in tied.modules() if isinstance(m, TokenEmbedding))
    assert embed.scale == pytest.approx(math.sqrt(32))  # the base width's sqrt(d_model), not sqrt(128)
    untied = model_at(128, mup(32))
    assert next(m for m in untied.modules() if isinstance(m, LMHead)).logit_scale == 1.0


def test_mup_scores_are_the_standard_scores_times_the_factor():
    """The score factor sqrt(base head_dim) / head_dim, applied to queries and keys: the layer's output equals
    softmax attention at that temperature, computed here directly."""
    model = model_at(128, mup(32), n_kv_heads=None).eval()
    layer = model.decoder.blocks[0].self_attn
    x = torch.randn(2, 6, 128)
    q, k, v = layer.qkv_proj(x).view(2, 6, 3, 4, 32).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
    scores = q @ k.transpose(-2, -1) * math.sqrt(8) / 32
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    expected = layer.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 128))
    ctx = AttnContext(None, True, 6, 6, torch.arange(6)[None], lambda q, k, p: (q, k), lambda a, b, d: None, None,
                      x.device)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, ctx), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("scaling,factor", [("reference", 1.0), ("moonlight", 0.5)])
def test_mup_muon_rates_keep_the_spectral_condition(scaling, factor):
    """Muon's orthogonalised update: the rate factor is sqrt(fan-out ratio / fan-in ratio) = 1 for a matrix whose
    both sides grow 4x, divided by the change of Muon's own shape factor: none for `reference` (max(1, rows/cols)^0.5
    keeps its ratio), 0.2 sqrt(max(rows, cols)) doubles for `moonlight`, so half the rate."""
    model = model_at(128, mup(32))
    opt = muon(model, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, ns_dtype="float32", scaling=scaling,
               weight_decay=0.0, adamw_lr=LR, betas=[0.9, 0.98], eps=1e-9)
    got = rates(opt, model)
    for name in ("decoder.blocks.0.self_attn.qkv_proj.weight", "decoder.blocks.1.ffn.down_proj.weight"):
        assert got[name] == pytest.approx(0.02 * factor, rel=1e-12), name
    assert got["head.weight"] == pytest.approx(LR / 4, rel=1e-12)  # AdamW, the readout's rate
    assert got["decoder.embed.weight"] == pytest.approx(LR, rel=1e-12)


def test_a_variant_that_declares_it_cannot_be_parametrised_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(ATTENTION.get("linear"), "width_refusal", "no reason checked yet", raising=False)
    with pytest.raises(ValueError, match=r"param=mup cannot parametrise attention=linear yet: no reason checked yet"):
        ModelConfig(**BASE, attention="linear", param=mup()).validate()
    ModelConfig(**BASE, attention="linear").validate()  # the standard parametrisation takes it


@pytest.mark.parametrize("param,message", [
    (mup(30), "base_width=30 must be a multiple of n_heads=4"),
    (mup(0), "base_width=0 must be a positive width"),
    ({"name": "mup", "base_widht": 32}, "has no option 'base_widht'"),
    ("mupp", "param='mupp' is not a known option"),
])
def test_bad_parametrisation_settings_are_refused(param, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**BASE, param=param).validate()
