"""Key/value cache for incremental decoding (Pope et al. 2022 describe why it pays off).

Self-attention keys and values are written into buffers allocated once for `max_len` tokens, so a decoding
step costs no reallocation or copy of the history. Cross-attention keys and values are computed once per
source and kept as they are. Attention kinds that keep something else (a rolling window of keys, a recurrent
state) keep it in `states[layer]`, a dict of tensors with the batch first. With document masking the cache also
keeps the cached tokens' document ids (`doc_ids`), so decoding never attends into another document. `reorder`
selects batch rows (beam search) of all of them.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    def __init__(self, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max_len={max_len} must be a positive number of tokens")
        self.max_len = max_len
        self.length = 0  # tokens already stored (a Python int: no device sync to read it)
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}
        self.states: dict[int, dict[str, Tensor]] = {}  # per layer: what an attention kind keeps instead
        self.doc_ids: Tensor | None = None  # (B, length) documents of the cached tokens (set by the stack), or None

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new (B, Hkv, T, Dh) keys/values after the cached ones; return all keys/values so far."""
        new = k.shape[2]
        end = self.length + new
        if end > self.max_len:
            raise ValueError(f"KV cache holds max_len={self.max_len} tokens but {end} were requested; "
                             f"create the cache with a larger max_len")
        if layer not in self.keys:
            shape = (k.shape[0], k.shape[1], self.max_len, k.shape[3])
            self.keys[layer] = torch.empty(shape, dtype=k.dtype, device=k.device)
            self.values[layer] = torch.empty(shape, dtype=v.dtype, device=v.device)
        keys, values = self.keys[layer], self.values[layer]
        keys.narrow(2, self.length, new).copy_(k)
        values.narrow(2, self.length, new).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)

    def append_latent(self, layer: int, latent: Tensor) -> Tensor:
        """Store a new (B, 1, T, C) per-token latent after the cached ones and return all so far (B, 1, cached + T,
        C): a kind that keeps one tensor per token instead of keys and values (latent attention)."""
        new = latent.shape[2]
        if self.length + new > self.max_len:
            raise ValueError(f"KV cache holds max_len={self.max_len} tokens but {self.length + new} were requested; "
                             f"create the cache with a larger max_len")
        if layer not in self.keys:
            self.keys[layer] = latent.new_empty(latent.shape[0], latent.shape[1], self.max_len, latent.shape[3])
        self.keys[layer].narrow(2, self.length, new).copy_(latent)
        return self.keys[layer].narrow(2, 0, self.length + new)

    def elements_per_token(self) -> dict[int, int]:
        """Per layer, the numbers one cached token holds in the key/value buffers: 2 Hkv Dh for keys and values,
        the latent's width for latent attention (states of other kinds are not per token and are left out)."""
        return {layer: keys.shape[1] * keys.shape[3] + (self.values[layer].shape[1] * self.values[layer].shape[3]
                                                        if layer in self.values else 0)
                for layer, keys in self.keys.items()}

    def advance(self, n: int) -> None:
        """Called by the stack once every layer has appended the step's `n` tokens."""
        self.length += n

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (in that order), e.g. the surviving beams."""
        for store in (self.keys, self.values):
            for layer, buf in store.items():
                store[layer] = buf.index_select(0, index)
        self.cross = {layer: (k.index_select(0, index), v.index_select(0, index))
                      for layer, (k, v) in self.cross.items()}
        self.states = {layer: {name: t.index_select(0, index) for name, t in state.items()}
                       for layer, state in self.states.items()}
        if self.doc_ids is not None:
            self.doc_ids = self.doc_ids.index_select(0, index)

    def nbytes(self) -> int:
        """Memory held by self-attention keys/values and states (cross-attention's fixed source excluded)."""
        tensors = [*self.keys.values(), *self.values.values()]
        tensors += [t for state in self.states.values() for t in state.values()]
        return sum(t.numel() * t.element_size() for t in tensors)
