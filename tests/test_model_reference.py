"""Parity with trusted implementations: copy our weights into torch.nn.Transformer and Hugging Face GPT-2, then
compare outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.hf import GPT2 as GPT2Layout
from tests.parity import assert_parity

D, H, FF, LAYERS, VOCAB = 32, 4, 64, 2, 50


def copy_self_attn(ref: nn.MultiheadAttention, ours) -> None:
    ref.in_proj_weight.copy_(ours.qkv_proj.weight)
    ref.in_proj_bias.copy_(ours.qkv_proj.bias)
    ref.out_proj.weight.copy_(ours.out_proj.weight)
    ref.out_proj.bias.copy_(ours.out_proj.bias)


def copy_cross_attn(ref: nn.MultiheadAttention, ours) -> None:
    ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
    ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
    ref.out_proj.weight.copy_(ours.out_proj.weight)
    ref.out_proj.bias.copy_(ours.out_proj.bias)


def copy_linear(ref: nn.Module, ours: nn.Module) -> None:
    ref.load_state_dict(ours.state_dict())


@torch.no_grad()
def copy_into_torch_transformer(model, ref: nn.Transformer) -> None:
    for ref_layer, block in zip(ref.encoder.layers, model.encoder.blocks, strict=True):
        copy_self_attn(ref_layer.self_attn, block.self_attn)
        copy_linear(ref_layer.linear1, block.ffn.up_proj)
        copy_linear(ref_layer.linear2, block.ffn.down_proj)
        copy_linear(ref_layer.norm1, block.attn_res.norm)
        copy_linear(ref_layer.norm2, block.ffn_res.norm)
    for ref_layer, block in zip(ref.decoder.layers, model.decoder.blocks, strict=True):
        copy_self_attn(ref_layer.self_attn, block.self_attn)
        copy_cross_attn(ref_layer.multihead_attn, block.cross_attn)
        copy_linear(ref_layer.linear1, block.ffn.up_proj)
        copy_linear(ref_layer.linear2, block.ffn.down_proj)
        copy_linear(ref_layer.norm1, block.attn_res.norm)
        copy_linear(ref_layer.norm2, block.cross_res.norm)
        copy_linear(ref_layer.norm3, block.ffn_res.norm)
    if model.config.choice("norm") == "pre":
        copy_linear(ref.encoder.norm, model.encoder.final_norm)
        copy_linear(ref.decoder.norm, model.decoder.final_norm)
    else:  # nn.Transformer always adds final norms; the 2017 post-norm model has none
        ref.encoder.norm = nn.Identity()
        ref.decoder.norm = nn.Identity()


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_matches_torch_transformer_with_padding_and_causal_masks(norm):
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=VOCAB, d_model=D, n_heads=H, n_layers=LAYERS,
                                    d_ff=FF, dropout=0.0, norm=norm, pos="sinusoidal", ffn="relu")).eval()
    ref = nn.Transformer(d_model=D, nhead=H, num_encoder_layers=LAYERS, num_decoder_layers=LAYERS,
                         dim_feedforward=FF, dropout=0.0, activation="relu", batch_first=True,
                         norm_first=(norm == "pre")).eval()
    copy_into_torch_transformer(model, ref)

    src = torch.randint(1, VOCAB, (3, 9))
    tgt = torch.randint(1, VOCAB, (3, 7))
    src_mask = torch.ones(3, 9, dtype=torch.bool)
    src_mask[0, 6:] = False  # padded source rows
    src_mask[2, 4:] = False
    tgt_mask = torch.ones(3, 7, dtype=torch.bool)
    tgt_mask[1, 5:] = False

    logits = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    src_x = model.encoder.pos.embed(model.encoder.embed(src), torch.arange(9)[None])
    tgt_x = model.decoder.pos.embed(model.decoder.embed(tgt), torch.arange(7)[None])
    causal = torch.ones(7, 7, dtype=torch.bool).triu(1)  # True = not allowed, as nn.Transformer expects
    hidden = ref(src_x, tgt_x, tgt_mask=causal, src_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask,
                 memory_key_padding_mask=~src_mask)
    ref_logits = model.head(hidden)
    torch.testing.assert_close(logits[tgt_mask], ref_logits[tgt_mask], atol=1e-5, rtol=1e-5)


def gpt2_pair(n_layers: int = 2):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=D, n_layer=n_layers, n_head=H,
                                     n_inner=4 * D, activation_function="gelu_new", resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                     attn_implementation="sdpa")
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(config).eval()
    ours = build_model(ModelConfig(kind="decoder_only", vocab_size=VOCAB, d_model=D, n_heads=H, n_layers=n_layers,
                                   d_ff=4 * D, max_seq_len=32, dropout=0.0, norm="pre", pos="learned",
                                   ffn={"name": "gelu", "approximate": "tanh"},
                                   scale_embedding=False, tie_embeddings=True,
                                   init="gpt2")).eval()
    return ref, ours


@torch.no_grad()
def copy_from_gpt2(ref, ours) -> None:
    """The export/import layout (archsweep.core.model.hf) moves the weights: Conv1D (in, out) to nn.Linear."""
    ours.load_state_dict(GPT2Layout().from_hf(ours.config, ref.state_dict()))


def test_matches_huggingface_gpt2_logits():
    ref, ours = gpt2_pair()
    copy_from_gpt2(ref, ours)
    assert ours.head.weight is ours.decoder.embed.weight  # tied
    tokens = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        assert_parity(ours(tokens), ref(tokens).logits)  # logits ~0.5 (std 0.02 tied embeddings)


def test_matches_huggingface_gpt2_with_left_padding():
    """Left-padded rows with per-row positions give the same logits as GPT-2 given the same attention mask."""
    ref, ours = gpt2_pair()
    copy_from_gpt2(ref, ours)
    tokens = torch.randint(0, VOCAB, (2, 12))
    keep = torch.ones(2, 12, dtype=torch.bool)
    keep[1, :4] = False
    positions = (keep.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ours_logits = ours(tokens, pad_mask=keep, positions=positions)
        ref_logits = ref(tokens, attention_mask=keep.long(), position_ids=positions).logits
    assert_parity(ours_logits[keep], ref_logits[keep])
