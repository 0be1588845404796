"""Decoding for `encoder_decoder` and `decoder_only` models: greedy, beam search, and sampling with temperature,
top-k (Fan et al. 2018) and top-p / nucleus (Holtzman et al. 2020). Plain PyTorch.

Every strategy runs through a `_Session` that returns next-token logits; with `use_cache` it feeds only the new
tokens through a KV cache, without it recomputes the whole sequence each step (same tokens, slower: the flag
exists to measure and check the cache). Decoder-only prompts of different lengths are left-padded, with
per-row positions, so that all rows generate in step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from archsweep.core.model.config import STRATEGIES, DecodingConfig  # noqa: F401  (re-exported)
from archsweep.variants.cache import KVCache


@dataclass
class Generation:
    tokens: Tensor  # (B, n_best, N) generated tokens, the end token included, pad_id after it
    scores: Tensor  # (B, n_best) sum of log-probabilities (beam: divided by length ** length_penalty)
    lengths: Tensor  # (B, n_best) generated tokens up to and including the end token


class _Session:
    """Next-token logits for a batch of rows that grow by one token per step.

    Tokens (and, for padded prompts, the keep-mask) live in buffers allocated once for prompt + `max_new`
    tokens, so a step writes one column instead of concatenating the history."""

    def __init__(self, model: nn.Module, inputs: Tensor, mask: Tensor, bos_id: int | None, max_new: int,
                 use_cache: bool) -> None:
        self.model, self.use_cache = model, use_cache
        self.seq2seq = hasattr(model, "decode")
        decoder = getattr(model, "decoder", None)
        self.window = getattr(getattr(decoder, "pos", None), "max_len", None)  # a learned table's length
        self.keep_buf: Tensor | None = None
        if self.seq2seq:
            self.memory, self.src_mask = model.encode(inputs, mask), mask
            prompt = torch.full((inputs.shape[0], 1), bos_id, dtype=inputs.dtype, device=inputs.device)
            self.padded = False
            if self.window is not None and 1 + max_new > self.window:
                raise ValueError(f"decoding.max_new_tokens={max_new} does not fit the decoder's learned position "
                                 f"table (max_seq_len={self.window}, one position taken by BOS); lower it to "
                                 f"{self.window - 1}")
        else:
            prompt, keep = left_align(inputs, mask)  # (B, P)
            self.padded = bool((~mask).any())  # once, on the prompts: no padding lets SDPA use its causal kernel
            if self.padded:  # generated tokens are all real: the mask's tail is True from the start
                self.keep_buf = torch.ones(prompt.shape[0], prompt.shape[1] + max_new, dtype=torch.bool,
                                           device=prompt.device)
                self.keep_buf[:, :prompt.shape[1]] = keep
        total = prompt.shape[1] + max_new
        self.buf = prompt.new_empty(prompt.shape[0], total)
        self.buf[:, :prompt.shape[1]] = prompt
        self.n = prompt.shape[1]  # tokens so far
        self.cache = KVCache(min(total, self.window or total)) if use_cache else None
        self.fed = 0  # tokens already in the cache

    @property
    def tokens(self) -> Tensor:
        return self.buf[:, :self.n]  # (B, n)

    @property
    def keep(self) -> Tensor | None:
        return self.keep_buf[:, :self.n] if self.keep_buf is not None else None

    def logits(self) -> Tensor:
        """Logits (B, V) for the token after the current sequence."""
        if self.seq2seq:
            new = self.buf[:, self.fed:self.n] if self.cache is not None else self.tokens
            out = self.model.decode(new, self.memory, self.src_mask, cache=self.cache)
        else:
            out = self._decoder_only_logits()
        self.fed = self.n
        return out[:, -1].float()

    def _decoder_only_logits(self) -> Tensor:
        tokens, keep, cache = self.tokens, self.keep, self.cache
        if self.window is not None and self.n > self.window:
            # past a learned position table: condition on the last `window` tokens, as nanoGPT crops its context;
            # the window moves every step, so from here on each step recomputes it without the cache
            tokens, cache = tokens[:, -self.window:], None
            keep = keep[:, -self.window:] if keep is not None else None
            self.cache = None
        new = tokens[:, self.fed:] if cache is not None else tokens
        positions = None
        if self.padded:
            positions = (keep.cumsum(1) - 1).clamp(min=0)[:, -new.shape[1]:]  # (B, new) per-row positions
        return self.model(new, pad_mask=keep, positions=positions, cache=cache)

    def append(self, next_tokens: Tensor) -> None:
        self.buf[:, self.n] = next_tokens
        self.n += 1

    def reorder(self, index: Tensor) -> None:
        self.buf = self.buf.index_select(0, index)
        if self.keep_buf is not None:
            self.keep_buf = self.keep_buf.index_select(0, index)
        if self.seq2seq:
            self.memory, self.src_mask = self.memory.index_select(0, index), self.src_mask.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)


def left_align(tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens to the right end (left padding); returns tokens and keep-mask."""
    order = torch.argsort(mask.long(), dim=1, stable=True)  # pads first, real tokens keep their order
    return tokens.gather(1, order), mask.gather(1, order)


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set to -inf every logit outside the top-k and outside the top-p nucleus (the best token always stays)."""
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # mass before this token already reaches p
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


@torch.inference_mode()
def generate(model: nn.Module, inputs: Tensor, mask: Tensor | None, cfg: DecodingConfig, *, eos_id: int,
             pad_id: int, bos_id: int | None = None) -> Generation:
    """Decode from `inputs` (B, L): the source for encoder_decoder, the prompts for decoder_only. `mask` (B, L) is
    True at real tokens (None: no padding); padding may be on either side. encoder_decoder needs `bos_id`."""
    cfg.validate()
    if hasattr(model, "classify"):
        raise ValueError("generation needs an encoder_decoder or decoder_only model; encoder_only models are "
                         "bidirectional and do not generate")
    if hasattr(model, "decode") and bos_id is None:
        raise ValueError("bos_id is required to start the decoder of an encoder_decoder model")
    was_training = model.training
    model.eval()
    mask = mask if mask is not None else torch.ones_like(inputs, dtype=torch.bool)
    try:
        if cfg.strategy == "beam":
            return _beam(model, inputs, mask, cfg, eos_id, pad_id, bos_id)
        return _greedy_or_sample(model, inputs, mask, cfg, eos_id, pad_id, bos_id)
    finally:
        model.train(was_training)


def _greedy_or_sample(model, inputs, mask, cfg, eos_id, pad_id, bos_id) -> Generation:
    session = _Session(model, inputs, mask, bos_id, cfg.max_new_tokens, cfg.use_cache)
    start = session.tokens.shape[1]
    b = inputs.shape[0]
    generator = None
    if cfg.strategy == "sample":
        generator = torch.Generator(device=inputs.device)
        generator.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
    finished = torch.zeros(b, dtype=torch.bool, device=inputs.device)
    n_finished = 0  # rows that produced the end token (read once per step: the step's one host sync)
    scores = torch.zeros(b, device=inputs.device)
    for _ in range(cfg.max_new_tokens):
        logprobs = session.logits().log_softmax(-1)  # (B, V)
        if generator is None:
            best, nxt = logprobs.max(-1)  # the first maximal index, as argmax; its log-probability with it
        else:
            probs = filter_logits(logprobs / cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            best = logprobs.gather(1, nxt[:, None]).squeeze(1)
        if n_finished:  # finished rows score nothing more and continue with padding
            best, nxt = best.masked_fill_(finished, 0.0), nxt.masked_fill_(finished, pad_id)
        scores += best
        session.append(nxt)
        finished |= nxt == eos_id
        n_finished = int(finished.sum())
        if n_finished == b:
            break
    out = session.tokens[:, start:]
    lengths = _lengths(out, eos_id, pad_id)
    return Generation(out[:, None], scores[:, None], lengths[:, None])


def _lengths(out: Tensor, eos_id: int, pad_id: int) -> Tensor:
    """Tokens up to and including the first end token (all tokens when none)."""
    is_eos = out == eos_id
    first = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, torch.full_like(out[:, 0], out.shape[1]))
    return first.long()


def _beam(model, inputs, mask, cfg, eos_id, pad_id, bos_id) -> Generation:
    """Batched beam search. Each step ranks the 2K best extensions of the K live beams by summed log-probability;
    an extension ending in the end token becomes a finished hypothesis (scored with the length penalty) when it
    ranks among the top K, the best K others live on. An input is done when it has K finished hypotheses and no
    live beam can still beat the worst of them."""
    b, k = inputs.shape[0], cfg.beam_size
    rows = torch.arange(b, device=inputs.device).repeat_interleave(k)
    session = _Session(model, inputs[rows], mask[rows], bos_id, cfg.max_new_tokens, cfg.use_cache)
    start = session.tokens.shape[1]
    scores = torch.full((b, k), float("-inf"), device=inputs.device)
    scores[:, 0] = 0.0  # one live beam at first, so the K beams do not start as copies
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(b)]
    done = [False] * b
    for step in range(1, cfg.max_new_tokens + 1):
        logprobs = session.logits().log_softmax(-1)  # (B*K, V)
        vocab = logprobs.shape[-1]
        candidates = (scores.view(-1, 1) + logprobs).view(b, k * vocab)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)  # (B, 2K)
        beams, tokens = top_index // vocab, top_index % vocab
        history = session.tokens[:, start:].view(b, k, -1)
        chosen = _select(top_scores.tolist(), beams.tolist(), tokens.tolist(), history, finished, done, cfg,
                         eos_id, step)
        next_scores, next_beams, next_tokens = (torch.tensor(c, device=inputs.device)
                                                for c in zip(*chosen, strict=True))
        scores = next_scores.view(b, k).float()
        session.reorder((torch.arange(b, device=inputs.device)[:, None] * k + next_beams.view(b, k)).view(-1))
        session.append(next_tokens.view(-1))
        if all(done):
            break
    live = session.tokens[:, start:].view(b, k, -1)
    return _best(finished, live, scores, cfg, eos_id, pad_id)


def _select(top_scores, beams, tokens, history, finished, done, cfg, eos_id, step):
    """Bookkeeping of one beam step on the host; returns (score, beam, token) for the B*K live slots."""
    k, chosen = cfg.beam_size, []
    for i in range(len(top_scores)):
        if done[i]:
            chosen += [(float("-inf"), 0, eos_id)] * k  # keep the slots; they are never read again
            continue
        live = []
        for rank, (score, beam, token) in enumerate(zip(top_scores[i], beams[i], tokens[i], strict=True)):
            if token == eos_id:
                if rank < k and score > float("-inf"):
                    seq = torch.cat([history[i, beam], history.new_tensor([eos_id])])
                    finished[i].append((score / step ** cfg.length_penalty, seq))
            elif score > float("-inf"):
                live.append((score, beam, token))
            if len(live) == k:
                break
        live += [(float("-inf"), 0, eos_id)] * (k - len(live))
        chosen += live
        finished[i].sort(key=lambda h: h[0], reverse=True)
        del finished[i][k:]
        best_live = live[0][0] / step ** cfg.length_penalty if live[0][0] > float("-inf") else float("-inf")
        done[i] = len(finished[i]) == k and best_live <= finished[i][-1][0]
    return chosen


def _best(finished, live, scores, cfg, eos_id, pad_id) -> Generation:
    """The n best hypotheses per input; inputs with fewer than n finished ones take their best live beams."""
    b, k, width = live.shape
    out_tokens = torch.full((b, cfg.n_best, width), pad_id, dtype=live.dtype, device=live.device)
    out_scores = torch.full((b, cfg.n_best), float("-inf"), device=live.device)
    lengths = torch.zeros((b, cfg.n_best), dtype=torch.long, device=live.device)
    for i in range(b):
        pool = list(finished[i])
        for j in range(k):
            if scores[i, j] > float("-inf"):
                pool.append((scores[i, j].item() / width ** cfg.length_penalty, live[i, j]))
        pool.sort(key=lambda h: h[0], reverse=True)
        for rank, (score, seq) in enumerate(pool[: cfg.n_best]):
            out_tokens[i, rank, : len(seq)] = seq
            out_scores[i, rank] = score
            lengths[i, rank] = len(seq)
    return Generation(out_tokens, out_scores, lengths)
