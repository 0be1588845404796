"""Closed-form checks of each variant against the formula its paper gives."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model, count_parameters
from archsweep.variants.ffn import FFN
from archsweep.variants.ffn.base import GatedFeedForward, gated_hidden_size
from archsweep.variants.norm.deepnorm import DeepNorm, deepnorm_constants
from archsweep.variants.norm.post import PostNorm
from archsweep.variants.norm.pre import PreNorm
from archsweep.variants.norm.sandwich import SandwichNorm
from archsweep.variants.norm_type import build_norm
from archsweep.variants.pos.alibi import ALiBi, alibi_slopes
from archsweep.variants.pos.learned import LearnedPosition
from archsweep.variants.pos.relative import RelativeBias, relative_bucket
from archsweep.variants.pos.rotary import Rotary
from archsweep.variants.pos.sinusoidal import Sinusoidal


def test_sinusoidal_table_matches_paper_formula():
    d = 10
    pos = Sinusoidal(d)
    out = pos.embed(torch.zeros(1, 6, d), torch.arange(6)[None])[0]
    for p in range(6):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert out[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert out[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("n_heads, expected", [
    (8, [2.0 ** -(i + 1) for i in range(8)]),
    # not a power of two: slopes of 4 heads, then every other slope of 8 heads
    (6, [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]),
    # 12 heads: slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    (12, [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]),
])
def test_alibi_slopes(n_heads, expected):
    assert alibi_slopes(n_heads) == pytest.approx(expected)


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBi(4).attn_bias(3, 5, torch.device("cpu"))  # (1, H, 3, 5): queries at positions 2, 3, 4
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h] * abs(i + 2 - j))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20)])
def test_t5_buckets_match_huggingface(bidirectional, num_buckets, max_distance):
    """T5's public compute_bias(q, k) looks up the bias table at bucket(j - i); a table whose row b holds b gives
    the buckets themselves (the decoder's attention is causal, the encoder's bidirectional)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    config = transformers.T5Config(d_model=8, d_kv=4, num_heads=1, relative_attention_num_buckets=num_buckets,
                                   relative_attention_max_distance=max_distance, is_decoder=not bidirectional)
    t5 = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        t5.relative_attention_bias.weight.copy_(torch.arange(num_buckets, dtype=torch.float32)[:, None])
        theirs = t5.compute_bias(301, 301)[0, 0]  # (q, k): bucket of j - i, from -300 to 300
    relative = torch.arange(301)[None, :] - torch.arange(301)[:, None]
    assert torch.equal(relative_bucket(relative, bidirectional, num_buckets, max_distance).float(), theirs)


def test_t5_buckets_known_values():
    rel = torch.tensor([0, -1, -5, -15, -16, -200, 1, 7, 8, 200])
    # bidirectional: 16 buckets per direction, 8 exact; keys after the query start at bucket 16
    assert relative_bucket(rel, True, 32, 128).tolist() == [0, 1, 5, 9, 10, 15, 17, 23, 24, 31]
    # causal: all 32 buckets for the past, 16 exact; future distances fall in bucket 0
    assert relative_bucket(rel, False, 32, 128).tolist() == [0, 1, 5, 15, 16, 31, 0, 0, 0, 0]


def test_rotary_equals_complex_multiplication():
    head_dim, t = 8, 5
    rope = Rotary(head_dim)
    q, k = torch.randn(2, 3, t, head_dim), torch.randn(2, 3, t, head_dim)
    positions = torch.arange(t)[None]
    q_rot, _ = rope.rotate_qk(q, k, positions)
    half = head_dim // 2
    theta = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    z = torch.complex(q[..., :half].double(), q[..., half:].double())  # pair channel i with i + Dh/2
    rotated = z * torch.polar(torch.ones(t, half, dtype=torch.float64), positions[0, :, None] * theta)
    expected = torch.cat([rotated.real, rotated.imag], dim=-1).float()
    torch.testing.assert_close(q_rot, expected, atol=1e-5, rtol=1e-5)


def test_learned_position_is_a_table_lookup():
    pos = LearnedPosition(max_seq_len=7, d_model=4)
    x = torch.zeros(2, 3, 4)
    positions = torch.tensor([[0, 1, 2], [4, 5, 6]])
    torch.testing.assert_close(pos.embed(x, positions), pos.table.weight[positions])


def test_relative_bias_uses_one_table_per_head():
    rel = RelativeBias(n_heads=3, causal=False, num_buckets=8, max_distance=16)
    bias = rel.attn_bias(4, 4, torch.device("cpu"))
    assert bias.shape == (1, 3, 4, 4)
    buckets = relative_bucket(torch.arange(4)[None, :] - torch.arange(4)[:, None], True, 8, 16)
    torch.testing.assert_close(bias[0], rel.bias.weight[buckets].permute(2, 0, 1))


def test_norm_placements_follow_their_formulas():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    f = nn.Linear(8, 8)
    ln = lambda: nn.LayerNorm(8)  # noqa: E731
    deep = DeepNorm(ln, 0.0, role="stack", n_layers=1, n_decoder_layers=1)  # alpha = (2 n_layers) ** 0.25
    post, pre, sandwich = PostNorm(ln, 0.0), PreNorm(ln, 0.0), SandwichNorm(ln, 0.0)
    for m in (post, pre, sandwich, deep):  # make the norms non-trivial
        for p in m.parameters():
            nn.init.normal_(p)
    torch.testing.assert_close(post(x, f), post.norm(x + f(x)))
    torch.testing.assert_close(pre(x, f), x + f(pre.norm(x)))
    torch.testing.assert_close(sandwich(x, f), x + sandwich.out_norm(f(sandwich.norm(x))))
    torch.testing.assert_close(deep(x, f), deep.norm(2 ** 0.25 * x + f(x)))


def test_rmsnorm_has_no_centering():
    x = torch.randn(4, 8) + 3.0
    norm = build_norm("rmsnorm", 8, 1e-6, True)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x), expected)


def test_gated_ffn_keeps_parameter_count_and_formula():
    d, d_ff = 64, 192
    sizes = {"d_model": d, "d_ff": d_ff, "dropout": 0.0, "bias": False}
    plain = FFN.build("relu", sizes)
    gated = FFN.build("swiglu", sizes)
    assert isinstance(gated, GatedFeedForward) and gated_hidden_size(d_ff) == 128
    assert sum(p.numel() for p in gated.parameters()) == sum(p.numel() for p in plain.parameters())
    x = torch.randn(3, d)
    expected = gated.down_proj(nn.functional.silu(gated.gate_proj(x)) * gated.up_proj(x))
    torch.testing.assert_close(gated(x), expected)
    geglu = FFN.build({"name": "geglu", "approximate": "tanh"}, sizes)
    expected = geglu.down_proj(nn.functional.gelu(geglu.gate_proj(x), approximate="tanh") * geglu.up_proj(x))
    torch.testing.assert_close(geglu(x), expected)


def test_deepnorm_constants_match_deepnet_paper():
    alpha, beta = deepnorm_constants("stack", 6, 6)
    assert alpha == pytest.approx(12 ** 0.25) and beta == pytest.approx(48 ** -0.25)
    encoder, decoder = deepnorm_constants("encoder", 6, 6), deepnorm_constants("decoder", 6, 6)
    assert encoder == pytest.approx((0.81 * (6 ** 5) ** (1 / 16), 0.87 * (6 ** 5) ** (-1 / 16)))
    assert decoder == pytest.approx((18 ** 0.25, 72 ** -0.25))


def test_deepnorm_model_uses_alpha_and_beta_scaled_init():
    cfg = ModelConfig(kind="decoder_only", vocab_size=20, d_model=64, n_heads=4, n_layers=4, d_ff=256,
                      dropout=0.0, norm="deepnorm", init="xavier")
    torch.manual_seed(0)
    deep = build_model(cfg)
    alpha, beta = deepnorm_constants("stack", 4, 4)
    block = deep.decoder.blocks[0]
    assert block.attn_res.alpha == pytest.approx(alpha)
    # Xavier-uniform scaled by beta: std = beta * sqrt(2 / (fan_in + fan_out))
    assert block.ffn.up_proj.weight.std().item() == pytest.approx(beta * math.sqrt(2 / (64 + 256)), rel=0.1)
    w_q = block.self_attn.qkv_proj.weight[:64]
    w_v = block.self_attn.qkv_proj.weight[128:]
    assert w_q.std().item() == pytest.approx(math.sqrt(2 / 128), rel=0.1)  # queries keep gain 1
    assert w_v.std().item() == pytest.approx(beta * math.sqrt(2 / 128), rel=0.1)


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=100, d_model=128, n_heads=4, n_layers=8,
                                    d_ff=512, norm="pre", init="gpt2"))
    block = model.decoder.blocks[0]
    assert block.self_attn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.ffn.down_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert block.self_attn.out_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.1)
    assert torch.count_nonzero(block.self_attn.qkv_proj.bias) == 0


def test_embedding_scaling_and_tying():
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                      dropout=0.0, pos="none", share_src_tgt_embeddings=True, tie_embeddings=True)
    model = build_model(cfg)
    tokens = torch.tensor([[3, 4]])
    torch.testing.assert_close(model.encoder.embed(tokens), model.encoder.embed.weight[tokens] * 4.0)
    assert model.encoder.embed is model.decoder.embed
    assert model.head.weight is model.decoder.embed.weight
    untied = build_model(ModelConfig(**{**cfg.to_dict(), "share_src_tgt_embeddings": False, "tie_embeddings": False,
                                        "output_bias": True}))
    assert count_parameters(untied) == count_parameters(model) + 2 * 30 * 16 + 30
