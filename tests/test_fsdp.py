"""trainer=fsdp (FSDP2 through Lightning's ModelParallelStrategy) as two CPU processes over gloo: every model kind
sharded per block computes what the unsharded model computes; train.py's losses equal a one-process run with the
same global batch; a SIGTERM leaves `status: interrupted` and a checkpoint whose resume equals the uninterrupted
run; evaluate.py reads the run's (consolidated) checkpoint."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import scripts
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_muon_train import free_port
from test_run_safety import ROOT, finish, launch, results, rows, signal_when, train
from test_train_e2e import train_losses

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.launch.shard import shard_model
from archsweep.core.train.monitoring.diagnostic_callbacks import group_grad_norms

pytestmark = pytest.mark.slow  # processes: mp.spawn and train.py subprocesses

SIZES = dict(vocab_size=17, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, activation_checkpointing=True)
KINDS = {"encoder_decoder": {}, "decoder_only": {}, "encoder_only": {"n_classes": 3},
         "vit": {"image_size": 8, "patch_size": 4, "in_channels": 1, "n_classes": 3, "pos": "learned"}}
RUN = ["model=decoder_only", "model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
       "model.dropout=0.0", "model.activation_checkpointing=true", "task.batch_size=8", "task.max_len=8",
       "task.val_batches=2", "task.test_batches=2", "trainer.log_every_n_steps=2", "schedule.warmup_steps=2",
       "logger=csv", "diagnostics.attention_maps=false", "eval.decode_samples=0", "trainer.max_steps=24",
       "trainer.val_check_interval=8"]
FSDP = ["trainer=fsdp", "trainer.devices=2"]


def model_of(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    extra = KINDS[kind]
    sizes = {k: v for k, v in SIZES.items() if not (kind == "vit" and k == "vocab_size")}
    return build_model(ModelConfig(kind=kind, **sizes, **extra)).train()


def inputs(kind: str, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    if kind == "vit":
        return (torch.randn(4, 1, 8, 8, generator=gen),)
    tokens = torch.randint(0, 17, (4, 9), generator=gen)
    return (tokens, tokens) if kind == "encoder_decoder" else (tokens,)


def sharded_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    for kind in KINDS:
        model = model_of(kind)
        blocks = shard_model(model, mesh, bf16=False)
        batch = inputs(kind, torch.Generator().manual_seed(rank))  # each process its own half of the batch
        model(*batch).float().square().mean().backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters() if p.grad is not None}
        norms = {group: float(norm) for group, norm in group_grad_norms(model).items()}  # from each rank's shards
        out[kind, rank] = (blocks, {k: v.clone() for k, v in grads.items()} if rank == 0 else {}, norms)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_grads() -> dict:
    """kind -> (blocks sharded, full gradients, [each rank's per-block gradient norms]) of each kind sharded over two
    processes (one spawn for all)."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(sharded_worker, args=(free_port(), out), nprocs=2, join=True)
        return {kind: (out[kind, 0][0], dict(out[kind, 0][1]), [dict(out[kind, r][2]) for r in range(2)])
                for kind in KINDS}


def unsharded(kind: str) -> torch.nn.Module:
    """The model of `kind` in one process after the backward of the mean loss over both processes' batches."""
    model = model_of(kind)
    halves = [inputs(kind, torch.Generator().manual_seed(rank)) for rank in range(2)]
    loss = sum(model(*half).float().square().mean() for half in halves) / 2  # the mean the processes reduce to
    loss.backward()
    return model


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_sharded_per_block_has_the_unsharded_gradients(kind, sharded_grads):
    blocks, grads, _ = sharded_grads[kind]
    model = unsharded(kind)
    assert blocks == 2 * (2 if kind == "encoder_decoder" else 1)
    expected = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("kind", list(KINDS))
def test_per_block_gradient_norms_from_the_shards_equal_the_unsharded_norms(kind, sharded_grads):
    """The diagnostics' per-block gradient norms (diag/grad_norm/...) under fully_shard: each rank sums the squares
    of its own shards, one all-reduce adds the ranks' sums; every rank gets the one-process model's norms."""
    _, _, norms = sharded_grads[kind]
    expected = {group: float(norm) for group, norm in group_grad_norms(unsharded(kind)).items()}
    assert len(expected) >= 3  # the embeddings and each of the blocks
    for rank_norms in norms:
        assert list(rank_norms) == list(expected)  # the same groups, in model order
        assert rank_norms == pytest.approx(expected, rel=1e-5)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted trainer=fsdp run on two processes."""
    tmp = tmp_path_factory.mktemp("fsdp")
    code, out = train(tmp, *RUN, *FSDP, f"hydra.run.dir={tmp / 'reference'}")
    assert code == 0, out[-3000:]
    return tmp / "reference"


def val_losses(run_dir) -> dict[int, float]:
    return {int(r["step"]): float(r["val/loss"]) for r in rows(run_dir) if r.get("val/loss")}


def test_fsdp_losses_equal_one_process_with_the_same_global_batch(reference, tmp_path):
    # one process, two batches accumulated per step: the batches the two processes draw at each step
    code, out = train(tmp_path, *RUN, "trainer.accumulate_grad_batches=2", f"hydra.run.dir={tmp_path / 'one'}")
    assert code == 0, out[-3000:]
    sharded, one = results(reference), results(tmp_path / "one")
    assert sharded["status"] == "completed" and sharded["world_size"] == 2 and sharded["steps"] == 24
    assert one["world_size"] == 1 and one["steps"] == 24
    assert len(val_losses(reference)) >= 3  # every validation, and the final one
    assert val_losses(reference) == pytest.approx(val_losses(tmp_path / "one"), rel=1e-5)
    assert sharded["test"]["loss"] == pytest.approx(one["test"]["loss"], rel=1e-5)
    assert sharded["val"]["loss"] == pytest.approx(one["val"]["loss"], rel=1e-5)


def test_a_sigterm_leaves_an_interrupted_run_whose_resume_equals_the_uninterrupted_one(reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(tmp_path, *RUN, *FSDP, f"hydra.run.dir={run_dir}", "+callbacks.slow._target_=slowdown.Slow")
    signal_when(proc, run_dir / "train.log", "step 12/24", signal.SIGTERM, timeout=180)
    code, out = finish(proc)
    assert code != 0, out[-3000:]
    res = results(run_dir)
    assert res["status"] == "interrupted" and res["interrupted"]["signal"] == "SIGTERM", out[-3000:]
    assert res["last_checkpoint"] == str(run_dir / "checkpoints" / "last.ckpt")
    step = torch.load(res["last_checkpoint"], weights_only=True)["global_step"]
    assert step == res["interrupted"]["step"] and 12 <= step < 24  # the step in progress, not the last validation
    code, out = train(tmp_path, f"resume={run_dir}")
    assert code == 0, out[-3000:]
    assert results(run_dir)["status"] == "completed" and results(run_dir)["steps"] == 24
    assert train_losses(run_dir) == pytest.approx(train_losses(reference), rel=1e-6)
    assert val_losses(run_dir) == pytest.approx(val_losses(reference), rel=1e-6)


def test_evaluate_reads_the_sharded_run(reference, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = scripts.run([sys.executable, str(ROOT / "evaluate.py"), f"ckpt={reference}", "decode_limit=4"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    written = sorted((reference / "checkpoints").glob("best.eval*.json"))
    assert written, out.stdout[-2000:]
    evaluated = json.loads(written[0].read_text())
    assert evaluated["splits"]["test"]["loss"] == pytest.approx(results(reference)["test"]["loss"], rel=1e-5)


MUP = ["param=mup", "model.param.base_width=16"]  # the run's d_model is 32: every factor of muP is in play


def test_mup_sharded_killed_and_resumed_equals_one_process_and_differs_from_sp(reference, tmp_path):
    """param=mup's rates, initial scales and forward constants are recomputed from the config at every build: a
    trainer=fsdp run stopped by SIGTERM and resumed ends where a one-process run with the same global batch does."""
    one = tmp_path / "one"
    code, out = train(tmp_path, *RUN, *MUP, "trainer.accumulate_grad_batches=2", f"hydra.run.dir={one}")
    assert code == 0, out[-3000:]
    run_dir = tmp_path / "run"
    proc = launch(tmp_path, *RUN, *MUP, *FSDP, f"hydra.run.dir={run_dir}", "+callbacks.slow._target_=slowdown.Slow")
    signal_when(proc, run_dir / "train.log", "step 12/24", signal.SIGTERM, timeout=180)
    code, out = finish(proc)
    assert code != 0 and results(run_dir)["status"] == "interrupted", out[-3000:]
    code, out = train(tmp_path, f"resume={run_dir}")
    assert code == 0, out[-3000:]
    assert results(run_dir)["status"] == "completed" and results(run_dir)["world_size"] == 2
    assert len(val_losses(run_dir)) >= 3
    assert val_losses(run_dir) == pytest.approx(val_losses(one), rel=1e-5)
    assert results(run_dir)["test"]["loss"] == pytest.approx(results(one)["test"]["loss"], rel=1e-5)
    assert val_losses(run_dir) != pytest.approx(val_losses(reference), rel=1e-3)  # muP trained another model
