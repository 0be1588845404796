"""Shared check of the option tests: cached decoding (a 3-token prompt, then one token a step) equals the full
forward, for a causal model or an encoder-decoder."""

from __future__ import annotations

import torch

from archsweep.variants.cache import KVCache


def assert_cached_decoding_equals_full_forward(model: torch.nn.Module, kind: str, x: torch.Tensor,
                                               src: torch.Tensor) -> None:
    cache = KVCache(max_len=x.shape[1])
    with torch.no_grad():
        if kind == "encoder_decoder":
            memory = model.encode(src)
            full = model.decode(x, memory)
            steps = [model.decode(x[:, :3], memory, cache=cache)]
            steps += [model.decode(x[:, i:i + 1], memory, cache=cache) for i in range(3, x.shape[1])]
        else:
            full = model(x)
            steps = [model(x[:, :3], cache=cache)] + [model(x[:, i:i + 1], cache=cache) for i in range(3, x.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
