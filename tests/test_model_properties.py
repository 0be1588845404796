"""Properties every variant must have: causality, padding invariance, KV-cache equivalence, relative encodings
depending only on relative position, the attention-probabilities path equal to the fast path."""

from __future__ import annotations

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.attention.layers import capture_attention
from archsweep.variants.cache import KVCache
from archsweep.variants.norm import NORM
from archsweep.variants.pos import POS
from archsweep.variants.pos.alibi import ALiBi
from archsweep.variants.pos.relative import RelativeBias
from archsweep.variants.pos.rotary import Rotary

# encodings of token sequences (an image-only one, sincos2d, is tested with the ViT in test_vit.py)
SEQUENCE_POS = [p for p in POS.names() if not getattr(POS.get(p), "image_only", False)]

VOCAB, PAD = 23, 0


def tiny(kind: str, pos: str = "sinusoidal", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(kind=kind, vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=64,
               dropout=0.0, pos=pos, norm="pre")
    cfg.update(overrides)
    return build_model(ModelConfig(**cfg)).eval()


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pos", SEQUENCE_POS)
def test_decoder_only_is_causal(pos):
    model = tiny("decoder_only", pos)
    x = tokens(2, 12)
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] % (VOCAB - 1)) + 1  # change every token from position 7 on
    with torch.no_grad():
        a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("pos", SEQUENCE_POS)
def test_encoder_decoder_decoder_is_causal_and_encoder_is_not(pos):
    model = tiny("encoder_decoder", pos)
    src, tgt = tokens(2, 9), tokens(2, 8, seed=2)
    changed_tgt = tgt.clone()
    changed_tgt[:, 5] = (changed_tgt[:, 5] % (VOCAB - 1)) + 1
    changed_src = src.clone()
    changed_src[:, -1] = (changed_src[:, -1] % (VOCAB - 1)) + 1
    with torch.no_grad():
        base = model(src, tgt)
        torch.testing.assert_close(model(src, changed_tgt)[:, :5], base[:, :5])
        assert not torch.allclose(model(changed_src, tgt)[:, 0], base[:, 0])  # every target sees the whole source


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
@pytest.mark.parametrize("pos", SEQUENCE_POS)
def test_appending_padding_leaves_real_outputs_unchanged(kind, pos):
    model = tiny(kind, pos)
    x = tokens(2, 7)
    padded = torch.cat([x, torch.full((2, 5), PAD)], dim=1)
    mask = padded != PAD
    with torch.no_grad():
        if kind == "encoder_decoder":
            y = tokens(2, 6, seed=3)
            y_padded = torch.cat([y, torch.full((2, 3), PAD)], dim=1)
            a = model(x, y)
            b = model(padded, y_padded, src_mask=mask, tgt_mask=y_padded != PAD)[:, :6]
        else:
            a, b = model(x), model(padded, pad_mask=mask)[:, :7]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_encoder_only_classify_ignores_padding_with_mean_pooling():
    model = tiny("encoder_only", "rotary", pooling="mean", n_classes=3)
    x = tokens(2, 6)
    padded = torch.cat([x, torch.full((2, 4), PAD)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model.classify(x), model.classify(padded, pad_mask=padded != PAD))


def decode_with_cache(model, kind, x, chunks, src=None):
    """Feed x in the given chunk sizes through a KV cache; return the concatenated logits."""
    cache = KVCache(max_len=x.shape[1])
    memory = model.encode(src) if kind == "encoder_decoder" else None
    out, start = [], 0
    for size in chunks:
        piece = x[:, start:start + size]
        if kind == "encoder_decoder":
            out.append(model.decode(piece, memory, cache=cache))
        else:
            out.append(model(piece, cache=cache))
        start += size
    assert cache.length == x.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("pos", SEQUENCE_POS)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_kv_cache_decoding_equals_full_forward(kind, pos, norm):
    model = tiny(kind, pos, norm=norm, n_kv_heads=2)
    x, src = tokens(2, 10), tokens(2, 7, seed=4)
    with torch.no_grad():
        full = model(src, x) if kind == "encoder_decoder" else model(x)
        one_by_one = decode_with_cache(model, kind, x, [1] * 10, src)
        chunked = decode_with_cache(model, kind, x, [4, 1, 3, 2], src)  # prefill then mixed chunk sizes
    torch.testing.assert_close(one_by_one, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_cross_attention_keys_are_computed_once_per_source():
    model = tiny("encoder_decoder", "rotary")
    calls = []
    model.decoder.blocks[0].cross_attn.kv_proj.register_forward_hook(lambda *_: calls.append(1))
    cache = KVCache(max_len=5)
    memory = model.encode(tokens(1, 6))
    with torch.no_grad():
        for step in range(5):
            model.decode(tokens(1, 1, seed=step), memory, cache=cache)
    assert len(calls) == 1


def test_kv_cache_with_left_padded_prompts_matches_unpadded():
    model = tiny("decoder_only", "learned")
    prompt = tokens(1, 4)
    padded = torch.cat([torch.full((1, 3), PAD), prompt], dim=1)
    keep = padded != PAD
    positions = (keep.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        reference = model(torch.cat([prompt, tokens(1, 1, seed=9)], dim=1))[:, -1]
        cache = KVCache(max_len=8)
        model(padded, pad_mask=keep, positions=positions, cache=cache)
        step_keep = torch.cat([keep, torch.ones(1, 1, dtype=torch.bool)], dim=1)
        step = model(tokens(1, 1, seed=9), pad_mask=step_keep, positions=positions[:, -1:] + 1, cache=cache)[:, -1]
    torch.testing.assert_close(step, reference, atol=1e-5, rtol=1e-5)


def test_beam_reorder_selects_cache_rows():
    model = tiny("decoder_only", "alibi")
    x = tokens(3, 6)
    with torch.no_grad():
        cache = KVCache(max_len=7)
        model(x, cache=cache)
        cache.reorder(torch.tensor([2, 2, 0]))
        nxt = tokens(3, 1, seed=5)
        stepped = model(nxt, cache=cache)[:, -1]
        expected = model(torch.cat([x[[2, 2, 0]], nxt], dim=1))[:, -1]
    torch.testing.assert_close(stepped, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shift", [1, 17])
def test_rotary_scores_depend_only_on_relative_position(shift):
    rope = Rotary(16)
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    positions = torch.arange(6)[None]
    q0, k0 = rope.rotate_qk(q, k, positions)
    q1, k1 = rope.rotate_qk(q, k, positions + shift)
    torch.testing.assert_close(q0 @ k0.transpose(-1, -2), q1 @ k1.transpose(-1, -2), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("encoding", [ALiBi(4), RelativeBias(4, causal=False), RelativeBias(4, causal=True)])
def test_bias_encodings_depend_only_on_relative_position(encoding):
    cpu = torch.device("cpu")
    full = encoding.attn_bias(9, 9, cpu)
    torch.testing.assert_close(encoding.attn_bias(5, 9, cpu), full[:, :, 4:])  # cached keys: last rows of the full
    bias = encoding.attn_bias(8, 8, cpu)[0]
    for offset in range(-7, 8):  # constant along every diagonal
        diagonal = torch.diagonal(bias, offset=offset, dim1=1, dim2=2)
        torch.testing.assert_close(diagonal, diagonal[:, :1].expand_as(diagonal))


@pytest.mark.parametrize("pos", ["rotary", "none"])
def test_whole_model_is_shift_invariant_under_rotary(pos):
    model = tiny("decoder_only", pos)
    x = tokens(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x, positions=torch.arange(8)[None] + 11), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
@pytest.mark.parametrize("pos", ["sinusoidal", "relative", "alibi"])
def test_attention_probabilities_path_equals_fast_path(kind, pos):
    model = tiny(kind, pos)
    x = torch.cat([tokens(2, 6), torch.full((2, 2), PAD)], dim=1)
    mask = x != PAD
    run = (lambda: model(x, x, src_mask=mask, tgt_mask=mask)) if kind == "encoder_decoder" else (
        lambda: model(x, pad_mask=mask))
    with torch.no_grad():
        fast = run()
        with capture_attention(model) as maps:
            slow = run()
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
    n_attn = {"encoder_decoder": 6, "decoder_only": 2, "encoder_only": 2}[kind]
    assert len(maps) == n_attn and all(len(v) == 1 for v in maps.values())
    for name, (probs,) in maps.items():
        assert probs.shape == (2, 4, 8, 8)
        torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 8))
        assert probs[..., 6:][mask[:, None, :, None].expand(2, 4, 8, 2)].abs().max() == 0  # padded keys unseen
        if "self_attn" in name and kind != "encoder_only" and not name.startswith("encoder."):
            assert probs.triu(1).abs().max() == 0  # causal
    assert all(m.record is None for m in model.modules() if hasattr(m, "record"))  # capture switched off again


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_grouped_query_attention_equals_mha_with_shared_kv_heads(n_kv_heads):
    gqa = tiny("decoder_only", "rotary", n_kv_heads=n_kv_heads)
    mha = tiny("decoder_only", "rotary")
    mha.load_state_dict({k: v for k, v in gqa.state_dict().items() if "qkv_proj" not in k}, strict=False)
    dh, group = 8, 4 // n_kv_heads
    with torch.no_grad():
        for src, dst in zip(gqa.decoder.blocks, mha.decoder.blocks, strict=True):
            q, k, v = src.self_attn.qkv_proj.weight.split([32, n_kv_heads * dh, n_kv_heads * dh])
            bq, bk, bv = src.self_attn.qkv_proj.bias.split([32, n_kv_heads * dh, n_kv_heads * dh])
            expand = lambda w: w.view(n_kv_heads, dh, *w.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)  # noqa
            dst.self_attn.qkv_proj.weight.copy_(torch.cat([q, expand(k), expand(v)]))
            dst.self_attn.qkv_proj.bias.copy_(torch.cat([bq, expand(bk), expand(bv)]))
        x = tokens(2, 9)
        torch.testing.assert_close(gqa(x), mha(x), atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in mha.parameters())


@pytest.mark.parametrize("norm", NORM.names())
def test_activation_checkpointing_gives_same_gradients(norm):
    x = tokens(2, 8)
    grads = []
    for checkpointing in (False, True):
        model = tiny("decoder_only", "rotary", norm=norm, activation_checkpointing=checkpointing).train()
        model(x).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
@pytest.mark.parametrize("pos", SEQUENCE_POS)
def test_bf16_autocast_forward_backward_with_padding(kind, pos):
    model = tiny(kind, pos).train()
    x = tokens(2, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 6:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x, x, mask, mask) if kind == "encoder_decoder" else model(x, pad_mask=mask)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert torch.isfinite(y.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
