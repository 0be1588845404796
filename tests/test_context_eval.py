"""Evaluation past the training context: the two windowing modes agree where they must, sliding windows never
lose to non-overlapping ones on a trained model, and the scoring equals the training loop's loss."""

from __future__ import annotations

import math

import pytest
import scripts
import torch
import torch.nn.functional as F

from archsweep.core.eval.context import context_loss, context_table, extrapolation_ratio, windows
from archsweep.core.model.build import ModelConfig, build_model


def markov_text(n: int, vocab: int = 8, seed: int = 0) -> torch.Tensor:
    """An order-2 Markov chain: each token depends on the two before it (context beyond them does not help); one
    fixed chain, `seed` draws the text."""
    table = torch.randint(0, vocab, (vocab, vocab, 2), generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    out = [0, 1]
    choice = torch.randint(0, 2, (n,), generator=g)
    for i in range(n - 2):
        out.append(int(table[out[-2], out[-1], choice[i]]))
    return torch.tensor(out)


def trained_lm(pos: str = "rotary", steps: int = 150) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=8, d_model=32, n_heads=2, n_layers=2, d_ff=64,
                                    dropout=0.0, norm="pre", pos=pos, max_seq_len=32))
    text = markov_text(4000, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, len(text) - 17, (16,), generator=g)
        rows = text[start[:, None] + torch.arange(17)]
        loss = F.cross_entropy(model(rows[:, :-1]).transpose(1, 2), rows[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return trained_lm()


def test_windows_cover_each_target_once():
    starts, new = windows(100, 10, 3)
    assert starts[0] == 0 and starts[-1] + 10 + 1 <= 100 and new == 3
    scored = set(range(1, 11))  # the first window's targets
    for s in starts[1:]:
        targets = set(range(s + 10 - new + 1, s + 10 + 1))
        assert not targets & scored
        scored |= targets
    assert scored == set(range(1, max(scored) + 1))


def test_stride_equal_to_the_window_is_exactly_non_overlapping(model):
    text = markov_text(600, seed=2)
    a = context_loss(model, text, 16, None)
    b = context_loss(model, text, 16, 16)
    assert a["loss"] == b["loss"] and a["tokens"] == b["tokens"] and b["mode"] == "non_overlapping"


def test_sliding_windows_are_never_worse_than_non_overlapping_on_a_trained_model(model):
    text = markov_text(600, seed=2)
    plain = context_loss(model, text, 16, None)
    for stride in (8, 1):
        sliding = context_loss(model, text, 16, stride)
        assert sliding["mode"] == "sliding" and sliding["loss"] <= plain["loss"]
    assert context_loss(model, text, 16, 1)["loss"] < plain["loss"] - 0.01  # early targets lose their context
    assert plain["loss"] < math.log(8) * 0.6  # and the model did learn the chain (its entropy: ln 2)


def test_the_training_length_gives_the_training_loop_loss(model):
    text = markov_text(600, seed=3)
    row = context_loss(model, text, 16, None, batch_size=5)
    starts, _ = windows(len(text), 16, None)
    rows = text[torch.tensor(starts)[:, None] + torch.arange(17)]
    with torch.no_grad():
        expected = F.cross_entropy(model(rows[:, :-1]).transpose(1, 2), rows[:, 1:]).item()
    assert row["loss"] == pytest.approx(expected, rel=1e-6) and row["tokens"] == rows.shape[0] * 16
    assert row["bits_per_token"] == pytest.approx(row["loss"] / math.log(2))


def test_a_learned_table_reports_longer_lengths_as_not_applicable():
    model = trained_lm("learned", steps=1)
    rows = context_table(model, markov_text(300), [16, 32, 64], stride=None)
    assert [r["applicable"] for r in rows] == [True, True, False]
    assert "pos=learned has a table of 32 positions" in rows[2]["reason"]
    assert extrapolation_ratio(rows, 16) == pytest.approx(rows[1]["ppl"] / rows[0]["ppl"])


def test_bits_per_byte_counts_the_bytes_of_the_targets_scored(model):
    text = markov_text(300)
    n_bytes = torch.full((8,), 2)  # every token two bytes
    row = context_loss(model, text, 16, None, token_bytes=n_bytes)
    assert row["bpb"] == pytest.approx(row["bits_per_token"] / 2)
    n_bytes = torch.tensor([1, 2, 3, 4, 1, 2, 3, 4])  # tokens of different sizes: count the targets' bytes by hand
    row = context_loss(model, text, 16, None, token_bytes=n_bytes)
    targets = text[1:row["tokens"] + 1]  # non-overlapping windows of 16 score every target from the second token
    assert row["bpb"] == pytest.approx(row["loss"] * row["tokens"] / math.log(2) / float(n_bytes[targets].sum()))


@pytest.mark.parametrize("lengths,stride,field", [([], None, "context_lengths"), ([0], None, "context_lengths"),
                                                  ([16], 0, "stride")])
def test_bad_settings_are_refused(model, lengths, stride, field):
    with pytest.raises(ValueError, match=field):
        context_table(model, markov_text(100), lengths, stride)


@pytest.mark.slow
def test_evaluate_py_writes_the_by_context_table(tmp_path):
    import json
    import os
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    train = [sys.executable, "train.py", "model=decoder_only", "pos=learned", "task=shakespeare_char",
             "model.max_seq_len=64", "task.block_size=32", "model.d_model=32", "model.n_layers=1",
             "trainer.max_steps=10", "trainer.val_check_interval=5", "task.val_batches=1", "task.test_batches=1",
             "logger=none", f"hydra.run.dir={run}", f"output_root={tmp_path}"]
    out = scripts.run(train, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    evaluate = [sys.executable, "evaluate.py", f"ckpt={run}", "eval.context_lengths=[32,64,128]", "eval.stride=16",
                "eval.context_tokens=2000", f"output={tmp_path / 'eval.json'}"]
    out = scripts.run(evaluate, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "length     64 (sliding, stride 16)" in out.stdout and "length    128: not applicable" in out.stdout
    table = json.loads((tmp_path / "eval.json").read_text())["by_context"]
    assert table["train_length"] == 32 and table["split"] == "test"
    modes = [(r["length"], r.get("mode")) for r in table["rows"]]
    assert modes == [(32, "non_overlapping"), (32, "sliding"), (64, "non_overlapping"), (64, "sliding"), (128, None)]
    assert table["ppl_ratio"] == pytest.approx(table["rows"][2]["ppl"] / table["rows"][0]["ppl"])


@pytest.mark.slow
def test_init_from_fine_tunes_with_another_rope_scaling_and_refuses_other_architectures(tmp_path):
    import os
    import sys
    from pathlib import Path

    from archsweep.core.model.checkpoint import CheckpointError, init_weights_from, load_model

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["model=decoder_only", "pos=rotary", "task=shakespeare_char", "model.d_model=32", "model.n_layers=1",
              "trainer.max_steps=6", "trainer.val_check_interval=3", "task.val_batches=1", "task.test_batches=1",
              "schedule.warmup_steps=1", "logger=none", f"output_root={tmp_path}"]
    first = tmp_path / "first"
    out = scripts.run([sys.executable, "train.py", *common, "task.block_size=32", f"hydra.run.dir={first}"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    tuned = tmp_path / "tuned"
    out = scripts.run([sys.executable, "train.py", *common, "task.block_size=64", "model.pos.scaling=linear",
                          "model.pos.factor=2.0", f"init_from={first}", f"hydra.run.dir={tuned}"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"initialised from the weights of {first}/checkpoints/best.ckpt" in out.stdout + out.stderr
    source = load_model(first / "checkpoints" / "best.ckpt")
    model = build_model(ModelConfig(**{**source.config.to_dict(), "pos": {"name": "rotary", "scaling": "ntk",
                                                                          "factor": 4.0}}))
    init_weights_from(model, first)
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    wider = build_model(ModelConfig(**{**source.config.to_dict(), "d_ff": 16}))
    with pytest.raises(CheckpointError, match="holds weights of another architecture.*shapes differ"):
        init_weights_from(wider, first)
