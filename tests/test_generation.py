"""Decoding: greedy, beam and sampling agree where they must, the cache changes nothing but speed, beam search
finds what exhaustive search finds, and a seed reproduces samples."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from archsweep.core.eval.generation import DecodingConfig, generate
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.variants.pos import POS

# encodings of token sequences (an image-only one, sincos2d, is tested with the ViT in test_vit.py)
SEQUENCE_POS = [p for p in POS.names() if not getattr(POS.get(p), "image_only", False)]

PAD, BOS, EOS, VOCAB = 0, 1, 2, 20


def tiny(kind: str, pos: str = "rotary") -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(kind=kind, vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                   max_seq_len=64, dropout=0.0, pos=pos, norm="pre"))


def ragged_inputs():
    x = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 5:] = False
    return x.masked_fill(~mask, PAD), mask


def run(model, cfg: DecodingConfig, x=None, mask=None):
    if x is None:
        x, mask = ragged_inputs()
    return generate(model, x, mask, cfg, eos_id=EOS, pad_id=PAD, bos_id=BOS)


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("pos", SEQUENCE_POS)
def test_cached_and_uncached_decoding_give_the_same_tokens(kind, pos):
    model = tiny(kind, pos)
    for cfg in (DecodingConfig(max_new_tokens=12), DecodingConfig("beam", max_new_tokens=8, beam_size=3, n_best=3)):
        cached = run(model, cfg)
        uncached = run(model, DecodingConfig(**{**cfg.__dict__, "use_cache": False}))
        assert torch.equal(cached.tokens, uncached.tokens)
        torch.testing.assert_close(cached.scores, uncached.scores, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_beam_one_top_k_one_and_tiny_top_p_equal_greedy(kind):
    model = tiny(kind)
    greedy = run(model, DecodingConfig(max_new_tokens=12))
    for cfg in (DecodingConfig("beam", max_new_tokens=12, beam_size=1),
                DecodingConfig("sample", max_new_tokens=12, top_k=1, seed=3),
                DecodingConfig("sample", max_new_tokens=12, top_p=1e-6, seed=3, temperature=2.0)):
        other = run(model, cfg)
        width = greedy.tokens.shape[-1]
        assert torch.equal(other.tokens[..., :width], greedy.tokens), cfg
        assert (other.tokens[..., width:] == PAD).all()


def test_ragged_prompts_decode_as_if_alone():
    model = tiny("decoder_only", "learned")
    x, mask = ragged_inputs()
    batch = run(model, DecodingConfig(max_new_tokens=6), x, mask)
    for i in range(3):
        alone = run(model, DecodingConfig(max_new_tokens=6), x[i:i + 1, : int(mask[i].sum())], None)
        assert torch.equal(batch.tokens[i, 0, : alone.tokens.shape[-1]], alone.tokens[0, 0])


def test_sampling_is_reproducible_with_a_seed():
    model = tiny("decoder_only")
    cfg = DecodingConfig("sample", max_new_tokens=20, temperature=1.5, top_k=10, top_p=0.95, seed=7)
    first, again = run(model, cfg), run(model, cfg)
    assert torch.equal(first.tokens, again.tokens)
    others = [run(model, DecodingConfig(**{**cfg.__dict__, "seed": s})).tokens for s in range(8, 12)]
    assert any(not torch.equal(first.tokens, o) for o in others)


def test_top_k_and_top_p_only_emit_allowed_tokens():
    model = tiny("decoder_only")
    x = torch.randint(3, VOCAB, (64, 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        probs = model(x)[:, -1].softmax(-1)
    top3 = probs.topk(3).indices
    picked = run(model, DecodingConfig("sample", max_new_tokens=1, top_k=3, seed=0), x, None).tokens[:, 0, 0]
    assert (picked[:, None] == top3).any(1).all()
    sorted_probs, order = probs.sort(-1, descending=True)
    nucleus_size = ((sorted_probs.cumsum(-1) - sorted_probs) < 0.5).sum(-1)  # smallest set reaching p=0.5
    picked = run(model, DecodingConfig("sample", max_new_tokens=1, top_p=0.5, seed=0), x, None).tokens[:, 0, 0]
    rank = (order == picked[:, None]).float().argmax(-1)
    assert (rank < nucleus_size).all()


class TableLM(nn.Module):
    """A hand-built decoder whose next-token distribution depends on the generated prefix, given in a table."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], default: dict[int, float]) -> None:
        super().__init__()
        self.table, self.default = table, default

    def distribution(self, prefix: tuple[int, ...]) -> dict[int, float]:
        return self.table.get(prefix, self.default)

    def forward(self, tokens, pad_mask=None, positions=None, cache=None):
        logits = torch.full((tokens.shape[0], tokens.shape[1], 5), -1e9)
        for row in range(tokens.shape[0]):
            prefix = tuple(t for t in tokens[row, 1:].tolist() if t != PAD)
            for token, p in self.distribution(prefix).items():
                logits[row, :, token] = math.log(p)
        return logits


def exhaustive_best(model: TableLM, max_len: int, length_penalty: float):
    best = (float("-inf"), None)
    for n in range(1, max_len + 1):
        for seq in itertools.product([EOS, 3, 4], repeat=n):
            if EOS in seq[:-1] or (seq[-1] != EOS and n < max_len):
                continue
            logp = sum(math.log(model.distribution(seq[:i]).get(t, 1e-30)) for i, t in enumerate(seq))
            best = max(best, (logp / n ** length_penalty, seq))
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_finds_the_exhaustive_optimum_where_greedy_does_not(length_penalty):
    a, b = 3, 4
    model = TableLM({(): {a: 0.5, b: 0.4, EOS: 0.1},
                     (a,): {a: 0.35, b: 0.35, EOS: 0.3},
                     (b,): {EOS: 0.9, a: 0.05, b: 0.05}},
                    default={EOS: 0.6, a: 0.2, b: 0.2})
    prompt = torch.tensor([[BOS]])
    best_score, best_seq = exhaustive_best(model, 4, length_penalty)
    cfg = DecodingConfig("beam", max_new_tokens=4, beam_size=2, n_best=2, length_penalty=length_penalty,
                         use_cache=False)
    beam = generate(model, prompt, None, cfg, eos_id=EOS, pad_id=PAD)
    assert tuple(beam.tokens[0, 0, : beam.lengths[0, 0]].tolist()) == best_seq == (b, EOS)
    assert beam.scores[0, 0].item() == pytest.approx(best_score, rel=1e-5)
    assert beam.scores[0, 0] >= beam.scores[0, 1]
    greedy = generate(model, prompt, None, DecodingConfig(max_new_tokens=4, use_cache=False), eos_id=EOS, pad_id=PAD)
    assert greedy.tokens[0, 0, 0].item() == a  # greedy commits to the locally best first token


def test_beam_returns_n_best_distinct_hypotheses_sorted():
    model = tiny("encoder_decoder", "sinusoidal")
    out = run(model, DecodingConfig("beam", max_new_tokens=6, beam_size=4, n_best=4))
    assert out.tokens.shape[:2] == (3, 4)
    assert (out.scores[:, :-1] >= out.scores[:, 1:]).all()
    for i in range(3):
        seqs = {tuple(out.tokens[i, j, : out.lengths[i, j]].tolist()) for j in range(4)}
        assert len(seqs) == 4


def test_generation_stops_at_end_token_and_pads_after_it():
    model = TableLM({}, default={EOS: 0.9, 3: 0.05, 4: 0.05})
    out = generate(model, torch.tensor([[BOS], [BOS]]), None, DecodingConfig(max_new_tokens=10, use_cache=False),
                   eos_id=EOS, pad_id=PAD)
    assert out.tokens.shape == (2, 1, 1) and (out.tokens == EOS).all() and (out.lengths == 1).all()


@pytest.mark.parametrize("settings, message", [
    ({"strategy": "nucleus"}, r"decoding.strategy='nucleus' is not a known option; valid options: greedy"),
    ({"max_new_tokens": 0}, r"decoding.max_new_tokens=0 must be at least 1"),
    ({"strategy": "beam", "beam_size": 2, "n_best": 3}, r"decoding.n_best=3 must be between 1 and beam_size"),
    ({"strategy": "sample", "temperature": 0.0}, r"decoding.temperature=0.0 must be positive"),
    ({"strategy": "sample", "top_p": 0.0}, r"decoding.top_p=0.0 must be in \(0, 1\]"),
    ({"strategy": "sample", "top_k": -1}, r"decoding.top_k=-1 must be >= 0"),
])
def test_invalid_decoding_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        DecodingConfig(**settings)
    cfg = DecodingConfig()  # changed after it was made: generate checks again
    for key, value in settings.items():
        setattr(cfg, key, value)
    with pytest.raises(ValueError, match=message):
        run(tiny("decoder_only"), cfg)


def test_encoder_only_and_missing_bos_are_refused():
    with pytest.raises(ValueError, match="encoder_only models are bidirectional"):
        run(tiny("encoder_only"), DecodingConfig())
    with pytest.raises(ValueError, match="bos_id is required"):
        generate(tiny("encoder_decoder"), torch.ones(1, 3, dtype=torch.long), None, DecodingConfig(), eos_id=EOS,
                 pad_id=PAD)


CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "decoding").glob("*.yaml")))
@pytest.mark.parametrize("entry", ["generate", "evaluate", "train"])
def test_every_decoding_option_composes_and_decodes(option, entry):
    from hydra import compose, initialize_config_dir

    from archsweep.core.eval.inference import decoding_config

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(entry, overrides=[f"decoding={option}"] + (["ckpt=x"] if entry != "train" else []))
    decoding = decoding_config(cfg.decoding)
    assert decoding.strategy == option
    out = run(tiny("decoder_only"), decoding)
    assert out.tokens.shape[0] == 3 and out.tokens.shape[-1] <= decoding.max_new_tokens


def test_decoder_only_with_a_learned_table_crops_its_context_like_nanogpt():
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2,
                                    d_ff=64, max_seq_len=8, dropout=0.0, pos="learned", norm="pre")).eval()
    prompt = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    never = VOCAB + 1
    cached = generate(model, prompt, None, DecodingConfig(max_new_tokens=12), eos_id=never, pad_id=PAD)
    uncached = generate(model, prompt, None, DecodingConfig(max_new_tokens=12, use_cache=False), eos_id=never,
                        pad_id=PAD)
    assert cached.tokens.shape[-1] == 12 and torch.equal(cached.tokens, uncached.tokens)
    seq = prompt.clone()  # reference: greedy on the last 8 tokens, step by step
    with torch.no_grad():
        for _ in range(12):
            seq = torch.cat([seq, model(seq[:, -8:])[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached.tokens[:, 0], seq[:, 5:])


def test_encoder_decoder_target_longer_than_its_table_is_refused():
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1,
                                    d_ff=32, max_seq_len=8, pos="learned"))
    with pytest.raises(ValueError, match=r"decoding.max_new_tokens=12 does not fit .*\(max_seq_len=8.* lower it to 7"):
        generate(model, torch.ones(1, 3, dtype=torch.long), None, DecodingConfig(max_new_tokens=12), eos_id=EOS,
                 pad_id=PAD, bos_id=BOS)


def test_a_compiled_model_decodes_the_same_tokens():
    """Decoding through torch.compile (as bench/gpu.py decodes, and train.py's compile=true validates a decoder-only
    model) gives the eager tokens and scores, greedy and beam, with and without the cache. The backend runs the
    graphs dynamo captured as they are (no code generation, so the test stays quick) and counts them."""
    model = tiny("decoder_only")
    configs = [DecodingConfig(max_new_tokens=6), DecodingConfig("beam", beam_size=3, max_new_tokens=6),
               DecodingConfig(max_new_tokens=6, use_cache=False)]
    expected = [run(model, cfg) for cfg in configs]
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    model.compile(backend=backend, dynamic=True)
    for cfg, plain in zip(configs, expected, strict=True):
        compiled = run(model, cfg)
        assert torch.equal(compiled.tokens, plain.tokens)
        torch.testing.assert_close(compiled.scores, plain.scores)
    # the prompt, the first cached step, the later ones (the cached length symbolic), the uncached pass: not a graph
    # per new token (there were 8, dynamo's recompile limit, after which it ran the remaining steps eagerly)
    assert 1 <= len(graphs) <= 4, len(graphs)


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "decoding").glob("*.yaml")))
def test_an_evaluation_file_is_named_by_the_settings_that_differ_from_the_option(option):
    """evaluate.py's <ckpt>.eval-<setting>.json: the composed group holds the schema's defaults too, which are
    not differences."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from archsweep.core.eval.inference import setting_name

    def name(*overrides: str) -> str:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("evaluate", overrides=["ckpt=x", f"decoding={option}", *overrides])
        return setting_name(OmegaConf.to_container(cfg.decoding, resolve=True), cfg.decode_limit)

    assert name() == option
    assert name("decoding.max_new_tokens=9", "decode_limit=5") == f"{option}-max_new_tokens9-limit5"
