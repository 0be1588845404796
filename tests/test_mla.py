"""Multi-head latent attention (`attention=mla`) against Hugging Face's DeepseekV3Attention, its latent cache, its FLOP
count, and the encodings and fields it refuses."""

from __future__ import annotations

import pytest
import torch
from cache_check import assert_cached_decoding_equals_full_forward

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.attention.base import AttnContext
from archsweep.variants.cache import KVCache
from archsweep.variants.flops import Shape, forward_flops

VOCAB, D, H = 23, 32, 4
SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)


def tiny(kind: str = "decoder_only", q_lora_rank: int = 0, **fields) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind=kind, vocab_size=VOCAB, d_model=D, n_heads=H, n_layers=2, d_ff=64, dropout=0.0, norm="pre",
               pos="rotary", norm_eps=1e-6, attention={"name": "mla", "q_lora_rank": q_lora_rank, **SIZES})
    return build_model(ModelConfig(**{**cfg, **fields})).eval()


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def hf_attention(q_lora_rank: int, interleave: bool):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=D, num_attention_heads=H, num_key_value_heads=H, attention_bias=False,
        q_lora_rank=q_lora_rank or None, rope_interleave=interleave, rope_parameters={"rope_type": "default",
                                                                                      "rope_theta": 10000.0},
        attn_implementation="eager", **SIZES)
    return hf.DeepseekV3Attention(config, layer_idx=0).eval(), hf.DeepseekV3RotaryEmbedding(config)


def copy_weights(kernel, theirs, interleave: bool) -> None:
    """Their weights into our layer; with interleaved rotary pairs (DeepSeek's checkpoints) the rotary rows are put
    in rotate-half order, which is what their interleaved rotation computes."""
    rope, nope = SIZES["qk_rope_head_dim"], SIZES["qk_nope_head_dim"]
    order = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)]) if interleave else torch.arange(rope)
    q_rows = torch.cat([torch.cat([torch.arange(nope), nope + order]) + h * (nope + rope) for h in range(H)])
    kv_rows = torch.cat([torch.arange(SIZES["kv_lora_rank"]), SIZES["kv_lora_rank"] + order])
    with torch.no_grad():
        if theirs.q_proj is not None:
            kernel.q_proj.weight.copy_(theirs.q_proj.weight[q_rows])
        else:
            down, norm, up = kernel.q_proj
            down.weight.copy_(theirs.q_a_proj.weight)
            norm.weight.copy_(theirs.q_a_layernorm.weight)
            up.weight.copy_(theirs.q_b_proj.weight[q_rows])
        kernel.kv_down_proj.weight.copy_(theirs.kv_a_proj_with_mqa.weight[kv_rows])
        kernel.kv_norm.weight.copy_(theirs.kv_a_layernorm.weight)
        kernel.kv_up_proj.weight.copy_(theirs.kv_b_proj.weight)
        kernel.out_proj.weight.copy_(theirs.o_proj.weight)


@pytest.mark.parametrize("q_lora_rank, interleave", [(0, False), (8, True)])
def test_equals_hugging_face_deepseek_v3_attention(q_lora_rank, interleave):
    theirs, rotary = hf_attention(q_lora_rank, interleave)
    with torch.no_grad():  # norms start at one: give them values, so a swapped norm weight shows
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    model = tiny(q_lora_rank=q_lora_rank)
    layer, stack = model.decoder.blocks[0].self_attn, model.decoder
    copy_weights(layer.kernel, theirs, interleave)
    t = 9
    x = torch.randn(2, t, D, generator=torch.Generator().manual_seed(3))
    positions = torch.arange(t)[None]
    ctx = AttnContext(None, True, t, t, positions, stack.pos.rotate_qk, stack.pos.attn_bias, None, x.device)
    causal = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = theirs(x, rotary(x, positions), causal)
        torch.testing.assert_close(layer(x, ctx), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind, pos, q_lora_rank", [("decoder_only", "rotary", 0), ("decoder_only", "alibi", 8),
                                                    ("encoder_decoder", "relative", 8)])
def test_cached_decoding_equals_the_full_forward(kind, pos, q_lora_rank):
    model = tiny(kind, q_lora_rank, pos=pos)
    assert_cached_decoding_equals_full_forward(model, kind, tokens(2, 10), tokens(2, 7, seed=4))


def test_the_cache_keeps_the_latent_and_the_rotary_key_per_token_and_layer():
    cache = KVCache(max_len=12)
    with torch.no_grad():
        tiny()(tokens(3, 5), cache=cache)
    per_token = SIZES["kv_lora_rank"] + SIZES["qk_rope_head_dim"]
    assert cache.elements_per_token() == {0: per_token, 1: per_token}
    assert cache.nbytes() == 2 * 3 * 12 * per_token * 4  # layers x batch x max_len x width x fp32
    full = KVCache(max_len=12)
    with torch.no_grad():
        tiny(attention="full")(tokens(3, 5), cache=full)
    assert full.elements_per_token() == {0: 2 * D, 1: 2 * D}  # keys and values of every head


def test_null_sizes_follow_deepseek_v3_ratios_to_the_head_size():
    model = tiny(attention="mla")  # Dh = 8: nope = v = 8, rope = 4, latent 32
    kernel = model.decoder.blocks[0].self_attn.kernel
    assert (kernel.nope, kernel.rope, kernel.v_dim, kernel.rank, kernel.cache_width) == (8, 4, 8, 32, 36)
    assert model.decoder.pos.inv_freq.shape == (2,)  # the encoding rotates the rope channels only


def test_flops_count_the_projections_and_the_scores_exactly_when_nothing_is_masked():
    from torch.utils import flop_counter

    model = tiny("encoder_only", q_lora_rank=8)
    x = tokens(2, 11)
    with flop_counter.FlopCounterMode(display=False) as counter:
        model(x)
    assert forward_flops(model, Shape(2, 11)) == counter.get_total_flops()


@pytest.mark.parametrize("fields, match", [
    (dict(pos="shaw"), r"attention=mla cannot take pos=shaw: its score term .* choose pos=.*rotary"),
    (dict(pos="deberta"), r"attention=mla cannot take pos=deberta"),
    (dict(pos="xpos"), r"attention=mla cannot take pos=xpos: it changes the magnitude"),
    (dict(pos={"name": "rotary", "scaling": "yarn", "factor": 4.0}), r"YaRN's attention temperature"),
    (dict(n_kv_heads=2), r"n_kv_heads=2 does not apply to attention=mla"),
    (dict(plugins={"qk_norm": {"type": "rmsnorm"}}),
     r"qk_norm needs the layer's own q, k, v and output projections, which attention=mla replaces with its own; "
     r"set qk_norm=none or choose attention="),
    (dict(plugins={"value_residual": {"learnable": False}}),
     r"value_residual needs the layer's own q, k, v and output projections, which attention=mla replaces"),
    (dict(attention={"name": "mla", "qk_rope_head_dim": 3}), r"qk_rope_head_dim=3 must be even"),
    (dict(attention={"name": "mla", "kv_lora_rank": 0}), r"kv_lora_rank=0 must be an integer >= 1"),
])
def test_what_it_cannot_take_is_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        tiny(**fields)


@pytest.mark.parametrize("pos", ["learned", {"name": "rotary", "scaling": "ntk", "factor": 2.0}])
def test_the_encodings_it_takes_train(pos):
    model = tiny(pos=pos, q_lora_rank=8, dropout=0.1).train()
    model(tokens(2, 7)).logsumexp(-1).mean().backward()
    kernel = model.decoder.blocks[1].self_attn.kernel
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in kernel.parameters())


def test_deepnorm_scales_the_value_rows_and_the_output_but_not_the_keys():
    post, deep = tiny(norm="post"), tiny(norm="deepnorm")  # the same draws; DeepNorm then scales by beta
    beta = deep.decoder.blocks[0].attn_res.beta
    ours, ref = deep.decoder.blocks[0].self_attn.kernel, post.decoder.blocks[0].self_attn.kernel
    nope = SIZES["qk_nope_head_dim"]
    up, up_ref = (k.kv_up_proj.weight.view(H, -1, SIZES["kv_lora_rank"]) for k in (ours, ref))
    exact = dict(rtol=1e-6, atol=0)  # weights of std ~0.02: a default atol of 1e-5 would be 5e-4 of them
    torch.testing.assert_close(up[:, nope:], up_ref[:, nope:] * beta, **exact)
    torch.testing.assert_close(up[:, :nope], up_ref[:, :nope], **exact)
    torch.testing.assert_close(ours.out_proj.weight, ref.out_proj.weight * beta, **exact)
    torch.testing.assert_close(ours.kv_down_proj.weight, ref.kv_down_proj.weight, **exact)
