"""Shared check of the parity tests: `assert_parity` compares outputs with a tolerance relative to the size of what
it compares, so a reference whose outputs are ~1e-3 is held as tightly as one whose outputs are ~1.

An absolute `atol=1e-6` beside outputs of 1e-3 lets a 0.1% error through; here the absolute part is
`rtol x max|expected|`, so the check means the same at every scale."""

from __future__ import annotations

import torch


def assert_parity(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, msg: str | None = None) -> None:
    """|actual - expected| <= rtol (|expected| + max|expected|) elementwise, with matching shapes and dtypes."""
    scale = expected.detach().abs().max().item()
    assert scale > 0, "the reference is all zeros: a relative tolerance says nothing"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * scale, msg=msg)
