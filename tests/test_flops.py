"""The analytic FLOP count (archsweep.variants.flops) against torch's FlopCounterMode on real passes.

The counter counts what the kernels execute, here SDPA's math backend (its products are matmuls the counter sees; it
has no entry for the CPU flash kernel): dense attention (a causal or windowed SDPA call costs the full T x T), no
input gradient for images. The analytic count honours masks and takes the backward as 2 x the forward. So: where no
mask hides work (bidirectional full attention) the two agree exactly; with masks they differ by exactly the hidden
part; and for every model kind x attention kind the totals agree within 10% at these sizes.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter

from archsweep.core.data.tasks.forward import flop_shape
from archsweep.core.model.build import build_model
from archsweep.core.model.config import ModelConfig
from archsweep.variants.attention import ATTENTION
from archsweep.variants.attention.base import mean_keys
from archsweep.variants.flops import TRAIN_FACTOR, Shape, forward_flops
from archsweep.variants.model import KIND

B, T, S, D, H, LAYERS, FF, V = 2, 64, 40, 128, 4, 2, 512, 96


def counted(model, args, backward=False, pooled=False):
    """Under SDPA's math backend, whose products are matmuls the counter sees (it has no entry for the CPU flash
    kernel)."""
    with sdpa_kernel(SDPBackend.MATH), flop_counter.FlopCounterMode(display=False) as counter:
        out = model.classify(*args) if pooled else model(*args)
        if backward:
            out.float().sum().backward()
    return counter.get_total_flops(), counter.get_flop_counts()["Global"]


def make(kind, attention="full", **fields):
    base = dict(kind=kind, vocab_size=V, d_model=D, n_heads=H, n_layers=LAYERS, d_ff=FF, dropout=0.0,
                attention=attention, max_seq_len=128)
    if kind == "vit":
        base.update(image_size=16, patch_size=4, in_channels=3, n_classes=10, vocab_size=1)
        base.pop("vocab_size")
    return build_model(ModelConfig.from_dict({**base, **fields}))


def inputs(kind):
    g = torch.Generator().manual_seed(0)
    if kind == "encoder_decoder":
        return (torch.randint(4, V, (B, S), generator=g), torch.randint(4, V, (B, T), generator=g)), \
            Shape(B, T, memory=S)
    if kind == "vit":
        return (torch.randn(B, 3, 16, 16, generator=g),), Shape(B, 0)
    return (torch.randint(4, V, (B, T), generator=g),), Shape(B, T)


def dense_attention(kind, per_layer_queries_keys):
    """Forward FLOPs a dense kernel spends on scores and values: 4 Dh H per query-key pair."""
    return 4.0 * (D // H) * H * per_layer_queries_keys


def test_kinds_and_attention_kinds_are_all_covered():
    assert set(KIND.names()) == {"decoder_only", "encoder_only", "encoder_decoder", "vit"}
    assert set(ATTENTION.names()) == {"full", "sliding_window", "linear", "performer", "mla"}


@pytest.mark.parametrize("attention", ["full", "sliding_window", "linear", "performer", "mla"])
@pytest.mark.parametrize("kind", ["decoder_only", "encoder_only", "encoder_decoder", "vit"])
def test_within_ten_percent_of_the_counter_forward_and_backward(kind, attention):
    torch.manual_seed(0)
    model = make(kind, attention)
    args, shape = inputs(kind)
    analytic = forward_flops(model, shape)
    fwd, _ = counted(model, args)
    train, _ = counted(model, args, backward=True)
    assert analytic == pytest.approx(fwd, rel=0.10), (analytic, fwd)
    assert TRAIN_FACTOR * analytic == pytest.approx(train, rel=0.10), (TRAIN_FACTOR * analytic, train)


@pytest.mark.parametrize("pos", ["sinusoidal", "learned", "rotary", "alibi", "relative", "shaw", "deberta"])
def test_bidirectional_full_attention_matches_the_counter_exactly(pos):
    """Nothing is masked, so every product the counter sees is one the analytic count names (including the
    position terms of Shaw and DeBERTa and the pooled head of a classifier)."""
    model = make("encoder_only", pos=pos)
    args, shape = inputs("encoder_only")
    assert forward_flops(model, shape) == counted(model, args)[0]
    assert forward_flops(model, shape.replace(pooled=True)) == counted(model, args, pooled=True)[0]


@pytest.mark.parametrize("gate", [{"per": "head"}, {"per": "channel"}], ids=["headwise", "elementwise"])
def test_the_attention_gate_and_sink_match_the_counter_exactly(gate):
    """The gate's projection and the sink's extra key (Tk + 1 keys per query in the SDPA call) are all the
    products they add."""
    model = make("encoder_only", plugins={"attn_gate": gate, "attn_sink": {"learned": True}})
    args, shape = inputs("encoder_only")
    assert forward_flops(model, shape) == counted(model, args)[0]


def test_vit_matches_the_counter_exactly_forward_and_the_backward_lacks_the_image_gradient():
    model = make("vit")
    args, shape = inputs("vit")
    analytic = forward_flops(model, shape)
    assert analytic == counted(model, args)[0]
    conv = 2.0 * model.embed.proj.weight.numel() * B * 16  # 16 patches per image
    assert counted(model, args, backward=True)[0] == pytest.approx(3 * analytic - conv)  # no gradient for pixels


@pytest.mark.parametrize("kind", ["decoder_only", "encoder_decoder"])
def test_causal_attention_counts_the_visible_keys(kind):
    """The counter charges a causal SDPA call all T x T pairs; the analytic count the T (T + 1) / 2 visible."""
    model = make(kind)
    args, shape = inputs(kind)
    hidden = B * LAYERS * (T * T - T * (T + 1) / 2)
    assert counted(model, args)[0] - forward_flops(model, shape) == pytest.approx(dense_attention(kind, hidden))


def test_cross_attention_counts_the_source_length():
    model = make("encoder_decoder")
    args, shape = inputs("encoder_decoder")
    cross = model.decoder.blocks[0].cross_attn
    d = D
    expected = 2 * d * d * B * T * 2 + 2 * d * 2 * d * B * S + dense_attention("", B * T * S)  # q, out; k v; core
    assert forward_flops(cross, shape) == expected
    longer = Shape(B, T, memory=2 * S)
    assert forward_flops(cross, longer) - forward_flops(cross, shape) == 2 * d * 2 * d * B * S + \
        dense_attention("", B * T * S)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 5, 16, 64, 100])
def test_mean_keys_counts_the_mask(causal, window):
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (j <= i) & (i - j < window) if causal else (i - j).abs() < window
    assert mean_keys(T, causal, window) == pytest.approx(seen.sum().item() / T)


def test_sliding_window_caps_the_attention_term():
    full, windowed = make("decoder_only"), make("decoder_only", {"name": "sliding_window", "window": 8})
    shape = Shape(B, T)
    saved = forward_flops(full, shape) - forward_flops(windowed, shape)
    assert saved == pytest.approx(dense_attention("", B * LAYERS * T * (mean_keys(T, True, None)
                                                                         - mean_keys(T, True, 8))))
    assert saved > 0


def test_kernel_attention_has_no_quadratic_term():
    model = make("encoder_only", "linear")
    per_token = [forward_flops(model, Shape(1, t)) / t for t in (64, 256, 1024)]
    assert per_token[0] == pytest.approx(per_token[2])  # bidirectional linear attention: O(T)


def test_grouped_query_heads_shrink_the_key_value_projections():
    mha, mqa = make("encoder_only"), make("encoder_only", n_kv_heads=1)
    args, shape = inputs("encoder_only")
    dh = D // H
    assert forward_flops(mha, shape) - forward_flops(mqa, shape) == 2 * D * 2 * (H - 1) * dh * B * T * LAYERS
    assert forward_flops(mqa, shape) == counted(mqa, args)[0]


def test_gated_ffn_counts_three_matrices():
    relu, swiglu = make("encoder_only", ffn="relu"), make("encoder_only", ffn="swiglu")
    shape = Shape(B, T)
    hidden = swiglu.encoder.blocks[0].ffn.hidden_size
    per_layer = forward_flops(swiglu.encoder.blocks[0].ffn, shape)
    assert per_layer == 3 * 2 * D * hidden * B * T
    assert forward_flops(relu.encoder.blocks[0].ffn, shape) == 2 * 2 * D * FF * B * T


def test_tied_and_untied_heads_cost_the_same():
    tied, untied = make("decoder_only"), make("decoder_only", tie_embeddings=False)
    shape = Shape(B, T)
    assert forward_flops(tied, shape) == forward_flops(untied, shape)
    assert forward_flops(tied.head, shape) == 2 * D * V * B * T


def test_prefix_lm_batches_are_counted_at_their_packed_length():
    from archsweep.core.data.tasks.batches import decoder_only_batch, encoder_decoder_batch

    src, tgt = torch.randint(4, 20, (3, 7)), torch.randint(4, 20, (3, 5))
    src_len, tgt_len = torch.tensor([7, 4, 2]), torch.tensor([5, 5, 3])
    packed = decoder_only_batch(src, src_len, tgt, tgt_len, pad_id=0, sep_id=3)
    assert flop_shape(packed) == Shape(3, 7 + 1 + 5)
    pair = encoder_decoder_batch(src, src_len, tgt, tgt_len, pad_id=0, bos_id=1)
    assert flop_shape(pair) == Shape(3, 5, memory=7)
    model = make("decoder_only")
    assert forward_flops(model, flop_shape(packed)) == pytest.approx(
        counted(model, (packed["tokens"], packed["pad_mask"]))[0] - dense_attention("", 3 * LAYERS * (
            13 * 13 - 13 * 14 / 2)))
