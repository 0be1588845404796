"""The parallel block (GPT-J / PaLM) and value residual learning (ResFormer) against their formulas; both work with
the KV cache and activation checkpointing, and the sequential placements are unchanged by the block hook."""

from __future__ import annotations

import itertools

import pytest
import torch
from cache_check import assert_cached_decoding_equals_full_forward

from archsweep.core.model.build import ModelConfig, build_model

VOCAB = 23


def tiny(kind: str = "decoder_only", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind=kind, vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=3, d_ff=64, dropout=0.0, norm="pre",
               pos="rotary")
    cfg.update(overrides)
    return build_model(ModelConfig(**cfg)).eval()


FIXED = {"value_residual": {"learnable": False}}  # ResFormer's lambda2 = 0.5
LEARNABLE = {"value_residual": {"learnable": True}}


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shared", [True, False])
def test_parallel_block_adds_attention_and_ffn_of_the_same_input(shared):
    model = tiny(norm={"name": "parallel", "shared_norm": shared})
    block = model.decoder.blocks[1]
    for p in block.parameters():  # non-trivial norms
        torch.nn.init.normal_(p, std=0.3)
    seen = {}
    block.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    block.self_attn.register_forward_hook(lambda m, args, out: seen.update(h=args[0], a=out))
    model(tokens(2, 8))
    x = seen["x"]
    ffn_norm = block.attn_res.norm if shared else block.ffn_res.norm
    torch.testing.assert_close(seen["h"], block.attn_res.norm(x))  # attention reads norm(x)
    torch.testing.assert_close(seen["y"], x + seen["a"] + block.ffn(ffn_norm(x)))  # and so does the FFN
    assert isinstance(block.ffn_res.norm, torch.nn.Identity) == shared  # a shared norm leaves no unused weights


def test_parallel_cross_attention_is_a_third_parallel_branch():
    model = tiny("encoder_decoder", norm="parallel", n_layers=2)
    block = model.decoder.blocks[0]
    seen = {}
    for name in ("self_attn", "cross_attn", "ffn"):
        getattr(block, name).register_forward_hook(lambda m, args, out, name=name: seen.update({name: (args[0], out)}))
    block.register_forward_hook(lambda m, args, out: seen.update(block=(args[0], out)))
    model(tokens(2, 7, seed=3), tokens(2, 6))
    x, y = seen["block"]
    h = block.attn_res.norm(x)
    for name in ("self_attn", "cross_attn", "ffn"):
        torch.testing.assert_close(seen[name][0], h)  # every branch reads the same normalised input
    torch.testing.assert_close(y, x + seen["self_attn"][1] + seen["cross_attn"][1] + seen["ffn"][1])


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich", "deepnorm"])
def test_sequential_placements_equal_the_block_written_out(norm):
    """The block hook's default keeps the sequential order bit for bit: x -> attn residual -> ffn residual."""
    model = tiny("encoder_decoder", norm=norm, n_layers=2, dropout=0.0)
    block = model.decoder.blocks[1]
    seen = {}
    block.register_forward_hook(lambda m, args, out: seen.update(args=args, out=out))
    model(tokens(2, 7, seed=3), tokens(2, 6))
    x, ctx, memory, mask = seen["args"]
    ctx.memo.clear()
    h = block.attn_res(x, lambda t: block.self_attn(t, ctx))
    h = block.cross_res(h, lambda t: block.cross_attn(t, memory, mask, None))
    assert torch.equal(block.ffn_res(h, block.ffn), seen["out"])


def test_value_residual_fixed_mixes_values_with_the_first_layers():
    model = tiny(plugins={"value_residual": {"learnable": False, "weight": 0.25}})
    given, raw = {}, {}  # the values each attention kind receives; each layer's projected q, k, v
    for i, block in enumerate(model.decoder.blocks):
        block.self_attn.kernel.register_forward_pre_hook(lambda m, args, i=i: given.update({i: args[2]}))
        block.self_attn.qkv_proj.register_forward_hook(lambda m, args, out, i=i: raw.update({i: out}))
    model(tokens(2, 9))
    sa = model.decoder.blocks[0].self_attn
    values = {i: sa.split_heads(out[..., -sa.head_dim * sa.n_kv_heads:], sa.n_kv_heads)  # (B, Hkv, T, Dh)
              for i, out in raw.items()}
    torch.testing.assert_close(given[0], values[0])  # the first layer attends over its own values
    for i in (1, 2):
        torch.testing.assert_close(given[i], 0.75 * values[i] + 0.25 * values[0])


def test_value_residual_learned_has_two_lambdas_per_later_layer_and_they_learn():
    model = tiny(plugins=LEARNABLE).train()
    lambdas = {n: p for n, p in model.named_parameters() if n.endswith("value_residual.lambdas")}
    assert sorted(lambdas) == [f"decoder.blocks.{i}.self_attn.plugins.value_residual.lambdas" for i in (1, 2)]
    assert all(torch.equal(p.detach(), torch.tensor([0.5, 0.5])) for p in lambdas.values())
    model(tokens(2, 9)).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lambdas.values())
    off = tiny()
    assert not [n for n, _ in off.named_parameters() if "lambdas" in n]
    assert "decoder.blocks.1.self_attn.plugins.value_residual.lambdas" not in tiny(plugins=FIXED).state_dict()


OPTIONS = [dict(norm="parallel"), dict(norm={"name": "parallel", "shared_norm": False}),
           dict(plugins=LEARNABLE), dict(plugins={**FIXED, "qk_norm": {"type": "rmsnorm"}}, norm="parallel")]


@pytest.mark.parametrize("kind, attention, options", list(itertools.product(
    ["decoder_only", "encoder_decoder"], ["full", {"name": "sliding_window", "window": 4}, "linear"], OPTIONS)))
def test_cached_decoding_equals_the_full_forward(kind, attention, options):
    model = tiny(kind, attention=attention, n_kv_heads=2, **options)
    assert_cached_decoding_equals_full_forward(model, kind, tokens(2, 10), tokens(2, 7, seed=4))


@pytest.mark.parametrize("kind", ["decoder_only", "encoder_decoder"])
@pytest.mark.parametrize("options", [dict(norm="parallel"), dict(plugins=LEARNABLE),
                                     dict(norm="parallel", plugins=FIXED)])
def test_activation_checkpointing_gives_the_same_gradients(kind, options):
    grads = []
    for checkpointing in (False, True):
        model = tiny(kind, activation_checkpointing=checkpointing, **options).train()
        x = tokens(2, 8)
        out = model(x, x) if kind == "encoder_decoder" else model(x)
        out.logsumexp(-1).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        scale = g.abs().max().item()  # relative to the gradient's own size (some are ~1e-2)
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("options,match", [
    (dict(plugins={"value_residual": {"learnable": "yes"}}),
     "plugin=value_residual: option learnable='yes' must be bool"),
    (dict(plugins={"value_residual": {"weight": 1.5}}), r"value_residual: weight=1.5 must be in \[0, 1\]"),
    (dict(norm={"name": "parallel", "shared": True}), "norm=parallel has no option 'shared'")])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=9, **options).validate()
