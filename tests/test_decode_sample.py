"""val/bleu and val/decoded_exact_match decode a fixed random sample drawn across the whole validation split, not
its first (shortest, when batches are sorted by length) examples, and evaluate.py's `decode_limit` decodes the
same sample, so training and evaluate.py agree on the same examples (issue 15)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from archsweep.core.data.codec import codec_from_state, codec_state_for
from archsweep.core.data.tasks.synthetic import ReverseTask
from archsweep.core.eval.evaluation import decode_sample
from archsweep.core.eval.generation import DecodingConfig
from archsweep.core.eval.inference import Loaded, evaluate_split
from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.monitoring.decode_callback import DecodeOnValidation


def sorted_batches(n_batches: int, batch_size: int) -> list[dict]:
    """Batches of a length-sorted split: batch i holds sequences of length i + 1."""
    return [{"labels": torch.full((batch_size, i + 1), 5)} for i in range(n_batches)]


def test_the_sample_spans_the_split_and_is_the_same_every_time():
    batches = sorted_batches(10, 8)
    rows = decode_sample(batches, 16)
    assert sum(len(r) for r in rows) == 16 and rows == decode_sample(batches, 16)
    assert sum(1 for r in rows if r) >= 5  # from many batches, not the first two
    assert rows[-1] or rows[-2] or rows[-3]  # the longest examples are represented
    assert all(r == sorted(set(r)) and all(0 <= i < 8 for i in r) for r in rows)
    assert decode_sample(batches, None) == [list(range(8))] * 10 == decode_sample(batches, 500)


class Recorder:
    """What DecodeOnValidation logs, without Lightning."""

    def __init__(self, model):
        self.model, self.device, self.diverged, self.logged = model, torch.device("cpu"), None, {}

    def log(self, key, value, **kwargs):
        self.logged[key] = value


VALIDATING = SimpleNamespace(sanity_checking=False, state=SimpleNamespace(fn="validate"), loggers=[], global_step=0,
                             is_global_zero=True)


def validate(callback, module, caplog) -> str:
    """What one validation's decoding prints."""
    caplog.clear()
    with caplog.at_level("INFO"):
        callback.on_validation_epoch_end(VALIDATING, module)
    return "\n".join(r.getMessage() for r in caplog.records)


def test_training_and_evaluate_decode_the_same_examples_with_the_same_results(caplog):
    task = ReverseTask(n_symbols=8, min_len=2, max_len=9, batch_size=8, val_batches=5, test_batches=1,
                       eval_seed=3)
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=task.vocab_size, d_model=16, n_heads=2,
                                    n_layers=1, d_ff=32, dropout=0.0)).eval()
    state = codec_state_for(task)
    codec = codec_from_state(state)
    decoding = DecodingConfig(max_new_tokens=12)
    callback = DecodeOnValidation(task, "encoder_decoder", codec, decoding, samples=12, show=100, seed=0,
                                  max_new_tokens=12)  # evaluate.py's bound: decoding.max_new_tokens
    module = Recorder(model)
    printed = validate(callback, module, caplog)
    refs = [line.split("ref: ", 1)[1] for line in printed.splitlines() if " ref: " in line]
    outs = [line.split("out: ", 1)[1] for line in printed.splitlines() if " out: " in line]

    loaded = Loaded(path=None, model=model, kind="encoder_decoder", codec=codec, codec_state=state, config={})
    summary, _, results = evaluate_split(loaded, task, "val", decoding, decode_limit=12, seed=0,
                                         device=torch.device("cpu"))
    assert summary["decoded"] == 12 and summary["n"] == 40 and len(refs) == 12
    assert list(zip(refs, outs, strict=True)) == list(zip(results.references, results.hypotheses, strict=True))
    assert module.logged["val/decoded_exact_match"] == summary["exact_match"] == results.exact_match()
    assert module.logged["val/bleu"] == results.bleu()
    assert len({len(r.split()) for r in refs}) >= 4  # drawn across lengths (2 to 9 symbols)


def tiny_setup():
    task = ReverseTask(n_symbols=8, min_len=2, max_len=9, batch_size=8, val_batches=5, test_batches=1,
                       eval_seed=3)
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="encoder_decoder", vocab_size=task.vocab_size, d_model=16, n_heads=2,
                                    n_layers=1, d_ff=32, dropout=0.0)).eval()
    return task, model, codec_from_state(codec_state_for(task))


class FakeClock:
    """Each reading is `step` seconds after the previous one."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def outputs(printed: str) -> list[str]:
    return [line.split("out: ", 1)[1] for line in printed.splitlines() if " out: " in line]


def test_validation_decodes_no_further_than_the_longest_reference_by_default_and_says_its_bound(caplog):
    task, model, codec = tiny_setup()
    wide = DecodingConfig(max_new_tokens=64)  # an untrained model runs to the limit: 64 tokens before the bound
    callback = DecodeOnValidation(task, "encoder_decoder", codec, wide, samples=12, show=100, seed=0)
    printed = validate(callback, Recorder(model), caplog)
    longest = 9 + 1  # max_len symbols and the end token
    assert f"decoded 12 validation examples (greedy, at most {longest + 1} new tokens)" in printed
    assert outputs(printed) and max(len(o.split()) for o in outputs(printed)) <= longest + 1
    fixed = DecodeOnValidation(task, "encoder_decoder", codec, wide, samples=12, show=100, seed=0, max_new_tokens=3)
    printed = validate(fixed, Recorder(model), caplog)
    assert "(greedy, at most 3 new tokens)" in printed
    assert max(len(o.split()) for o in outputs(printed)) <= 3


def test_a_time_bound_skips_the_rest_of_the_sample_and_says_so(caplog):
    task, model, codec = tiny_setup()
    decoding = DecodingConfig(max_new_tokens=12)
    callback = DecodeOnValidation(task, "encoder_decoder", codec, decoding, samples=12, show=100, seed=0,
                                  time_s=10, clock=FakeClock(6.0))  # read at 6 (start), 12, 18: two batches
    module = Recorder(model)
    printed = validate(callback, module, caplog)
    done = sum(len(r) for r in [r for r in callback.rows if r][:2])
    assert 0 < done < 12
    assert f"decoded {done} of 12 validation examples (greedy, at most" in printed
    assert "time bound eval.decode_time_s=10 reached" in printed
    assert len(outputs(printed)) == done
    unbounded = DecodeOnValidation(task, "encoder_decoder", codec, decoding, samples=12, show=100, seed=0,
                                   time_s=10, clock=FakeClock(0.1))
    printed = validate(unbounded, Recorder(model), caplog)
    assert "decoded 12 validation examples" in printed and "time bound" not in printed
