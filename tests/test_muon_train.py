"""Muon in training: under DDP every process makes the same update (the gradients are all-reduced before the step),
train.py trains with optim=muon on two gloo processes, a resumed run continues the uninterrupted one exactly, and
torch.compile runs the new model options."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_muon import MUON  # conf/optim/muon.yaml, composed against its schema
from test_train_e2e import TINY, results, train, train_losses
from torch import nn

from archsweep.core.model.build import ModelConfig, build_model
from archsweep.core.train.optimisers.optim import make_optimizer

pytestmark = pytest.mark.slow  # processes, train.py subprocesses, compilation


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(kind="decoder_only", vocab_size=17, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                   dropout=0.0, norm="pre", pos="rotary"))


def ddp_worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(tiny())
    opt = make_optimizer(model.module, MUON)
    gen = torch.Generator().manual_seed(100 + rank)  # each process its own data
    for _ in range(3):
        x = torch.randint(0, 17, (4, 10), generator=gen)
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        out["same"] = torch.equal(gathered[0], gathered[1])
        out["moved"] = not torch.equal(flat, torch.cat([p.flatten() for p in tiny().parameters()]))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_processes_make_identical_muon_updates():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(ddp_worker, args=(free_port(), out), nprocs=2, join=True)
        assert out["moved"] and out["same"]  # different data per process, one all-reduced gradient, one update


def test_train_py_with_muon_on_two_ddp_processes(tmp_path):
    run = tmp_path / "run"
    train(*TINY, "optim=muon", "trainer=ddp", "trainer.accelerator=cpu", "logger=none", f"hydra.run.dir={run}",
          f"output_root={tmp_path}")
    res = results(run)
    assert res["status"] == "completed" and res["world_size"] == 2 and res["steps"] == 20
    losses = train_losses(run)
    assert losses[max(losses)] < losses[min(losses)]


def test_muon_resume_matches_an_uninterrupted_run(tmp_path):
    full, first, rest = tmp_path / "full", tmp_path / "first", tmp_path / "rest"
    common = [*TINY, "optim=muon", "logger=csv", f"output_root={tmp_path}"]
    train(*common, f"hydra.run.dir={full}")
    train(*common, "trainer.max_steps=10", f"hydra.run.dir={first}")
    train(*common, f"ckpt_path={first}", f"hydra.run.dir={rest}")
    uninterrupted, after = train_losses(full), train_losses(rest)
    assert after == {s: v for s, v in uninterrupted.items() if s >= 10}  # momentum buffers and AdamW moments too
    assert results(rest)["val"] == results(full)["val"]


@pytest.mark.parametrize("options", [dict(norm="parallel"), dict(plugins={"value_residual": {"learnable": True}}),
                                     dict(norm={"name": "parallel", "shared_norm": False},
                                          plugins={"value_residual": {"learnable": False}})])
def test_compiled_model_equals_eager(options):
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="decoder_only", vocab_size=17, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                                    dropout=0.0, pos="rotary", **{"norm": "pre", **options}))
    x = torch.randint(0, 17, (2, 9))
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    compiled(x).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())
