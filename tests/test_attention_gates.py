"""Attention output gates (Qiu et al. 2025), attention sinks (gpt-oss; off-by-one softmax) and Dynamic Tanh (Zhu et
al. 2025): each against its reference (the paper's equations written in plain torch in tests/plain_decoder.py; Hugging
Face's gpt-oss attention), with the KV cache, on every path of the attention kinds that form scores, in the FLOP
count, and refused where it cannot apply."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from cache_check import assert_cached_decoding_equals_full_forward

from archsweep.core.model.build import ModelConfig, build_model, flop_count
from archsweep.variants.attention.base import AttnContext, attend
from archsweep.variants.attention.full import FullAttention
from archsweep.variants.attention.layers import SelfAttention, capture_attention
from archsweep.variants.flops import Shape
from archsweep.variants.norm_type import build_norm
from archsweep.variants.norm_type.dyt import DynamicTanh
from archsweep.variants.plugins.attn_gate import OutputGate
from archsweep.variants.plugins.attn_sink import AttentionSink
from archsweep.variants.plugins.attn_softcap import AttentionSoftcap
from archsweep.variants.pos.rotary import Rotary
from tests import plain_decoder
from tests.parity import assert_parity

VOCAB = 23
CONF = Path(__file__).resolve().parents[1] / "conf"


def tiny(kind: str = "decoder_only", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind=kind, vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0,
               norm="pre", pos="rotary")
    cfg.update(overrides)
    return build_model(ModelConfig(**cfg)).eval()


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def group(name: str) -> dict[str, dict]:
    """{option: the plug-in's options} of the group conf/<name>/ (its `none` left out)."""
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted((CONF / name).glob("*.yaml")) if p.stem != "none"}


GATE, SINK = group("attn_gate"), group("attn_sink")  # headwise, elementwise; learned, off_by_one


def layer(gate: str = "none", sink: str = "none", bias: bool = True) -> SelfAttention:
    torch.manual_seed(0)
    plugins = {}
    if gate != "none":
        plugins["attn_gate"] = OutputGate(16, 4, 4, bias, **GATE[gate])
    if sink != "none":
        plugins["attn_sink"] = AttentionSink(4, 4, **SINK[sink])
    attn = SelfAttention(16, 4, 2, 0.0, bias, layer=0, kernel=FullAttention(0), plugins=plugins).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return attn


def context(t: int, rope: Rotary, pad_mask: torch.Tensor | None = None) -> AttnContext:
    return AttnContext(pad_mask, True, t, t, torch.arange(t)[None], rope.rotate_qk, lambda q, k, d: None, None,
                       torch.device("cpu"))


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_is_the_papers_sigmoid_of_the_layer_input_on_each_heads_output(gate):
    """A decoder with the gate against Qiu et al.'s equation written in plain torch (tests/plain_decoder.py:
    Y' = Y * sigmoid(X W_theta + b) on each head's SDPA output, X the attention's normed input, before W_O), our
    weights copied in; 4 query heads over 2 key/value heads."""
    model = tiny(plugins={"attn_gate": GATE[gate]}, norm_type="rmsnorm")
    w = plain_decoder.copy_weights(model, n_heads=4, n_kv_heads=2)
    assert w["block0"]["gate.weight"].shape == ((4 if gate == "headwise" else 32), 32)  # per head, or per channel
    x = tokens(2, 9)
    with torch.no_grad():
        expected = plain_decoder.head(plain_decoder.decoder(x, w, 4, 2), w)
        assert_parity(model(x), expected)
        for i in range(2):  # the gate matters: without it the same weights give other logits
            del w[f"block{i}"]["gate.weight"], w[f"block{i}"]["gate.bias"]
        assert (plain_decoder.head(plain_decoder.decoder(x, w, 4, 2), w) - expected).abs().max() > 0.1


def gpt_oss_attention(attn: SelfAttention):
    """Hugging Face's gpt-oss attention (eager, its sink softmax) with this layer's weights."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    config = transformers.GptOssConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                       num_hidden_layers=1, layer_types=["full_attention"], attention_bias=True,
                                       attention_dropout=0.0, attn_implementation="eager")
    ref = GptOssAttention(config, 0).eval()
    with torch.no_grad():
        for part, w, b in zip((ref.q_proj, ref.k_proj, ref.v_proj), attn.qkv_proj.weight.split([16, 8, 8]),
                              attn.qkv_proj.bias.split([16, 8, 8]), strict=True):
            part.weight.copy_(w)
            part.bias.copy_(b)
        ref.o_proj.weight.copy_(attn.out_proj.weight)
        ref.o_proj.bias.copy_(attn.out_proj.bias)
        ref.sinks.copy_(attn.plugins["attn_sink"].logits)
    return ref


@pytest.mark.parametrize("sink", ["learned", "off_by_one"])
def test_the_sink_equals_hugging_face_gpt_oss_attention(sink):
    attn, rope = layer(sink=sink), Rotary(4)
    logits = attn.plugins["attn_sink"].logits
    if sink == "off_by_one":
        assert not any("sink" in name for name, _ in attn.named_parameters()) and logits.eq(0).all()
    else:
        with torch.no_grad():
            logits.copy_(torch.tensor([-2.0, 0.0, 1.5, 4.0]))  # one sink taking most of the weight
    ref = gpt_oss_attention(attn)
    t = 7
    x = torch.randn(2, t, 16)
    pad = torch.ones(2, t, dtype=torch.bool)
    pad[1, :2] = False  # a left-padded row
    keep = torch.ones(t, t).tril().bool() & pad[:, None, None, :]  # (B, 1, T, T)
    mask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    cos, sin = plain_decoder.rotary_cos_sin(t, 4)  # (T, Dh): the Dh / 2 angles twice
    with torch.no_grad():
        expected, _ = ref(x, (cos[None, :, :2], sin[None, :, :2]), mask)  # gpt-oss rotates halves as we do
        ours = attn(x, context(t, rope, pad))
    real = pad  # pads before the prompt see no key: gpt-oss gives them the sink alone, we every key (ignored)
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=1e-5)


def test_the_sink_is_one_more_logit_in_the_denominator_on_the_sdpa_and_the_explicit_paths():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    sink = torch.tensor([0.0, 1.0, -1.0])
    scores = q @ k.transpose(-1, -2) / 2.0
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    e = scores.exp().masked_fill(~causal, 0.0)
    probs = e / (e.sum(-1, keepdim=True) + sink.exp()[:, None, None])  # exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij))
    record: list[torch.Tensor] = []
    for is_causal, mask in ((True, None), (False, causal), (False, torch.zeros(5, 5).masked_fill(~causal, -math.inf))):
        torch.testing.assert_close(attend(q, k, v, mask, is_causal, 0.0, None, sink=sink), probs @ v)
    torch.testing.assert_close(attend(q, k, v, causal, False, 0.0, record, sink=sink), probs @ v)  # explicit path
    torch.testing.assert_close(record[0], probs)  # recorded without the sink's share: rows sum to 1 - p_sink
    capped = attend(q, k, v, causal, False, 0.0, None, score_mod=AttentionSoftcap(1e9).score_mod, sink=sink)
    torch.testing.assert_close(capped, probs @ v, atol=1e-5, rtol=1e-5)


OPTIONS = [dict(plugins={"attn_gate": GATE["headwise"]}), dict(plugins={"attn_gate": GATE["elementwise"]}),
           dict(plugins={"attn_sink": SINK["learned"]}), dict(plugins={"attn_sink": SINK["off_by_one"]}, pos="alibi"),
           dict(plugins={"attn_gate": GATE["elementwise"], "attn_sink": SINK["learned"]}, pos="deberta"),
           dict(plugins={"attn_sink": SINK["learned"]}, attention={"name": "sliding_window", "window": 4}),
           dict(plugins={"attn_gate": GATE["headwise"]}, norm_type="dyt",
                attention={"name": "sliding_window", "window": 3})]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("kind", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_the_full_forward(kind, options):
    model = tiny(kind, **options)
    with torch.no_grad():  # sinks away from their zero start
        for module in model.modules():
            if isinstance(module, AttentionSink) and isinstance(module.logits, torch.nn.Parameter):
                module.logits.normal_()
    assert_cached_decoding_equals_full_forward(model, kind, tokens(2, 10), tokens(2, 7, seed=4))


@pytest.mark.parametrize("attention", [{"name": "sliding_window", "window": 3}, "full"])
def test_with_a_sink_every_path_of_a_kind_gives_the_same_outputs(attention):
    """Sliding windows take the blocked form without recording, the dense one while recording; full attention SDPA
    and the explicit path: the same outputs, with padding."""
    model = tiny("decoder_only", plugins={"attn_sink": SINK["learned"]}, attention=attention, pos="alibi")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, SelfAttention):
                module.plugins["attn_sink"].logits.normal_()
    x, pad = tokens(2, 11), torch.ones(2, 11, dtype=torch.bool)
    pad[0, 8:] = False
    with torch.no_grad():
        fast = model(x, pad_mask=pad)
        with capture_attention(model) as maps:
            recorded = model(x, pad_mask=pad)
    torch.testing.assert_close(recorded[pad], fast[pad], atol=1e-5, rtol=1e-5)  # a pad query's output is ignored
    probs = next(iter(maps.values()))[0]
    assert probs.shape == (2, 4, 11, 11) and (probs.sum(-1) < 1).all()  # the sink takes a share of every row


def test_a_learned_sink_learns_and_gates_get_gradients():
    model = tiny(plugins={"attn_sink": SINK["learned"], "attn_gate": GATE["elementwise"]}).train()
    sinks = [n for n, _ in model.named_parameters() if n.endswith("sink.logits")]
    assert len(sinks) == 2  # one (H,) vector per layer
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = tokens(4, 12)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:])
        optimiser.zero_grad()
        loss.backward()
        assert model.decoder.blocks[0].self_attn.plugins["attn_gate"].gate_proj.weight.grad.abs().sum() > 0
        optimiser.step()
    assert model.decoder.blocks[0].self_attn.plugins["attn_sink"].logits.abs().min() > 0  # moved from its zero start


def test_the_flop_count_adds_the_gate_projection_and_the_sink_key():
    shape = Shape(batch=2, length=9, causal=True)
    base = dict(kind="decoder_only", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=3, d_ff=64)
    plain = flop_count(ModelConfig(**base), shape)
    d, h, dh, layers, n = 32, 4, 8, 3, shape.tokens

    def added(plugins: dict) -> float:
        return flop_count(ModelConfig(**base, plugins=plugins), shape) - plain

    assert added({"attn_gate": GATE["headwise"]}) == 2 * d * h * n * layers
    assert added({"attn_gate": GATE["elementwise"]}) == 2 * d * h * dh * n * layers
    for sink in ("learned", "off_by_one"):  # one more key per query: its score and its value, 4 H Dh
        assert added({"attn_sink": SINK[sink]}) == 4 * h * dh * n * layers


def test_dynamic_tanh_is_gamma_tanh_alpha_x_plus_beta():
    dyt = build_norm("dyt", 8, 1e-5, True)
    assert isinstance(dyt, DynamicTanh) and dyt.alpha.shape == () and dyt.alpha.item() == 0.5  # the paper's start
    with torch.no_grad():
        dyt.weight.normal_()
        dyt.bias.normal_()
        dyt.alpha.fill_(1.7)
    x = torch.randn(3, 5, 8) * 4
    torch.testing.assert_close(dyt(x), dyt.weight * torch.tanh(1.7 * x) + dyt.bias)  # DyT(x) = gamma tanh(a x) + b
    assert build_norm("dyt", 8, 1e-5, bias=False).bias is None  # model.norm_bias=false drops beta


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich", "deepnorm", "parallel"])
def test_dyt_replaces_every_norm_of_every_placement(norm):
    model = tiny(norm=norm, norm_type="dyt", plugins={"qk_norm": {"type": "dyt"}}).train()
    norms = [m for m in model.modules() if isinstance(m, DynamicTanh)]
    assert norms and not any(isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) for m in model.modules())
    assert all(m.alpha.item() == 0.5 for m in norms)  # initialisation leaves alpha at the paper's 0.5
    x = tokens(2, 7)
    model(x).logsumexp(-1).mean().backward()
    assert all(m.alpha.grad is not None and m.alpha.grad != 0 for m in norms)


@pytest.mark.parametrize("options,match", [
    (dict(plugins={"attn_gate": {"per": "yes"}}), "attn_gate: per='yes' must be one of head, channel"),
    (dict(plugins={"attn_sink": {"learned": "always"}}), "plugin=attn_sink: option learned='always' must be bool"),
    (dict(norm_type="tanh"), "norm_type='tanh' is not a known option; valid options: dyt, layernorm, rmsnorm"),
    (dict(plugins={"attn_sink": SINK["off_by_one"]}, attention="performer"),
     r"attn_sink needs the score matrix Q K\^T, which attention=performer never forms; set attn_sink=none or "
     r"choose attention=")])
def test_bad_options_are_refused_naming_the_field(options, match):
    with pytest.raises(ValueError, match=match):
        tiny(**options)
