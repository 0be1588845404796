"""The relative-position family and RoPE scaling against their papers' formulas, written out directly here (fp64;
rotary angles are computed in fp32, so rotary comparisons hold to fp32 precision)."""

from __future__ import annotations

import math

import pytest
import torch

from archsweep.variants.attention.base import attend
from archsweep.variants.pos.deberta import Disentangled
from archsweep.variants.pos.rotary import Rotary, yarn_frequencies
from archsweep.variants.pos.shaw import ShawRelative
from archsweep.variants.pos.xpos import XPos


@pytest.fixture(autouse=True)
def float64():
    """Every module and tensor of these tests in fp64; the default is restored for the other test files."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def qkv(b=2, h=3, t=7, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g) for _ in range(3)]


@pytest.mark.parametrize("causal", [True, False])
def test_shaw_equals_equations_3_to_5_with_key_vectors(causal):
    k_max = 2
    shaw = ShawRelative(n_heads=2, head_dim=8, n_layers=2, n_decoder_layers=2, role="stack", max_distance=k_max)
    torch.nn.init.normal_(shaw.tables[1].weight)
    q, k, v = qkv()
    t = q.shape[2]
    a = shaw.tables[1].weight  # (2k + 1, d): a^K for clip(j - i, -k, k) + k
    expected = torch.zeros_like(q)
    for i in range(t):
        e = torch.stack([(q[:, :, i] * (k[:, :, j] + a[max(-k_max, min(k_max, j - i)) + k_max])).sum(-1)
                         for j in range(t)], dim=-1) / math.sqrt(8)  # (B, H, Tk): equation (4)
        if causal:
            e[..., i + 1:] = float("-inf")
        alpha = e.softmax(-1)  # equation (2)
        expected[:, :, i] = torch.einsum("bhj,bhjd->bhd", alpha, v)  # equation (3) without a^V
    bias = shaw.content_bias(q, k, layer=1)
    if causal:
        bias = bias.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(attend(q, k, v, bias, False, 0.0, None), expected)


def test_deberta_terms_each_equal_their_formula():
    k_max, d_model, h, dh = 3, 12, 3, 4
    pos = Disentangled(d_model, h, dh, n_layers=1, n_decoder_layers=1, role="stack", max_distance=k_max,
                       p2c_index="paper")  # the paper's equation 4 (the code's index: test_reference_conventions.py)
    for p in pos.parameters():
        torch.nn.init.normal_(p)
    q, k, _ = qkv(h=h, t=9, d=dh)
    qs, _ = pos.rotate_qk(q, k, torch.arange(9)[None])
    torch.testing.assert_close(qs, q / math.sqrt(3))
    p = pos.table.weight
    k_r = pos.k_rel[0](p).view(2 * k_max, h, dh)  # (2k, H, Dh)
    q_r = pos.q_rel[0](p).view(2 * k_max, h, dh)
    delta = lambda i, j: max(-k_max, min(k_max - 1, i - j)) + k_max  # noqa: E731
    c2p = torch.zeros(2, h, 9, 9)
    p2c = torch.zeros(2, h, 9, 9)
    for i in range(9):
        for j in range(9):
            c2p[:, :, i, j] = (q[:, :, i] * k_r[delta(i, j)]).sum(-1)  # Q^c_i K^r_d(i,j)
            p2c[:, :, i, j] = (k[:, :, j] * q_r[delta(j, i)]).sum(-1)  # K^c_j Q^r_d(j,i)
    scale = math.sqrt(3 * dh)
    torch.testing.assert_close(pos.content_bias(qs, k, 0), (c2p + p2c) / scale)
    with torch.no_grad():
        pos.q_rel[0].weight.zero_()  # only content-to-position left
    torch.testing.assert_close(pos.content_bias(qs, k, 0), c2p / scale)
    with torch.no_grad():
        pos.k_rel[0].weight.zero_()
        torch.nn.init.normal_(pos.q_rel[0].weight)
    q_r = pos.q_rel[0](p).view(2 * k_max, h, dh)
    for i in range(9):
        for j in range(9):
            p2c[:, :, i, j] = (k[:, :, j] * q_r[delta(j, i)]).sum(-1)
    torch.testing.assert_close(pos.content_bias(qs, k, 0), p2c / scale)  # only position-to-content
    # and the whole score: (q k + c2p + p2c) / sqrt(3 Dh), the first term by the softmax kernel's 1/sqrt(Dh)
    scores = qs @ k.transpose(-1, -2) / math.sqrt(dh) + pos.content_bias(qs, k, 0)
    torch.testing.assert_close(scores, (q @ k.transpose(-1, -2) + p2c) / scale)


def test_xpos_without_decay_is_rotary_and_with_decay_scales_by_distance():
    q, k, _ = qkv(t=6)
    positions = torch.arange(40, 46)[None]
    rope = Rotary(8)
    rq, rk = rope.rotate_qk(q, k, positions)
    plain = XPos(8, scale_base=None).rotate_qk(q, k, positions)
    torch.testing.assert_close(plain[0], rq, atol=0, rtol=0)
    torch.testing.assert_close(plain[1], rk, atol=0, rtol=0)
    xq, xk = XPos(8, scale_base=16.0).rotate_qk(q, k, positions)
    zeta = (torch.arange(0, 8, 2) / 8 + 0.4) / 1.4
    zeta = torch.cat([zeta, zeta])  # rotate-half pairs channel c with c + Dh/2
    for n in range(6):
        for m in range(6):
            expected = (rq[:, :, n] * rk[:, :, m] * zeta ** ((n - m) / 16.0)).sum(-1)  # zeta^((n - m) / scale_base)
            torch.testing.assert_close((xq[:, :, n] * xk[:, :, m]).sum(-1), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_rope_scaling_factor_one_is_plain_rotary(scaling):
    q, k, _ = qkv()
    positions = torch.arange(7)[None]
    plain = Rotary(8).rotate_qk(q, k, positions)
    scaled = Rotary(8, scaling=scaling, factor=1.0, original_length=64).rotate_qk(q, k, positions)
    torch.testing.assert_close(scaled[0], plain[0], atol=0, rtol=0)
    torch.testing.assert_close(scaled[1], plain[1], atol=0, rtol=0)


def test_position_interpolation_rotates_m_as_plain_rotary_rotates_m_over_s():
    q, k, _ = qkv()
    positions = torch.arange(0, 28, 4)[None]
    scaled = Rotary(8, scaling="linear", factor=4.0).rotate_qk(q, k, positions)
    plain = Rotary(8).rotate_qk(q, k, positions / 4.0)
    torch.testing.assert_close(scaled[0], plain[0])
    torch.testing.assert_close(scaled[1], plain[1])


def test_ntk_is_rotary_with_the_changed_base():
    q, k, _ = qkv()
    positions = torch.arange(7)[None]
    ntk = Rotary(8, scaling="ntk", factor=4.0).rotate_qk(q, k, positions)
    plain = Rotary(8, base=10000.0 * 4.0 ** (8 / 6)).rotate_qk(q, k, positions)
    torch.testing.assert_close(ntk[0], plain[0])


def test_yarn_interpolates_slow_frequencies_keeps_fast_ones_and_scales_attention():
    head_dim, factor, length = 64, 8.0, 256
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2) / head_dim)
    turns = length * inv_freq / (2 * math.pi)
    yarn = yarn_frequencies(inv_freq, factor, length, beta_fast=32.0, beta_slow=1.0, ramp="paper")
    fast, slow = turns > 32, turns < 1
    assert fast.any() and slow.any() and (~fast & ~slow).any()
    exact = dict(rtol=1e-12, atol=0)  # float64 frequencies down to 2e-5: relative, not float64's atol of 1e-7
    torch.testing.assert_close(yarn[fast], inv_freq[fast], **exact)
    torch.testing.assert_close(yarn[slow], inv_freq[slow] / factor, **exact)
    middle = ~fast & ~slow
    gamma = (turns[middle] - 1) / 31
    torch.testing.assert_close(yarn[middle], (1 - gamma) * inv_freq[middle] / factor + gamma * inv_freq[middle],
                               **exact)
    rope = Rotary(head_dim, scaling="yarn", factor=factor, original_length=length)
    q = torch.randn(1, 1, 3, head_dim)
    rq, _ = rope.rotate_qk(q, q, torch.arange(3)[None])
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1) * (0.1 * math.log(factor) + 1))  # sqrt(1/t)


@pytest.mark.parametrize("pos,options,field", [("rotary", {"scaling": "cubic"}, "scaling"),
                                               ("rotary", {"factor": 0.5}, "factor"),
                                               ("rotary", {"scaling": "yarn", "beta_fast": 1.0}, "beta_fast"),
                                               ("xpos", {"scale_base": 0.0}, "scale_base"),
                                               ("shaw", {"max_distance": 0}, "max_distance"),
                                               ("deberta", {"max_distance": 0}, "max_distance")])
def test_bad_options_are_refused_naming_the_field(pos, options, field):
    from archsweep.core.model.config import ModelConfig

    with pytest.raises(ValueError, match=field):
        ModelConfig(vocab_size=9, pos={"name": pos, **options}).validate()
