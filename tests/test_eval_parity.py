"""One evaluation path: the metric classes against hand-computed numbers, their states summed as two DDP
processes would sum them, the checkpoint resolver's rule, and train.py's results.json against evaluate.py on the
same best checkpoint (equal, since both run `archsweep.core.eval.metrics`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scripts
import torch

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.eval.metrics import LengthTable, SplitMetrics, by_length, length_buckets, row_stats
from archsweep.core.model.checkpoint import resolve_checkpoint

ROOT = Path(__file__).resolve().parents[1]
X = IGNORE_INDEX
# (B=3, T=3, V=4) probabilities; logits = log p, so each token's NLL is -log p[label]
PROBS = torch.tensor([
    [[0.1, 0.5, 0.2, 0.2], [0.4, 0.1, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]],  # hit, miss, unlabelled
    [[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7], [0.1, 0.6, 0.2, 0.1]],  # hit, hit, hit
    [[0.1, 0.2, 0.6, 0.1], [0.3, 0.3, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]],  # hit, miss (label 3), unlabelled
])
LABELS = torch.tensor([[1, 2, X], [0, 3, 1], [2, 3, X]])
SRC_LEN = torch.tensor([3, 5, 3])
TOKEN_BYTES = torch.tensor([1, 2, 3, 4])  # UTF-8 bytes of the text each of the 4 ids stands for
P_LABEL = {0: [0.5, 0.25], 1: [0.7, 0.7, 0.6], 2: [0.6, 0.1]}  # p of each labelled token, per row


def nll(*rows: int) -> float:
    return -sum(math.log(p) for r in rows for p in P_LABEL[r])


def stats(rows: slice = slice(None)):
    return row_stats(PROBS[rows].log(), LABELS[rows])


def test_bits_per_byte_against_hand_computed_values():
    metrics = SplitMetrics(TOKEN_BYTES)
    metrics.update(stats(), LABELS)
    n_bytes = 2 + 3 + 1 + 4 + 2 + 3 + 4  # the labelled tokens 1, 2 | 0, 3, 1 | 2, 3
    assert float(metrics.compute()["bpb"]) == pytest.approx(nll(0, 1, 2) / math.log(2) / n_bytes, rel=1e-6)


def test_split_metrics_against_hand_computed_values():
    metrics = SplitMetrics()
    metrics.update(stats())
    got = {k: float(v) for k, v in metrics.compute().items()}
    loss = nll(0, 1, 2) / 7  # 7 labelled tokens
    assert got == pytest.approx({"loss": loss, "ppl": math.exp(loss), "acc": 5 / 7, "exact_match": 1 / 3},
                                rel=1e-6)
    assert int(metrics.exact_match.rows) == 3


def test_length_table_against_hand_computed_values():
    table = LengthTable(max_len=6)
    table.update(stats(), SRC_LEN)
    counts = table.compute()
    assert by_length(counts) == {"3": {"n": 2, "exact_match": 0.0, "acc": 2 / 4},
                                 "5": {"n": 1, "exact_match": 1.0, "acc": 1.0}}
    [(a, b, low), (c, d, high)] = length_buckets(counts, buckets=2)  # lengths 3..5: [3, 4] and [5, 5]
    assert (a, b, c, d) == (3, 4, 5, 5)
    assert low == pytest.approx({"n": 2, "loss": nll(0, 2) / 4, "ppl": math.exp(nll(0, 2) / 4), "acc": 0.5,
                                 "exact_match": 0.0}, rel=1e-6)
    assert high == pytest.approx({"n": 1, "loss": nll(1) / 3, "ppl": math.exp(nll(1) / 3), "acc": 1.0,
                                  "exact_match": 1.0}, rel=1e-6)


def test_length_table_refuses_sources_longer_than_its_size():
    table = LengthTable(max_len=4)
    table.update(stats(), SRC_LEN)  # counting never syncs; the check waits for compute
    with pytest.raises(ValueError, match="1 rows have a source longer than max_len=4"):
        table.compute()


def summed(parts: list, make):
    """A fresh metric whose states are the elementwise sums of `parts`' states: what DDP's sync computes."""
    merged = make()
    for name in merged.metric_state:
        setattr(merged, name, sum(getattr(p, name) for p in parts))
    return merged


@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # merged metrics are never updated
def test_states_of_two_processes_sum_to_the_whole_batch():
    halves = [slice(0, 2), slice(2, 3)]  # uneven, with different source lengths on each "rank"
    whole, ranks = SplitMetrics(TOKEN_BYTES), [SplitMetrics(TOKEN_BYTES) for _ in halves]
    whole.update(stats(), LABELS)
    table, tables = LengthTable(6), [LengthTable(6) for _ in halves]
    table.update(stats(), SRC_LEN)
    for rows, split, t in zip(halves, ranks, tables, strict=True):
        split.update(stats(rows), LABELS[rows])
        t.update(stats(rows), SRC_LEN[rows])
    merged = SplitMetrics(TOKEN_BYTES)
    for name in ("loss", "acc", "exact_match", "bpb"):
        fresh = getattr(SplitMetrics(TOKEN_BYTES), name)  # as a process builds it (bpb holds the bytes table)
        setattr(merged, name, summed([getattr(r, name) for r in ranks], lambda fresh=fresh: fresh))
    assert {k: float(v) for k, v in merged.compute().items()} == {k: float(v) for k, v in whole.compute().items()}
    assert by_length(summed(tables, lambda: LengthTable(6)).compute()) == by_length(table.compute())
    # torchmetrics' own merge (the reduction DDP's sync applies) agrees
    tables[0].merge_state(tables[1])
    assert by_length(tables[0].compute()) == by_length(table.compute())


def _rank(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        rows = [slice(0, 2), slice(2, 3)][rank]
        split, table = SplitMetrics(), LengthTable(6)
        split.update(stats(rows))
        table.update(stats(rows), SRC_LEN[rows])
        got = {k: float(v) for k, v in split.compute().items()}, by_length(table.compute())  # synced by compute
        if rank == 0:
            Path(out).write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_compute_under_two_real_processes_gives_the_whole_batch(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "rank0.json"
    mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", str(out)), nprocs=2)
    split, table = SplitMetrics(), LengthTable(6)
    split.update(stats())
    table.update(stats(), SRC_LEN)
    metrics, lengths = json.loads(out.read_text())
    assert metrics == pytest.approx({k: float(v) for k, v in split.compute().items()}, rel=1e-6)
    assert lengths == by_length(table.compute())


# --- checkpoint resolver --------------------------------------------------------------------------------------

def test_one_rule_picks_the_checkpoint_for_each_purpose(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "last.ckpt").touch()
    run = tmp_path / "run"
    assert resolve_checkpoint(run, "resume") == ckpts / "last.ckpt"
    assert resolve_checkpoint(run, "evaluate") == ckpts / "last.ckpt"  # no best.ckpt: last
    (ckpts / "best.ckpt").touch()
    assert resolve_checkpoint(run, "resume") == ckpts / "last.ckpt"  # resuming continues from the newest state
    assert resolve_checkpoint(run, "evaluate") == ckpts / "best.ckpt"
    assert resolve_checkpoint(ckpts / "last.ckpt", "evaluate") == ckpts / "last.ckpt"  # a file is itself
    with pytest.raises(ValueError, match=r"ckpt_path=.*: no checkpoint file there"):
        resolve_checkpoint(tmp_path, "resume")
    with pytest.raises(ValueError, match=r"ckpt=.*: no checkpoint there"):
        resolve_checkpoint(tmp_path / "missing.ckpt", "evaluate")
    with pytest.raises(ValueError, match="purpose='train' must be one of resume, evaluate"):
        resolve_checkpoint(run, "train")


# --- train.py and evaluate.py agree ---------------------------------------------------------------------------

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64", "task.batch_size=32",
        "task.min_len=1", "task.max_len=4", "task.long_max_len=6", "task.n_symbols=4", "task.val_batches=2",
        "task.test_batches=2", "trainer.max_steps=150", "trainer.val_check_interval=50", "schedule.warmup_steps=10",
        "optim.lr=3e-3", "logger=csv"]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    out = scripts.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_evaluate_reproduces_the_results_of_training(tmp_path, kind):
    run_dir = tmp_path / "run"
    run("train.py", f"model={kind}", *TINY, f"hydra.run.dir={run_dir}", f"output_root={tmp_path}")
    res = json.loads((run_dir / "results.json").read_text())
    best = res["best_checkpoint"]
    assert best == str(run_dir / "checkpoints" / "best.ckpt")
    assert 0 < res["test"]["exact_match"] < 1  # the model has learnt something, so agreement says something
    run("evaluate.py", f"ckpt={best}", "buckets=100")  # one bucket per source length
    report = json.loads(Path(best).with_suffix(".eval.greedy.json").read_text())
    assert report["checkpoint"] == best
    for split in ("test", "test_long"):
        trained, evaluated = res[split], report["splits"][split]
        assert evaluated["n"] == 64 and evaluated["decoded"] == 64
        for key in ("loss", "ppl", "acc"):  # teacher-forced
            assert evaluated[key] == pytest.approx(trained[key], rel=1e-5), (split, key)
        # greedy decoding reproduces a target exactly when every teacher-forced prediction is right (README)
        assert evaluated["exact_match"] == pytest.approx(trained["exact_match"], abs=1e-9)
        rows = {str(r["lengths"][0]): r for r in report["by_length"] if r["split"] == split}
        assert all(r["lengths"][0] == r["lengths"][1] for r in rows.values())
        assert set(rows) == set(res["by_length"][split])
        for length, cell in res["by_length"][split].items():
            assert rows[length]["n"] == cell["n"]
            assert rows[length]["acc"] == pytest.approx(cell["acc"], rel=1e-5)
            assert rows[length]["exact_match"] == pytest.approx(cell["exact_match"], abs=1e-9)
