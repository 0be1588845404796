"""The package's dropout mask (archsweep.variants.dropout), the same on every device and under torch.compile: drop
rate p, kept elements scaled by 1 / (1 - p), gradients through the same mask, no work at p = 0 or in eval, every
element dropped at p = 1, repeatable from a seed. Attention dropout is SDPA's: tests/test_attention_paths.py."""

import pytest
import torch

from archsweep.variants.dropout import apply_dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scaling(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 0.5  # no zeros of its own
    y = apply_dropout(x, p, True)
    dropped = y == 0
    # 10^6 Bernoulli(p) trials: the standard error of the rate is below 5e-4
    assert abs(dropped.float().mean().item() - p) < 3e-3
    torch.testing.assert_close(y[~dropped], x[~dropped] / (1 - p))
    assert abs(y.mean().item() / x.mean().item() - 1) < 3e-3  # unbiased in expectation


def test_odd_sizes_and_dtypes():
    for shape in [(1,), (3, 5), (7, 3, 2)]:
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            x = torch.ones(shape, dtype=dtype)
            y = apply_dropout(x, 0.5, True)
            assert y.shape == x.shape and y.dtype == dtype
            assert set(y.unique().tolist()) <= {0.0, 2.0}


def test_gradient_uses_the_same_mask():
    torch.manual_seed(1)
    x = torch.randn(64, 32, requires_grad=True)
    y = apply_dropout(x, 0.2, True)
    y.sum().backward()
    kept = y.detach() != 0
    torch.testing.assert_close(x.grad, kept.float() / 0.8)


def test_no_work_when_off_and_seeded_repeat():
    x = torch.randn(10, 10)
    assert apply_dropout(x, 0.0, True) is x
    assert apply_dropout(x, 0.5, False) is x
    torch.manual_seed(3)
    a = apply_dropout(x, 0.5, True)
    torch.manual_seed(3)
    torch.testing.assert_close(apply_dropout(x, 0.5, True), a)


def test_everything_dropped_at_one():
    x = torch.randn(6, 5, requires_grad=True)
    y = apply_dropout(x, 1.0, True)
    assert torch.equal(y, torch.zeros_like(x))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_compiled_draws_the_same_mask():
    """Under torch.compile the mask is the same computation on the same random stream as in eager mode."""
    x = torch.rand(37, 11) + 0.5
    torch.manual_seed(7)
    eager = apply_dropout(x, 0.3, True)
    compiled = torch.compile(apply_dropout, backend="aot_eager", fullgraph=True)
    torch.manual_seed(7)
    torch.testing.assert_close(compiled(x, 0.3, True), eager)
