"""Every option of every config group in conf/ is composed, checked, built and run (STYLE.md, test rule 1).
Options are found by globbing conf/, so a new yaml file is tested without touching this file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import get_class
from omegaconf import OmegaConf

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.model.build import build_model
from archsweep.core.train.job import build_task, check_training, model_config
from archsweep.core.train.loggers import LogRun, finish_wandb, make_loggers
from archsweep.core.train.metrics_csv import MetricsCSV
from archsweep.core.train.optim import make_optimizer, make_scheduler
from archsweep.core.train.setup import ConfigError
from archsweep.variants.model import IMAGE, form_of, kinds_of
from archsweep.variants.pos import POS

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]  # any task's defaults


def options(*groups: str) -> list[str]:
    return [f"{g}={p.stem}" for g in groups for p in sorted((CONF / g).glob("*.yaml"))]


def needs_images(choice: str) -> bool:
    """An option that works on image input only: a kind of the image form, a task that feeds only that form, or
    an encoding laid on a patch grid."""
    group, option = choice.split("=")
    if group == "model":
        return form_of(option) == IMAGE
    if group == "task":
        return get_class(OmegaConf.load(CONF / "task" / f"{option}.yaml")._target_).forms == (IMAGE,)
    return group == "pos" and getattr(POS.get(option), "image_only", False)


@pytest.fixture(scope="module")
def image_file(tmp_path_factory) -> str:
    """A small labelled image set (.npz), for image tasks whose yaml leaves `task.path` to the user."""
    path = tmp_path_factory.mktemp("images") / "images.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 256, (60, 8, 8, 3), dtype=np.uint8), y=np.arange(60) % 3)
    return str(path)


def companions(choice: str, image_file: str, tokens: tuple[str, ...] = ()) -> list[str]:
    """What `choice` is composed with: for image input, the first image kind and an image task (`digits`, or the
    chosen one given `image_file` where its yaml leaves the path to the user); else `tokens`."""
    if not needs_images(choice):
        return list(tokens)
    group, option = choice.split("=")
    out = [] if group == "model" else [f"model={kinds_of((IMAGE,))[0]}"]
    if group != "task":
        return [*out, "task=digits"]
    path = OmegaConf.load(CONF / "task" / f"{option}.yaml").get("path", "given")
    return [*out, *([f"task.path={image_file}"] if path is None else [])]


def compose_train(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_every_group_has_options():
    for group in ["model", "norm", "pos", "ffn", "attention", "task", "optim", "schedule", "trainer", "logger",
                  "callbacks", "experiment"]:
        assert list((CONF / group).glob("*.yaml")), group


@pytest.mark.parametrize("choice", options("model", "norm", "pos", "ffn", "attention", "task", "experiment"))
def test_option_builds_and_runs_forward(choice, image_file):
    cfg = compose_train(choice, *companions(choice, image_file), *TINY)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    check_training(cfg)
    group, option = choice.split("=")
    if group in ("norm", "pos", "ffn", "attention"):
        assert model_cfg.choice(group) == option  # the yaml sets the ModelConfig field of its axis
    if group == "model":
        assert model_cfg.kind == option
    model = build_model(model_cfg)
    batch = next(iter(task.dataloader("train", model_cfg.kind, seed=0)))
    logits = task.forward_fn(model_cfg.kind)(model, batch)
    labels = batch["labels"]
    assert logits.shape == (*labels.shape, model_cfg.vocab_size)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("model", options("model"))
@pytest.mark.parametrize("attention", options("attention"))
def test_every_attention_kind_trains_with_every_model_kind(model, attention, image_file):
    cfg = compose_train(model, attention, *companions(model, image_file, tokens=("task=copy",)), *TINY)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    check_training(cfg)
    assert model_cfg.choice("attention") == attention.split("=")[1]
    net = build_model(model_cfg)
    batch = next(iter(task.dataloader("train", model_cfg.kind, seed=0)))
    logits = task.forward_fn(model_cfg.kind)(net, batch)
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("choice", options("optim", "schedule"))
def test_optimiser_and_schedule_options_step(choice):
    cfg = compose_train(choice, *TINY, "schedule.warmup_steps=4", "trainer.max_steps=20")
    check_training(cfg)
    model = build_model(model_config(cfg, build_task(cfg)))
    optimizer = make_optimizer(model, OmegaConf.to_container(cfg.optim))
    scheduler = make_scheduler(optimizer, OmegaConf.to_container(cfg.schedule, resolve=True))
    lrs = []
    for _ in range(20):
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    peak = cfg.optim.lr
    assert lrs[0] < lrs[2] <= peak + 1e-12  # warm-up rises towards optim.lr
    assert max(lrs) == pytest.approx(peak)
    assert all(0 < lr <= peak + 1e-12 for lr in lrs)


def test_adamw_skips_decay_on_norms_biases_and_embeddings():
    cfg = compose_train(*TINY, "pos=learned")
    model = build_model(model_config(cfg, build_task(cfg)))
    decay, keep = make_optimizer(model, OmegaConf.to_container(cfg.optim)).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    kept = {names[id(p)] for p in keep["params"]}
    assert keep["weight_decay"] == 0.0 and decay["weight_decay"] == cfg.optim.weight_decay
    assert "encoder.embed.weight" in kept and "decoder.pos.table.weight" in kept
    assert all(n.endswith("bias") or "norm" in n or "embed" in n or "pos" in n for n in kept)
    assert all(p.ndim == 2 for p in decay["params"])


@pytest.mark.parametrize("choice", options("trainer"))
def test_trainer_option_makes_a_trainer(choice, tmp_path):
    from archsweep.core.train.fit import make_trainer

    cfg = compose_train(choice)
    if cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if cfg.trainer.strategy == "ddp":
        cfg.trainer.accelerator = "cpu"  # builds the strategy (gloo) without launching processes
    trainer = make_trainer(cfg, [], [], tmp_path)  # as train.py does: our keys (peak_flops, ...) taken out first
    assert trainer.max_steps == cfg.trainer.max_steps
    if cfg.trainer.strategy == "ddp":
        assert trainer.strategy._timeout.total_seconds() == cfg.trainer.collective_timeout_s


@pytest.mark.parametrize("choice", options("logger"))
def test_logger_option_makes_loggers(choice, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train(choice)
    check_training(cfg)
    run = LogRun(tmp_path, "name", "group", ["model=encoder_decoder"], {"seed": 0}, "abcd1234")
    try:
        loggers = make_loggers(OmegaConf.to_container(cfg.logger), run)
    finally:
        finish_wandb()
    kinds = [type(x).__name__ for x in loggers]
    assert isinstance(loggers[0], MetricsCSV)  # the local metrics file, whatever the choice
    expected = {"logger=wandb": ["WandbLogger"], "logger=tensorboard": ["TensorBoardLogger"]}.get(choice, [])
    assert kinds[1:] == expected
    if choice == "logger=wandb":  # the W&B run was started offline in the run directory, under the run's id
        assert loggers[1].version == "abcd1234"
        assert list(tmp_path.glob("wandb/offline-run-*-abcd1234/run-abcd1234.wandb"))
    if choice == "logger=tensorboard":
        assert Path(loggers[1].log_dir) == tmp_path / "tensorboard"


@pytest.mark.parametrize("override, match", [
    ("logger._target_=archsweep.core.train.loggers.wandb_loger",
     r"logger._target_=archsweep.core.train.loggers.wandb_loger cannot be imported \(.*\); name a logger factory"),
    ("logger._partial_=false", r"logger._partial_ must be true: archsweep.core.train.loggers.wandb_logger is called "
                               r"with the run"),
    ("logger.mode=sometimes", r"logger.mode='sometimes' is not a known option"),
])
def test_a_bad_logger_is_refused_naming_the_field(override, match):
    with pytest.raises(ConfigError, match=match):
        check_training(compose_train("logger=wandb", override))
