"""Learning tests: tiny models overfit one fixed batch (the loss and the gradients really connect)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.model.decoder_only import pack_prefix_lm

PAD, BOS, EOS, SEP, VOCAB = 0, 1, 2, 3, 16


def reversal_batch(b: int = 8, n: int = 6):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (b, n), generator=g)
    tgt = torch.cat([src.flip(1), torch.full((b, 1), EOS)], dim=1)
    return src, tgt


def fit(model, loss_fn, steps: int = 150, lr: float = 3e-3) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("norm, pos", [("post", "sinusoidal"), ("pre", "relative")])
def test_tiny_encoder_decoder_overfits_one_batch(norm, pos):
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2,
                                    d_ff=64, dropout=0.0, norm=norm, pos=pos))
    src, tgt = reversal_batch()
    tgt_in = torch.cat([torch.full((src.shape[0], 1), BOS), tgt[:, :-1]], dim=1)

    def loss_fn():
        return F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt.flatten())

    assert fit(model, loss_fn) < 0.05
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(src, tgt_in).argmax(-1), tgt)


@pytest.mark.parametrize("pos, attention", [("learned", "full"), ("rotary", "full"), ("shaw", "full"),
                                             ("deberta", "full"), ("xpos", "full"),
                                             ("rotary", {"name": "sliding_window", "window": 6}),
                                             ("rotary", "linear"), ("rotary", "performer")])
def test_tiny_decoder_only_overfits_one_batch_as_prefix_lm(pos, attention):
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2,
                                    d_ff=64, dropout=0.0, norm="pre", pos=pos, max_seq_len=32, attention=attention))
    src, tgt = reversal_batch()
    ones = torch.ones_like
    tokens, labels, pad_mask = pack_prefix_lm(src, tgt, ones(src, dtype=torch.bool), ones(tgt, dtype=torch.bool),
                                              SEP, PAD)

    def loss_fn():
        return F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), ignore_index=-100)

    assert fit(model, loss_fn) < 0.05
    model.eval()
    with torch.no_grad():
        predicted = model(tokens).argmax(-1)
    target = labels != -100
    assert torch.equal(predicted[target], labels[target])


def test_pack_prefix_lm_layout():
    src = torch.tensor([[5, 6, 7], [8, 9, PAD]])
    tgt = torch.tensor([[7, 6, 5, EOS], [9, 8, EOS, PAD]])
    tokens, labels, mask = pack_prefix_lm(src, tgt, src != PAD, tgt != PAD, SEP, PAD)
    assert tokens.tolist() == [[5, 6, 7, SEP, 7, 6, 5, EOS], [8, 9, SEP, 9, 8, EOS, PAD, PAD]]
    ignore = -100
    assert labels.tolist() == [[ignore, ignore, ignore, 7, 6, 5, EOS, ignore],
                               [ignore, ignore, 9, 8, EOS, ignore, ignore, ignore]]
    assert mask.tolist() == [[True] * 8, [True] * 6 + [False] * 2]
