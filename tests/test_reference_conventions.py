"""The two relative-encoding conventions where the papers and their reference code disagree, each checked both ways
against Hugging Face: DeBERTa's position-to-content index (`pos.p2c_index`, microsoft/DeBERTa#162) and YaRN's
frequency ramp (`pos.yarn_ramp`). The default follows the reference code."""

from __future__ import annotations

import math

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.model.legacy import upgrade_model_fields
from archsweep.variants.pos import POS
from archsweep.variants.pos.deberta import Disentangled
from archsweep.variants.pos.rotary import Rotary, yarn_frequencies

transformers = pytest.importorskip("transformers")


def hf_deberta_bias(pos: Disentangled, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Hugging Face DebertaV2's c2p + p2c score terms for our weights: q, k (B, H, T, Dh) -> (B, H, T, T)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    b, h, t, dh = q.shape
    config = transformers.DebertaV2Config(hidden_size=h * dh, num_attention_heads=h, relative_attention=True,
                                          max_relative_positions=pos.k, position_buckets=-1,
                                          pos_att_type=["c2p", "p2c"], share_att_key=False, norm_rel_ebd="none")
    ref = DisentangledSelfAttention(config)
    with torch.no_grad():
        ref.pos_key_proj.weight.copy_(pos.k_rel[0].weight)
        ref.pos_query_proj.weight.copy_(pos.q_rel[0].weight)
        ref.pos_key_proj.bias.zero_()
        ref.pos_query_proj.bias.zero_()
    flat = lambda x: x.reshape(b * h, t, dh)  # noqa: E731  HF's (B H, T, Dh) layout
    score = ref.disentangled_attention_bias(flat(q), flat(k), None, pos.table.weight, scale_factor=3)
    return score.view(b, h, t, t)


@pytest.mark.parametrize("t", [5, 9])  # inside the clipping distance (3), and past it
def test_deberta_p2c_index_code_equals_hugging_face_and_paper_is_the_mirrored_index(t):
    k_max, d_model, h, dh = 3, 12, 3, 4
    torch.manual_seed(0)
    code = Disentangled(d_model, h, dh, n_layers=1, n_decoder_layers=1, role="stack", max_distance=k_max)
    for p in code.parameters():
        torch.nn.init.normal_(p)
    paper = Disentangled(d_model, h, dh, n_layers=1, n_decoder_layers=1, role="stack", max_distance=k_max,
                         p2c_index="paper")
    paper.load_state_dict(code.state_dict())
    q, k = torch.randn(2, h, t, dh), torch.randn(2, h, t, dh)
    qs = q / math.sqrt(3)  # q as rotate_qk hands it over
    with torch.no_grad():
        reference = hf_deberta_bias(code, q, k)
        ours = code.content_bias(qs, k, 0)
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
        # the paper's index differs exactly in the position-to-content term: zero it and the two agree
        assert (paper.content_bias(qs, k, 0) - ours).abs().max() > 1e-2
        code.q_rel[0].weight.zero_()
        paper.q_rel[0].weight.zero_()
        torch.testing.assert_close(paper.content_bias(qs, k, 0), code.content_bias(qs, k, 0))


def hf_yarn(head_dim: int, base: float, factor: float, original: int, beta_fast: float,
            beta_slow: float) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(hidden_size=head_dim, num_attention_heads=1,
                                      max_position_embeddings=int(original * factor),
                                      rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                                                       "original_max_position_embeddings": original,
                                                       "beta_fast": beta_fast, "beta_slow": beta_slow})
    return ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")


@pytest.mark.parametrize("head_dim,base,factor,original,beta_fast,beta_slow", [
    (64, 10000.0, 8.0, 256, 32.0, 1.0), (16, 500.0, 4.0, 64, 16.0, 2.0)])
def test_yarn_ramp_code_equals_hugging_face(head_dim, base, factor, original, beta_fast, beta_slow):
    inv_freq, attention_factor = hf_yarn(head_dim, base, factor, original, beta_fast, beta_slow)
    rope = Rotary(head_dim, base=base, scaling="yarn", factor=factor, original_length=original,
                  beta_fast=beta_fast, beta_slow=beta_slow)
    torch.testing.assert_close(rope.inv_freq, inv_freq, atol=0, rtol=1e-6)
    assert rope.magnitude == pytest.approx(attention_factor)


def test_yarn_ramp_paper_is_linear_in_the_turns_and_differs_from_the_code_in_between():
    head_dim, factor, length = 64, 8.0, 256
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2) / head_dim)
    turns = length * inv_freq / (2 * math.pi)
    paper = Rotary(head_dim, scaling="yarn", factor=factor, original_length=length, yarn_ramp="paper").inv_freq
    code = Rotary(head_dim, scaling="yarn", factor=factor, original_length=length).inv_freq
    middle = (turns < 32) & (turns > 1)
    gamma = (turns - 1) / 31
    relative = dict(rtol=1e-6, atol=0)  # float32 frequencies down to 2e-5: float32's atol of 1e-5 would pass any
    torch.testing.assert_close(paper[middle], (1 - gamma[middle]) * inv_freq[middle] / factor
                               + gamma[middle] * inv_freq[middle], **relative)
    torch.testing.assert_close(paper, yarn_frequencies(inv_freq, factor, length, 32.0, 1.0, "paper"), **relative)
    assert (paper[middle] - code[middle]).abs().max() > 1e-3  # the two ramps are not the same blend
    fast, slow = turns > 40, turns < 0.5  # clear of the rounding of the code's index bounds: both agree
    torch.testing.assert_close(paper[fast | slow], code[fast | slow], **relative)


@pytest.mark.parametrize("pos,option", [("deberta", "p2c_index"), ("rotary", "yarn_ramp")])
def test_the_default_is_the_reference_code_and_a_bad_value_names_the_field(pos, option):
    assert POS.options(POS.get(pos))[option].default == "code"
    cfg = ModelConfig(kind="decoder_only", vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=16,
                      pos={"name": pos, option: "book"})
    with pytest.raises(ValueError, match=rf"pos={pos}: {option}='book' must be code .* or paper"):
        cfg.validate()


def test_a_checkpoint_written_before_the_options_keeps_the_paper_convention_it_was_trained_with():
    old = {"pos": {"name": "deberta", "max_distance": 8}, "d_model": 16}
    assert upgrade_model_fields(old)["pos"] == {"name": "deberta", "max_distance": 8, "p2c_index": "paper"}
    old = {"pos": {"name": "rotary", "base": 10000.0, "scaling": "yarn"}}
    assert upgrade_model_fields(old)["pos"]["yarn_ramp"] == "paper"
    new = {"pos": {"name": "deberta", "max_distance": 8, "p2c_index": "code"}}
    assert upgrade_model_fields(new) == new
    other = {"pos": {"name": "alibi"}}
    assert upgrade_model_fields(other) == other
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=16,
                                    **upgrade_model_fields({"pos": {"name": "deberta", "max_distance": 4}})))
    assert model.decoder.pos.p2c_index == "paper"
