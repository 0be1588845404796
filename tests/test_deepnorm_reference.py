"""DeepNorm (norm=deepnorm) against Microsoft's `torchscale` (the DeepNet authors' code) with `deepnorm=True`: an
encoder-decoder built from a local config, our weights copied in, the same logits and the same gradients on
every parameter of both stacks; and the initialisation: which weights are scaled by beta and by how much, with the
fused q/k/v projection given the fans of separate projections (issue 15).

torchscale pins old fairscale and timm releases (timm drags in torchvision, which pins its own torch), so it is
not a dependency of the `test` extra: this module skips when torchscale does not import. To run it:
`pip install --no-deps torchscale==0.3.0 fairscale==0.4.0` (timm is used only for drop path, which is off here; a
stand-in module is put in its place when timm is missing)."""

from __future__ import annotations

import importlib.util
import math
import sys
import types

import pytest
import torch
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.norm.deepnorm import deepnorm_constants
from tests.parity import assert_parity


def import_torchscale():
    if importlib.util.find_spec("torchscale") is None or importlib.util.find_spec("fairscale") is None:
        pytest.skip("torchscale is not installed; pip install --no-deps torchscale==0.3.0 fairscale==0.4.0")
    if "timm" not in sys.modules:
        try:
            import timm  # noqa: F401
        except ImportError:  # torchscale imports timm's drop_path at module level; drop path is off in this test
            layers = types.ModuleType("timm.models.layers")
            layers.drop_path = lambda x, drop_prob=0.0, training=False: x
            sys.modules.update({"timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
                                "timm.models.layers": layers})
    try:
        from torchscale.architecture.config import EncoderDecoderConfig
        from torchscale.architecture.encoder_decoder import EncoderDecoder
    except ImportError as e:
        pytest.skip(f"torchscale does not import ({e}); pip install --no-deps torchscale==0.3.0 fairscale==0.4.0")
    return EncoderDecoderConfig, EncoderDecoder


D, H, F, V = 16, 2, 32, 23


def ours(n_layers: int, n_decoder_layers: int) -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(kind="encoder_decoder", vocab_size=V, d_model=D, n_heads=H, n_layers=n_layers,
                                   n_decoder_layers=n_decoder_layers, d_ff=F, dropout=0.0, norm="deepnorm",
                                   pos="none", ffn="relu", scale_embedding=False, tie_embeddings=True,
                                   share_src_tgt_embeddings=False, output_bias=False)).double()


def reference(n_layers: int, n_decoder_layers: int) -> nn.Module:
    config_cls, model_cls = import_torchscale()
    args = config_cls(encoder_embed_dim=D, encoder_attention_heads=H, encoder_ffn_embed_dim=F,
                      encoder_layers=n_layers, decoder_embed_dim=D, decoder_attention_heads=H,
                      decoder_ffn_embed_dim=F, decoder_layers=n_decoder_layers, activation_fn="relu", dropout=0.0,
                      deepnorm=True, subln=False, no_scale_embedding=True, share_decoder_input_output_embed=True,
                      vocab_size=V)
    torch.manual_seed(0)
    model = model_cls(args, encoder_embed_tokens=nn.Embedding(V, D), decoder_embed_tokens=nn.Embedding(V, D))
    return model.double()


def copy_weights(src: nn.Module, dst: nn.Module) -> dict[str, str]:
    """Our weights into torchscale's model; returns torchscale parameter name -> ours."""
    theirs = dict(dst.named_parameters())
    mapping: dict[str, tuple[str, slice | None]] = {
        "encoder.embed_tokens.weight": ("encoder.embed.weight", None),
        "decoder.embed_tokens.weight": ("decoder.embed.weight", None)}
    for stack in ("encoder", "decoder"):
        for i, _ in enumerate(getattr(src, stack).blocks):
            ours_, ts = f"{stack}.blocks.{i}", f"{stack}.layers.{i}"
            for j, part in enumerate(("q_proj", "k_proj", "v_proj")):
                rows = slice(j * D, (j + 1) * D)
                for kind in ("weight", "bias"):
                    mapping[f"{ts}.self_attn.{part}.{kind}"] = (f"{ours_}.self_attn.qkv_proj.{kind}", rows)
            pairs = {"self_attn.out_proj": "self_attn.out_proj", "self_attn_layer_norm": "attn_res.norm",
                     "ffn.fc1": "ffn.up_proj", "ffn.fc2": "ffn.down_proj", "final_layer_norm": "ffn_res.norm"}
            if stack == "decoder":
                pairs |= {"encoder_attn.q_proj": "cross_attn.q_proj", "encoder_attn.out_proj": "cross_attn.out_proj",
                          "encoder_attn_layer_norm": "cross_res.norm"}
                for j, part in enumerate(("k_proj", "v_proj")):
                    for kind in ("weight", "bias"):
                        mapping[f"{ts}.encoder_attn.{part}.{kind}"] = (f"{ours_}.cross_attn.kv_proj.{kind}",
                                                                       slice(j * D, (j + 1) * D))
            for t, o in pairs.items():
                for kind in ("weight", "bias"):
                    mapping[f"{ts}.{t}.{kind}"] = (f"{ours_}.{o}.{kind}", None)
    mine = dict(src.named_parameters())
    with torch.no_grad():
        for name, param in theirs.items():
            if name == "decoder.output_projection.weight":  # tied to the decoder's embedding
                assert param is theirs["decoder.embed_tokens.weight"]
                continue
            source, rows = mapping[name]  # every torchscale parameter has its counterpart
            param.copy_(mine[source][rows] if rows is not None else mine[source])
    return {t: s for t, (s, _) in mapping.items()}


@pytest.mark.parametrize("n_layers,n_decoder_layers", [(2, 2), (6, 3)])
def test_deepnorm_matches_torchscale_outputs_and_gradients(n_layers, n_decoder_layers):
    model, ref = ours(n_layers, n_decoder_layers), reference(n_layers, n_decoder_layers)
    names = copy_weights(model, ref)
    for stack in ("encoder", "decoder"):  # the residual scale alpha
        alpha, _ = deepnorm_constants(stack, n_layers, n_decoder_layers)
        assert all(layer.alpha == pytest.approx(alpha) for layer in getattr(ref, stack).layers)
        assert all(block.attn_res.alpha == pytest.approx(alpha) for block in getattr(model, stack).blocks)
    torch.manual_seed(1)
    src, tgt = torch.randint(0, V, (3, 7)), torch.randint(0, V, (3, 5))
    logits = model(src, tgt, None, None)  # (B, T, V)
    ref_logits, _ = ref(src, tgt)
    assert_parity(logits, ref_logits)  # torchscale's softmax runs in float32: ~1e-7 relative apart
    weights = torch.randn_like(logits)
    (logits * weights).sum().backward()
    (ref_logits * weights).sum().backward()
    mine = dict(model.named_parameters())
    largest = max(p.grad.abs().max().item() for p in ref.parameters() if p.grad is not None)
    for name, param in ref.named_parameters():
        if name == "decoder.output_projection.weight":
            continue
        source = names[name]
        grad = mine[source].grad
        if "qkv_proj" in source or "kv_proj" in source:
            parts = ("q_proj", "k_proj", "v_proj") if "qkv_proj" in source else ("k_proj", "v_proj")
            j = parts.index(name.split(".")[-2])
            grad = grad[j * D:(j + 1) * D]
        if name.endswith("k_proj.bias"):  # zero exactly: a key bias adds the same q.b to every score of a row
            assert max(grad.abs().max().item(), param.grad.abs().max().item()) < 1e-6 * largest, name
            continue
        assert_parity(grad, param.grad, msg=lambda m, n=name: f"{n}: {m}")  # each relative to its own size


def xavier_std(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


def test_deepnorm_scales_values_outputs_and_ffn_by_beta_and_leaves_queries_and_keys():
    n, m, d, f = 6, 6, 256, 1024
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=50, d_model=d, n_heads=4, n_layers=n,
                                    n_decoder_layers=m, d_ff=f, dropout=0.0, norm="deepnorm", pos="none"))
    for stack in ("encoder", "decoder"):
        _, beta = deepnorm_constants(stack, n, m)
        for block in getattr(model, stack).blocks:
            q, k, v = block.self_attn.qkv_proj.weight.split([d, d, d])
            expected = {"q": (q, 1.0), "k": (k, 1.0), "v": (v, beta), "out": (block.self_attn.out_proj.weight, beta),
                        "up": (block.ffn.up_proj.weight, beta), "down": (block.ffn.down_proj.weight, beta)}
            if stack == "decoder":
                ck, cv = block.cross_attn.kv_proj.weight.chunk(2)
                expected |= {"cross q": (block.cross_attn.q_proj.weight, 1.0), "cross k": (ck, 1.0),
                             "cross v": (cv, beta), "cross out": (block.cross_attn.out_proj.weight, beta)}
            for what, (weight, gain) in expected.items():
                fan_out, fan_in = weight.shape  # a (D, D) part of the fused projection has the fans of one
                std = gain * xavier_std(fan_in, fan_out)
                assert float(weight.detach().std()) == pytest.approx(std, rel=0.05), (stack, what)
