"""The train wing's rules across fields (src/core/train/config/rules.py), each on a composed config and its task: what
no single group's schema can see."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from archsweep.core.train.config import rules
from archsweep.core.train.lifecycle.checks import build_task

CONF = Path(__file__).resolve().parents[1] / "conf"


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return cfg, build_task(cfg)


def test_the_default_config_passes_every_rule():
    rules.check_rules(*composed())


def test_a_gpu_asked_for_on_a_machine_without_one_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not rules.gpu_present()
    with pytest.raises(ValueError, match=r"trainer.accelerator=gpu \(trainer=gpu\) but this machine has no visible "
                                         r"GPU .* train on the CPU with trainer=cpu"):
        rules.accelerator_present(*composed("trainer=gpu"))
    rules.accelerator_present(*composed("trainer=cpu"))


def test_a_warmup_longer_than_training_is_a_warning_with_the_fix(caplog):
    with caplog.at_level(logging.WARNING, logger="train"):
        rules.warmup_within_training(*composed("trainer.max_steps=100", "schedule.warmup_steps=500"))
    assert "schedule.warmup_steps=500 exceeds trainer.max_steps=100" in caplog.text
    assert "lower schedule.warmup_steps (e.g. to 10)" in caplog.text


def test_a_budget_that_leaves_the_cosine_no_steps_after_its_warmup_is_refused():
    cfg, task = composed("schedule=cosine", "schedule.warmup_steps=50", "trainer.max_steps=100")
    rules.decay_after_warmup(cfg, task)  # total_steps follows trainer.max_steps
    with open_dict(cfg):
        cfg.trainer.max_steps = 40  # what a small budget sets
    with pytest.raises(ValueError, match=r"schedule.total_steps=40 \(trainer.max_steps=40\) must exceed "
                                         r"schedule.warmup_steps=50; raise the budget"):
        rules.decay_after_warmup(cfg, task)


@pytest.mark.parametrize("devices,nodes,count", [("4", 1, 4), ("[0,1]", 2, 4), ("'0,1,2'", 1, 3), ("auto", 1, None)])
def test_data_parallel_processes_are_devices_times_nodes(devices, nodes, count):
    cfg, _ = composed("trainer=ddp", f"trainer.devices={devices}", f"trainer.num_nodes={nodes}")
    assert rules.processes(cfg.trainer) == count
    assert rules.processes(composed()[0].trainer) is None  # not data parallel


def test_fsdp_counts_its_processes_and_takes_bf16_on_gpus_only(monkeypatch):
    cfg, _ = composed("trainer=fsdp", "trainer.devices=4", "trainer.num_nodes=2")
    assert rules.processes(cfg.trainer) == 8 and rules.data_parallel(cfg.trainer.strategy)
    assert composed("trainer=fsdp", "trainer.accelerator=cpu")[0].trainer.precision == "32-true"
    assert composed("trainer=fsdp", "trainer.accelerator=gpu")[0].trainer.precision == "bf16-mixed"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # auto on a machine without a GPU
    assert composed("trainer=fsdp")[0].trainer.precision == "32-true"


@pytest.mark.parametrize("overrides, message", [
    (["trainer.devices=auto"], r"trainer.devices=auto with trainer.strategy=fsdp2 .* give a number"),
    (["compile=true"], r"compile=true with trainer.strategy=fsdp2 .* drop compile=true, or use trainer=ddp"),
    (["optim=muon"], r"optim=muon with trainer.strategy=fsdp2 .* use trainer=ddp with Muon, or optim=adamw"),
    (["task=shakespeare_char", "model=decoder_only", "eval.context_lengths=[32]"],
     r"eval.context_lengths with trainer.strategy=fsdp2 .* run evaluate.py"),
    (["trainer.precision=16-mixed"], r"trainer.precision=16-mixed with trainer.strategy=fsdp2 .* choose one of "
                                     r"32-true, bf16-mixed, bf16-true"),
    (["schedule=wsd", "schedule.branches=[0.5]"], r"schedule.branches=\[0.5\] with trainer.strategy=fsdp2"),
])
def test_what_fsdp_cannot_shard_is_refused_with_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        rules.check_rules(*composed("trainer=fsdp", *overrides))
    rules.sharding_supports(*composed("trainer=fsdp"))


def test_ddp_validation_needs_a_batch_for_every_process():
    with pytest.raises(ValueError, match=r"task.val_batches=2 is fewer than the 4 data-parallel processes .* set "
                                         r"task.val_batches>=4"):
        rules.ddp_validation_batches(*composed("trainer=ddp", "trainer.devices=4", "task.val_batches=2"))
    rules.ddp_validation_batches(*composed("trainer=ddp", "trainer.devices=2", "task.val_batches=2"))


def test_image_tasks_count_their_validation_batches_by_a_method():
    """The image tasks answer n_batches(split) (a method; the synthetic ones keep a dict): every rule passes them,
    and the data-parallel rule asks the method."""
    cfg, task = composed("model=vit", "task=digits")
    rules.check_rules(cfg, task)
    cfg, task = composed("model=vit", "task=digits", "trainer=ddp", f"trainer.devices={task.n_batches('val') + 1}")
    with pytest.raises(ValueError, match=rf"task.val_batches={task.n_batches('val')} is fewer than the"):
        rules.ddp_validation_batches(cfg, task)


def test_context_lengths_need_a_running_text():
    with pytest.raises(ValueError, match=r"eval.context_lengths: task=reverse is made of separate examples"):
        rules.context_lengths_need_text(*composed("eval.context_lengths=[16,32]"))
    rules.context_lengths_need_text(*composed("eval.context_lengths=[16,32]", "task=shakespeare_char",
                                              "model=decoder_only"))


def test_the_precision_is_checked_against_lightnings_own_list():
    cfg, task = composed("trainer.precision=8-mixed")
    with pytest.raises(ValueError, match=r"trainer.precision='8-mixed' is not a precision Lightning knows; choose "
                                         r"one of .*32-true.*bf16-mixed"):
        rules.precision_known(cfg, task)
    for precision in ("32-true", "bf16-mixed", "16-mixed", "32"):
        rules.precision_known(*composed(f"trainer.precision={precision}"))
