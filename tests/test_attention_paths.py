"""`attend`, the softmax attention every softmax kind calls, against a plain reference written here:
softmax(q k^T / sqrt(Dh) + mask) v. Exact in eval mode through both of its paths (SDPA, and the explicit one that
recording maps or a score softcap takes), for causal, padded, biased and grouped-query inputs; in training mode the
dropout statistics: the drop rate is p, kept probabilities are scaled by 1 / (1 - p), the mean over many draws is
the eval output. The code is the same on every device, so these CPU tests cover what a GPU runs."""

from __future__ import annotations

import math

import pytest
import torch

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.attention.base import attend
from archsweep.variants.attention.layers import capture_attention
from archsweep.variants.plugins.attn_softcap import AttentionSoftcap

B, H, T, DH = 2, 4, 12, 8


def qkv(h_kv: int = H, t: int = T, dh: int = DH, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, dh, generator=g)  # (B, H, T, Dh)
    k, v = (torch.randn(B, h_kv, t, dh, generator=g) for _ in range(2))  # (B, Hkv, T, Dh)
    return q, k, v


def reference_probs(q, k, causal=False, mask=None, softcap=None):
    """softmax(q k^T / sqrt(Dh) + mask) with keys repeated to the query heads: (B, H, Tq, Tk)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores.softmax(-1)


def reference(q, k, v, causal=False, mask=None, softcap=None):
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return reference_probs(q, k, causal, mask, softcap) @ v


def padded(lengths: list[int], t: int = T) -> torch.Tensor:
    """(B, 1, 1, T) True at the real keys of rows of these lengths."""
    return (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def alibi_like(t: int = T) -> torch.Tensor:
    """A float score bias (1, H, T, T): minus a per-head slope times the distance."""
    distance = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).abs().float()
    return -torch.tensor([0.5, 0.25, 0.125, 0.0625])[:, None, None] * distance


CASES = {  # name -> (key/value heads, is_causal, mask)
    "plain": (H, False, None),
    "causal": (H, True, None),
    "padded": (H, False, padded([T, 7])),
    "causal_padded": (H, False, torch.ones(T, T, dtype=torch.bool).tril() & padded([T, 5])),  # (B, 1, T, T)
    "float_bias": (H, False, alibi_like()),
    "grouped_query": (2, True, None),
    "grouped_query_padded": (1, False, padded([9, T])),
}


@pytest.mark.parametrize("path", ["sdpa", "explicit"])
@pytest.mark.parametrize("case", CASES)
def test_eval_output_equals_the_reference(case, path):
    h_kv, causal, mask = CASES[case]
    q, k, v = qkv(h_kv)
    record = [] if path == "explicit" else None
    out = attend(q, k, v, mask, causal, 0.0, record)
    torch.testing.assert_close(out, reference(q, k, v, causal, mask))
    if record is not None:  # the recorded maps are the probabilities themselves
        assert len(record) == 1
        torch.testing.assert_close(record[0], reference_probs(q, k, causal, mask))


@pytest.mark.parametrize("case", ["causal", "padded", "grouped_query"])
def test_softcap_caps_the_scores_before_the_mask(case):
    h_kv, causal, mask = CASES[case]
    q, k, v = qkv(h_kv)
    q = 4 * q  # scores well above the cap, so capping changes them
    out = attend(q, k, v, mask, causal, 0.0, None, score_mod=AttentionSoftcap(2.0).score_mod)
    torch.testing.assert_close(out, reference(q, k, v, causal, mask, softcap=2.0))
    assert not torch.allclose(out, reference(q, k, v, causal, mask), atol=1e-3)


def test_both_paths_agree_in_a_model():
    """Recording attention maps (explicit path) changes no output of an eval-mode model with attention dropout."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=11, d_model=32, n_heads=4, n_kv_heads=2,
                                    n_layers=2, d_ff=64, max_seq_len=32, dropout=0.3, pos="alibi")).eval()
    x = torch.randint(0, 11, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, 6:] = False
    plain = model(x, pad_mask=mask)
    with capture_attention(model) as maps:
        recorded = model(x, pad_mask=mask)
    assert maps
    torch.testing.assert_close(recorded, plain)


# ---- training mode: dropout of the probabilities -----------------------------------------------------------------


def dropped_probs(p: float, path: str, seed: int, t: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """One training-mode draw of the causal probabilities, read out with v = identity over the keys (Dh = Tk),
    and the exact probabilities: both (B, H, T, T)."""
    q, k, _ = qkv(t=t, dh=t, seed=1)
    eye = torch.eye(t).expand(B, H, t, t)  # output row i = row i of the (dropped, scaled) probabilities
    torch.manual_seed(seed)
    out = attend(q, k, eye, None, True, p, [] if path == "explicit" else None)
    return out, reference_probs(q, k, causal=True)


@pytest.mark.parametrize("path", ["sdpa", "explicit"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_rate_and_scaling(p, path):
    out, probs = dropped_probs(p, path, seed=0)
    visible = probs > 0  # the causal triangle: B * H * T (T + 1) / 2 entries
    n = int(visible.sum())
    dropped = (out == 0) & visible
    rate = dropped.sum().item() / n
    # n Bernoulli(p) trials: the rate's standard error is sqrt(p (1 - p) / n); 5 of them never fail by chance
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n), (rate, p, n)
    kept = visible & ~dropped
    torch.testing.assert_close(out[kept], probs[kept] / (1 - p))
    assert (out[~visible] == 0).all()  # masked keys stay masked


@pytest.mark.parametrize("path", ["sdpa", "explicit"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_mean_over_draws_is_the_eval_output(p, path):
    """Each output is sum_j d_j w_j v_j with d_j in {0, 1 / (1 - p)}: mean w v, variance p / (1 - p) sum_j (w_j v_j)^2.
    Over N draws the deviation of the mean from the eval output, in standard errors, is about N(0, 1)."""
    q, k, v = qkv(h_kv=2, seed=2)
    mask = padded([T, 8])
    exact = reference(q, k, v, mask=mask)
    probs = reference_probs(q, k, mask=mask)
    draws = 400
    torch.manual_seed(3)
    record = [] if path == "explicit" else None
    total = sum(attend(q, k, v, mask, False, p, record) for _ in range(draws))
    mean = total / draws
    v_full = v.repeat_interleave(H // 2, dim=1)
    std_error = (p / (1 - p) * (probs.square() @ v_full.square()) / draws).sqrt()
    z = (mean - exact) / std_error
    assert z.abs().max() < 5.5, z.abs().max()  # B * H * T * Dh = 768 near-normal deviates
    assert abs(z.square().mean().item() - 1) < 0.25  # mean square 1, within 5 standard errors (sqrt(2 / 768))
    assert not torch.allclose(attend(q, k, v, mask, False, p, record), exact)  # a single draw differs


def test_draws_repeat_from_a_seed_and_differ_between_draws():
    q, k, v = qkv()
    torch.manual_seed(5)
    a = attend(q, k, v, None, True, 0.3, None)
    b = attend(q, k, v, None, True, 0.3, None)
    torch.manual_seed(5)
    torch.testing.assert_close(attend(q, k, v, None, True, 0.3, None), a)
    assert not torch.equal(a, b)


def test_no_dropout_in_eval_mode_of_a_layer():
    """A model's attention layers pass dropout only in training mode: eval outputs are deterministic."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=11, d_model=32, n_heads=4, n_layers=1, d_ff=64,
                                    max_seq_len=32, dropout=0.0, attn_dropout=0.5))
    x = torch.randint(0, 11, (2, 10))
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)
