"""Decoding-based metrics read prompts and references back out of training batches of both kinds."""

from __future__ import annotations

import pytest
import torch

from archsweep.core.data.tasks.batches import decoder_only_batch, encoder_decoder_batch
from archsweep.core.eval.evaluation import (
    DecodeResults,
    decode_batch,
    longest_reference,
    prompts_and_references,
    strip,
)
from archsweep.core.eval.generation import DecodingConfig
from archsweep.core.model.build import ModelConfig, build_model

PAD, BOS, EOS, SEP = 0, 1, 2, 3


def pairs():
    src = torch.tensor([[5, 6, 7], [8, 9, PAD]])
    tgt = torch.tensor([[7, 6, 5, EOS], [9, 8, EOS, PAD]])
    return src, torch.tensor([3, 2]), tgt, torch.tensor([4, 3])


def test_prompts_and_references_from_both_batch_forms():
    src, src_len, tgt, tgt_len = pairs()
    ed = encoder_decoder_batch(src, src_len, tgt, tgt_len, PAD, BOS)
    inputs, mask, refs = prompts_and_references(ed, "encoder_decoder")
    assert torch.equal(inputs, src) and mask.tolist() == [[True] * 3, [True, True, False]]
    assert refs == [[7, 6, 5, EOS], [9, 8, EOS]]
    do = decoder_only_batch(src, src_len, tgt, tgt_len, PAD, SEP)
    inputs, mask, refs = prompts_and_references(do, "decoder_only")
    assert [row[m].tolist() for row, m in zip(inputs, mask, strict=True)] == [[5, 6, 7, SEP], [8, 9, SEP]]
    assert refs == [[7, 6, 5, EOS], [9, 8, EOS]]
    with pytest.raises(ValueError, match="kind=encoder_only does not generate"):
        prompts_and_references(do, "encoder_only")


def test_strip_cuts_at_end_token():
    assert strip([4, PAD, 5, EOS, 6], EOS, PAD) == [4, 5]


class Oracle(torch.nn.Module):
    """A decoder-only 'model' that always predicts the reversal of the prompt before the separator."""

    def forward(self, tokens, pad_mask=None, positions=None, cache=None):
        logits = torch.full((*tokens.shape, 10), -1e4)
        for row in range(tokens.shape[0]):
            seq = [t for t, keep in zip(tokens[row].tolist(), (pad_mask[row] if pad_mask is not None
                                                                 else torch.ones_like(tokens[row])).tolist(),
                                        strict=True) if keep]
            sep = seq.index(SEP)
            answer = seq[:sep][::-1] + [EOS]
            produced = len(seq) - sep - 1
            logits[row, -1, answer[min(produced, len(answer) - 1)]] = 0.0
        return logits


def test_exact_match_and_bleu_from_a_perfect_model():
    src = torch.tensor([[5, 6, 7, 8, 9], [8, 9, 4, 5, PAD]])  # long enough to have 4-grams, which BLEU needs
    tgt = torch.tensor([[9, 8, 7, 6, 5, EOS], [5, 4, 9, 8, EOS, PAD]])
    src_len, tgt_len = torch.tensor([5, 4]), torch.tensor([6, 5])
    batch = decoder_only_batch(src, src_len, tgt, tgt_len, PAD, SEP)
    results = DecodeResults()
    decode_batch(Oracle(), batch, "decoder_only", DecodingConfig(max_new_tokens=1, use_cache=False), pad_id=PAD,
                 bos_id=BOS, eos_id=EOS, to_text=lambda ids, side: " ".join(f"w{i}" for i in ids), results=results)
    assert results.exact_match() == 1.0 and results.total == 2
    assert results.bleu() == pytest.approx(100.0)
    assert results.examples[0] == ("w5 w6 w7 w8 w9", "w9 w8 w7 w6 w5", "w9 w8 w7 w6 w5")


def test_untrained_model_scores_low_and_results_accumulate():
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=10, d_model=16, n_heads=2, n_layers=1,
                                    d_ff=32, dropout=0.0))
    src, src_len, tgt, tgt_len = pairs()
    batch = encoder_decoder_batch(src, src_len, tgt, tgt_len, PAD, BOS)
    results = DecodeResults(keep_examples=1)
    for _ in range(2):
        decode_batch(model, batch, "encoder_decoder", DecodingConfig(), pad_id=PAD, bos_id=BOS, eos_id=EOS,
                     to_text=lambda ids, side: " ".join(map(str, ids)), results=results, limit=1)
    assert results.total == 2 and len(results.examples) == 1
    assert 0.0 <= results.exact_match() <= 1.0 and results.bleu() < 100.0


def test_a_bound_of_the_longest_reference_plus_one_decides_exact_match_and_a_shorter_one_cuts_outputs():
    src = torch.tensor([[5, 6, 7, 8, 9], [8, 9, 4, 5, PAD]])
    tgt = torch.tensor([[9, 8, 7, 6, 5, EOS], [5, 4, 9, 8, EOS, PAD]])
    batch = decoder_only_batch(src, torch.tensor([5, 4]), tgt, torch.tensor([6, 5]), PAD, SEP)
    assert longest_reference(batch) == 6 and longest_reference(batch, rows=[1]) == 5
    words = lambda ids, side: " ".join(f"w{i}" for i in ids)  # noqa: E731
    cfg = DecodingConfig(max_new_tokens=64, use_cache=False)
    enough, cut = DecodeResults(), DecodeResults()
    decode_batch(Oracle(), batch, "decoder_only", cfg, pad_id=PAD, bos_id=BOS, eos_id=EOS, to_text=words,
                 results=enough, max_new_tokens=longest_reference(batch) + 1)
    decode_batch(Oracle(), batch, "decoder_only", cfg, pad_id=PAD, bos_id=BOS, eos_id=EOS, to_text=words,
                 results=cut, max_new_tokens=2)
    assert enough.exact_match() == 1.0
    assert cut.exact_match() == 0.0 and cut.hypotheses == ["w9 w8", "w5 w4"]  # 2 tokens, not decoding's 64
