"""Synthetic tasks: each target checked against a plain-Python reference, determinism, the test_long split,
kinds refused with a reason, and the classification task's labels."""

from __future__ import annotations

import pytest
import torch

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.data.tasks.addition import AdditionTask
from archsweep.core.data.tasks.is_sorted import IsSortedTask
from archsweep.core.data.tasks.recall import RecallTask
from archsweep.core.data.tasks.synthetic import CopyTask, ReverseTask, SortTask
from archsweep.core.model.config import ModelConfig

SIZES = dict(min_len=2, max_len=6, batch_size=16, val_batches=2, test_batches=2, eval_seed=7)


def make(name: str, **over):
    cls = {"copy": CopyTask, "reverse": ReverseTask, "sort": SortTask, "addition": AdditionTask,
           "recall": RecallTask, "is_sorted": IsSortedTask}[name]
    first = {"addition": {"base": 10}}.get(name, {"n_symbols": 12})
    return cls(**{**first, **SIZES, **over})


def pairs(task, split: str, seed: int = 0):
    """(source ids, target ids without EOS) of every example of the split's first batch."""
    batch = next(iter(task.dataloader(split, "encoder_decoder", seed)))
    out = []
    for src, lab in zip(batch["src"].tolist(), batch["labels"].tolist(), strict=True):
        tgt = [t for t in lab if t != IGNORE_INDEX]
        assert tgt[-1] == task.eos_id and task.eos_id not in tgt[:-1]
        out.append(([s for s in src if s != task.pad_id], tgt[:-1]))
    return out


def reference(task, src: list[int]) -> list[int]:
    if task.name == "copy":
        return src
    if task.name == "reverse":
        return src[::-1]
    if task.name == "sort":
        return sorted(src)
    if task.name == "addition":
        text = task.decode(src)
        a, b = text.split("+")
        return [task.first_symbol + int(d) for d in str(int(a) + int(b))]
    if task.name == "recall":
        keys, values, query = src[0:-2:2], src[1:-2:2], src[-1]
        assert src[-2] == task.query_id and len(set(keys)) == len(keys)
        return [values[keys.index(query)]]
    ordered = all(x <= y for x, y in zip(src, src[1:], strict=False))
    return [task.yes_id if ordered else task.no_id]


NAMES = ["copy", "reverse", "sort", "addition", "recall", "is_sorted"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", ["train", "test_long"])
def test_targets_match_a_python_reference(name, split):
    task = make(name)
    examples = pairs(task, split)
    for src, tgt in examples:
        assert tgt == reference(task, src), task.decode(src)
    if name == "addition":  # carries happen: some sum is longer than both operands, or some digit sum wraps
        sums = [task.decode(s).split("+") for s, _ in examples]
        assert any(len(str(int(a) + int(b))) > max(len(a), len(b)) for a, b in sums)


@pytest.mark.parametrize("name", NAMES)
def test_test_long_is_longer_than_anything_in_training(name):
    task = make(name)
    unit = {"addition": None, "recall": 2}.get(name, 1)

    def length(src):  # the task's notion of length: tokens, digits of the longer operand, or pairs
        if unit is None:
            return max(map(len, task.decode(src).split("+")))
        return (len(src) - 2) // 2 if unit == 2 else len(src)

    train = [length(s) for i in range(3) for s, _ in pairs(task, "train", seed=i)]
    long = [length(s) for s, _ in pairs(task, "test_long")]
    assert max(train) <= task.max_len < min(long) and max(long) <= task.long_max_len == 2 * task.max_len
    batch = next(iter(task.dataloader("test_long", "decoder_only", 0)))
    assert batch["tokens"].shape[1] <= task.max_input_len("decoder_only")


@pytest.mark.parametrize("name", NAMES)
def test_batches_depend_only_on_seed_split_and_index(name):
    task = make(name)
    a = list(task.dataloader("val", "decoder_only", seed=0))
    b = list(task.dataloader("val", "decoder_only", seed=99))  # evaluation data ignore the training seed
    assert len(a) == 2 and all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(a, b, strict=True))
    train0 = iter(task.dataloader("train", "decoder_only", seed=0))
    first = [next(train0)["tokens"] for _ in range(3)]
    resumed = next(iter(task.dataloader("train", "decoder_only", seed=0, start=2)))
    assert torch.equal(resumed["tokens"], first[2])
    other = next(iter(task.dataloader("train", "decoder_only", seed=1)))
    assert not torch.equal(other["tokens"], first[0])


@pytest.mark.parametrize("name", ["addition", "recall"])
def test_encoder_only_is_refused_with_a_reason(name):
    task = make(name)
    cfg = ModelConfig(kind="encoder_only", vocab_size=task.vocab_size, d_model=32, n_heads=2, n_layers=1, d_ff=64)
    with pytest.raises(ValueError, match=f"task={name} cannot feed model kind=encoder_only: its output is not "
                                         f"aligned.*choose model= one of decoder_only, encoder_decoder"):
        task.check_model(cfg)


def test_is_sorted_classifies_with_balanced_honest_labels():
    task = make("is_sorted", max_len=10)
    batch = task.make_batch(5, "encoder_only")
    assert batch["labels"].shape == (16, 1) and set(batch["labels"].flatten().tolist()) <= {0, 1}
    labels = torch.cat([task.make_batch(s, "encoder_only")["labels"] for s in range(20)]).float()
    assert 0.35 < labels.mean() < 0.65  # about half sorted
    for row, label in zip(batch["tokens"].tolist(), batch["labels"][:, 0].tolist(), strict=True):
        assert row[0] == task.bos_id  # read as the classification token
        seq = [t for t in row[1:] if t != task.pad_id]
        assert label == int(all(x <= y for x, y in zip(seq, seq[1:], strict=False)))
    few = make("is_sorted", n_symbols=2, min_len=2, max_len=3)  # many rows of equal tokens: nothing to swap
    for s in range(20):
        tokens = few.make_batch(s, "encoder_only")["tokens"]
        assert int(tokens.max()) < few.first_symbol + 2  # content symbols only, never a sentinel
    cfg = ModelConfig(kind="encoder_only", vocab_size=task.vocab_size, n_classes=3, d_model=32, n_heads=2,
                      n_layers=1, d_ff=64)
    with pytest.raises(ValueError, match="model.n_classes=3 does not match task=is_sorted.*set model.n_classes=2"):
        task.check_model(cfg)


def test_decode_gives_readable_text():
    assert make("addition").decode([4 + 1, 4 + 2, 14, 4 + 9, 2, 0]) == "12+9"
    recall = make("recall")
    assert recall.decode([4, 4 + 12 + 3, recall.query_id, 4]) == "k0 v3 ? k0"
    assert make("copy").decode([1, 4, 7, 2, 9]) == "0 3"  # BOS dropped, stops at EOS


@pytest.mark.parametrize("field, value, message", [
    ("max_len", 1, "task.max_len=1 must be >= task.min_len=2"),
    ("long_max_len", 6, "task.long_max_len=6 must be an integer > task.max_len=6"),
    ("batch_size", 0, "task.batch_size=0 must be a positive integer"),
])
def test_bad_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        make("copy", **{field: value})
    with pytest.raises(ValueError, match="task.long_max_len=40 .* must not exceed task.n_symbols=12"):
        make("recall", max_len=20)


def test_addition_with_reversed_digits_writes_least_significant_first():
    task = make("addition", reverse_digits=True, max_len=8)
    batch = task.make_batch(3, "encoder_decoder")
    for src, lab in zip(batch["src"].tolist(), batch["labels"].tolist(), strict=True):
        a, b = task.decode(src).split("+")
        total = task.decode([t for t in lab if t != IGNORE_INDEX])
        assert int(total[::-1]) == int(a[::-1]) + int(b[::-1]) and not total.endswith("0")
