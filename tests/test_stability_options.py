"""Options of recent models against their formulas: squared ReLU, QK-norm, attention and logit soft-capping, and
the z-loss; each works with the KV cache and is refused where it cannot apply."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from cache_check import assert_cached_decoding_equals_full_forward

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.attention.base import attend
from archsweep.variants.ffn import FFN
from archsweep.variants.plugins.attn_softcap import AttentionSoftcap
from archsweep.variants.plugins.base import OutputPlugins
from archsweep.variants.plugins.z_loss import ZLoss

VOCAB = 23


def tiny(kind: str = "decoder_only", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind=kind, vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, norm="pre",
               pos="rotary")
    cfg.update(overrides)
    return build_model(ModelConfig(**cfg)).eval()


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def test_relu2_is_squared_relu():
    ffn = FFN.build("relu2", {"d_model": 8, "d_ff": 16, "dropout": 0.0, "bias": True})
    x = torch.randn(3, 8)
    torch.testing.assert_close(ffn(x), ffn.down_proj(F.relu(ffn.up_proj(x)) ** 2))


@pytest.mark.parametrize("norm_type", ["rmsnorm", "layernorm"])
def test_qk_norm_normalises_queries_and_keys_per_head_after_rotary(norm_type):
    model = tiny(plugins={"qk_norm": {"type": norm_type}})
    seen = []
    kernel = model.decoder.blocks[0].self_attn.kernel
    kernel.register_forward_pre_hook(lambda m, args: seen.append(args[:2]))
    model(tokens(2, 9))
    q, k = seen[0]
    for x in (q, k):  # weights start at one (and biases at zero): unit RMS, or zero mean and unit variance
        if norm_type == "rmsnorm":
            torch.testing.assert_close(x.square().mean(-1), torch.ones(x.shape[:-1]), atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(x.mean(-1), torch.zeros(x.shape[:-1]), atol=1e-5, rtol=0)
    layer = model.decoder.blocks[0].self_attn.plugins["qk_norm"]
    assert layer.q_norm.weight.shape == (8,) and layer.k_norm is not layer.q_norm  # per head dim, own weights


def test_attention_softcap_is_c_tanh_of_the_scores():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g) * 3 for _ in range(3))
    scores = q @ k.transpose(-1, -2) / 2.0
    capped = 2.0 * torch.tanh(scores / 2.0)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = capped.masked_fill(~causal, float("-inf")).softmax(-1) @ v
    capping = AttentionSoftcap(2.0).score_mod
    torch.testing.assert_close(attend(q, k, v, causal, False, 0.0, None, score_mod=capping), expected)
    torch.testing.assert_close(attend(q, k, v, causal, False, 0.0, None, score_mod=AttentionSoftcap(1e9).score_mod),
                               attend(q, k, v, causal, False, 0.0, None), atol=1e-5, rtol=1e-5)


def test_logit_softcap_bounds_the_logits():
    plain, capped = tiny(), tiny(plugins={"logit_softcap": {"cap": 2.0}})
    capped.load_state_dict(plain.state_dict())
    x = tokens(2, 9)
    torch.testing.assert_close(capped(x), 2.0 * torch.tanh(plain(x) / 2.0))
    assert capped(x).abs().max() < 2.0


OPTIONS = [{"qk_norm": {"type": "rmsnorm"}}, {"attn_softcap": {"cap": 3.0}}, {"logit_softcap": {"cap": 5.0}},
           {"qk_norm": {"type": "layernorm"}, "attn_softcap": {"cap": 3.0}, "logit_softcap": {"cap": 5.0}}]


@pytest.mark.parametrize("kind, attention, plugins", list(itertools.product(
    ["decoder_only", "encoder_decoder"], ["full", {"name": "sliding_window", "window": 4}], OPTIONS)))
def test_cached_decoding_equals_the_full_forward(kind, attention, plugins):
    model = tiny(kind, attention=attention, n_kv_heads=2, plugins=plugins)
    assert_cached_decoding_equals_full_forward(model, kind, tokens(2, 10), tokens(2, 7, seed=4))


EVERY_OPTION = {"qk_norm": {"type": "rmsnorm"}, "attn_softcap": {"cap": 3.0}, "logit_softcap": {"cap": 5.0}}


@pytest.mark.parametrize("kind", ["decoder_only", "encoder_decoder", "encoder_only"])
def test_every_option_trains_with_every_kind(kind):
    model = tiny(kind, plugins=EVERY_OPTION, ffn="relu2").train()
    x = tokens(2, 7)
    out = model(x, x) if kind == "encoder_decoder" else model(x)
    out.logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}  # a class head stays unused
    assert all(torch.isfinite(g).all() for g in grads.values())
    norms = [n for n in grads if "q_norm" in n or "k_norm" in n]
    assert norms and all(grads[n].abs().sum() > 0 for n in norms)


def test_z_loss_is_the_mean_squared_log_normaliser_over_labelled_tokens():
    logits = torch.randn(2, 4, 7)
    labels = torch.tensor([[1, 2, -100, 3], [-100, -100, 4, 5]])
    real = labels != -100
    expected = logits.logsumexp(-1)[real].square().mean()
    z_loss = ZLoss(1e-4)
    assert OutputPlugins({"z_loss": z_loss})(logits) is logits  # identity in the forward; records log Z in training
    weight, value = z_loss.aux_losses(real)["z_loss"]
    assert weight == 1e-4
    torch.testing.assert_close(value, expected)
    assert z_loss.aux_losses(real) == {}  # read once


@pytest.mark.parametrize("options,match", [
    (dict(plugins={"qk_norm": {"type": "batchnorm"}}),
     "qk_norm: type='batchnorm' is not a known norm type .*valid options: dyt, layernorm, rmsnorm"),
    (dict(plugins={"attn_softcap": {"cap": 0.0}}), "attn_softcap: cap=0.0 must be positive"),
    (dict(plugins={"logit_softcap": {"cap": -1.0}}), "logit_softcap: cap=-1.0 must be positive"),
    (dict(plugins={"z_loss": {"weight": -1e-4}}), "z_loss: weight=-0.0001 must be >= 0"),
    (dict(plugins={"attn_softcap": {"cap": 5.0}}, attention="performer"),
     "attn_softcap needs the score matrix Q K\\^T, which attention=performer never forms")])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=9, **options).validate()
