"""Every option of every config group in conf/ is composed, checked, built and run (STYLE.md, test rule 1).
Options are found by globbing conf/, so a new yaml file is tested without touching this file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class
from omegaconf import OmegaConf
from recording_strategy import record_strategy_arguments
from shard_folders import make_shards

from archsweep.core.data.tasks import IGNORE_INDEX
from archsweep.core.model.build import build_model
from archsweep.core.train.config.diagnostics import DiagnosticsConfig
from archsweep.core.train.config.schemas import SCHEMAS, BudgetSchema, EvalSchema, typed
from archsweep.core.train.config.setup import ConfigError
from archsweep.core.train.lifecycle.checks import build_task, check_training, model_config
from archsweep.core.train.monitoring.loggers import LogRun, finish_wandb, make_loggers
from archsweep.core.train.monitoring.metrics_csv import MetricsCSV
from archsweep.core.train.optimisers.optim import make_optimizer, make_scheduler
from archsweep.variants.model import CAUSAL, IMAGE, form_of, kinds_of
from archsweep.variants.plugins import PLUGIN
from archsweep.variants.plugins.base import CAUSAL_STACK
from archsweep.variants.pos import POS

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"]  # any task's defaults
PLUGINS = PLUGIN.names()  # each plug-in's group is conf/<name>/


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
    chosen one given `image_file` where its yaml leaves the path to the user); for a plug-in that needs a causal
    stack, the first causal kind; else `tokens`."""
    group, option = choice.split("=")
    if group in PLUGINS and option != "none" and CAUSAL_STACK in PLUGIN.get(group).requires:
        return [f"model={kinds_of((CAUSAL,))[0]}", *tokens]
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
    for group in ["model", "norm", "norm_type", "pos", "ffn", "attention", "task", "optim", "schedule", "trainer",
                  "logger", "callbacks", "experiment", *PLUGINS]:
        assert list((CONF / group).glob("*.yaml")), group


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory) -> Path:
    """A token shard folder, for options whose task reads shards and leaves `task.path` to the user."""
    return make_shards(tmp_path_factory.mktemp("tokens") / "corpus", val_docs=200, shard_tokens=10**5)


def shards_given(choice: str, shard_folder: Path, tmp_path: Path, *more: str):
    """`choice` composed; where its task reads token shards (from a folder the user prepares first), with
    `shard_folder` at a small context and batch (a preset's 1024 x 32 rows of a 50k vocabulary would need gigabytes
    of logits)."""
    cfg = compose_train(choice, *more)
    if not cfg.task._target_.endswith(".TokensTask"):
        return cfg
    return compose_train(choice, *more, f"task.path={shard_folder}", f"task.cache_dir={tmp_path}",
                         "task.block_size=32", "task.batch_size=2", "task.val_batches=1", "task.test_batches=1")


@pytest.mark.parametrize("choice", options("model", "norm", "norm_type", "pos", "ffn", "attention", "task",
                                           "experiment", *PLUGINS))
def test_option_builds_and_runs_forward(choice, image_file, shard_folder, tmp_path):
    cfg = shards_given(choice, shard_folder, tmp_path, *companions(choice, image_file), *TINY)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    check_training(cfg)
    group, option = choice.split("=")
    if group in ("norm", "norm_type", "pos", "ffn", "attention"):
        assert model_cfg.choice(group) == option  # the yaml sets the ModelConfig field of its axis
    if group in PLUGINS:  # the yaml sets the plug-in's options (none: leaves it out)
        if option == "none":
            assert group not in model_cfg.plugins
        else:
            expected = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
            assert expected.items() <= model_cfg.plugins[group].items()
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


@pytest.mark.parametrize("model", options("model"))
def test_the_attention_gate_sink_and_dyt_train_with_every_model_kind(model, image_file):
    fields = ["attn_gate=headwise", "attn_sink=learned", "norm_type=dyt"]
    cfg = compose_train(model, *fields, *companions(model, image_file, tokens=("task=copy",)), *TINY)
    task = build_task(cfg)
    model_cfg = model_config(cfg, task)
    check_training(cfg)
    assert model_cfg.plugins == {"attn_gate": {"per": "head"}, "attn_sink": {"learned": True}}
    assert model_cfg.choice("norm_type") == "dyt"
    net = build_model(model_cfg)
    batch = next(iter(task.dataloader("train", model_cfg.kind, seed=0)))
    logits = task.forward_fn(model_cfg.kind)(net, batch)
    F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX).backward()
    learned = {n: p.grad for n, p in net.named_parameters() if n.endswith(("sink.logits", "gate_proj.weight", "alpha"))}
    assert learned and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in learned.values())


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
    floor = peak * cfg.schedule.get("min_lr_ratio", 0.0)  # where a decay ends (wsd: 0, at its last step)
    assert lrs[0] < lrs[2] <= peak + 1e-12  # warm-up rises towards optim.lr
    assert max(lrs) == pytest.approx(peak)
    assert all(0 < lr <= peak + 1e-12 for lr in lrs if lr != floor) and min(lrs) >= floor - 1e-12


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
def test_trainer_option_makes_a_trainer(choice, tmp_path, monkeypatch):
    from archsweep.core.train.lifecycle.trainer import make_trainer

    cfg = compose_train(choice)
    if cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if cfg.trainer.strategy == "ddp":
        cfg.trainer.accelerator = "cpu"  # builds the strategy (gloo) without launching processes
        record_strategy_arguments(monkeypatch, "ddp")
    trainer = make_trainer(cfg, [], [], tmp_path)  # as train.py does: our keys (peak_flops, ...) taken out first
    assert trainer.max_steps == cfg.trainer.max_steps
    if cfg.trainer.strategy == "ddp":
        assert trainer.strategy.arguments["timeout"].total_seconds() == cfg.trainer.collective_timeout_s
    if choice == "fsdp":  # FSDP2 through Lightning's ModelParallelStrategy, one consolidated checkpoint file
        from lightning.pytorch.strategies import ModelParallelStrategy

        assert isinstance(trainer.strategy, ModelParallelStrategy) and cfg.trainer.precision == "32-true"  # CPU


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
    ("logger._target_=archsweep.core.train.monitoring.loggers.wandb_loger",
     r"logger._target_=archsweep.core.train.monitoring.loggers.wandb_loger cannot be imported \(.*\); name a logger "
     r"factory"),
    ("logger._partial_=false",
     r"logger._partial_ must be true: archsweep.core.train.monitoring.loggers.wandb_logger is called with the run"),
    ("logger.mode=sometimes", r"logger.mode='sometimes' is not a known option"),
])
def test_a_bad_logger_is_refused_naming_the_field(override, match):
    with pytest.raises(ConfigError, match=match):
        check_training(compose_train("logger=wandb", override))


SCHEMA_GROUPS = ("optim", "schedule", "decoding", "trainer")  # groups whose options name a schema (schemas.py)


@pytest.mark.parametrize("choice", options(*SCHEMA_GROUPS))
def test_every_option_of_a_schema_group_composes_against_its_schema(choice):
    group, option = choice.split("=")
    node = compose_train(choice)[group]
    schema = OmegaConf.get_type(node)
    assert schema in SCHEMAS.values(), f"conf/{group}/{option}.yaml names no schema in its defaults list"
    settings = typed(node, group)
    assert isinstance(settings, schema)
    yaml_keys = set(OmegaConf.load(CONF / group / f"{option}.yaml")) - {"defaults"}
    assert yaml_keys <= {f.name for f in dataclasses.fields(schema)}


@pytest.mark.parametrize("block,schema", [("eval", EvalSchema), ("budget", BudgetSchema),
                                          ("diagnostics", DiagnosticsConfig)])
def test_train_yaml_blocks_compose_against_their_schemas(block, schema):
    node = compose_train()[block]
    assert OmegaConf.get_type(node) is schema and isinstance(typed(node, block), schema)


@pytest.mark.parametrize("override,key", [("optim.lr=abc", "optim.lr"),
                                          ("schedule.warmup_steps=x", "schedule.warmup_steps"),
                                          ("decoding.beam_size=x", "decoding.beam_size"),
                                          ("eval.decode_samples=all", "eval.decode_samples"),
                                          ("budget.flops=lots", "budget.flops")])
def test_a_value_of_the_wrong_type_is_refused_while_composing(override, key):
    with pytest.raises(ConfigCompositionException) as caught:
        compose_train(override)
    assert f"full_key: {key}" in str(caught.value.__cause__)


def test_a_key_the_schema_lacks_in_an_option_yaml_is_refused(tmp_path):
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "typo.yaml").write_text("defaults:\n  - /schema_optim_adamw@_here_\n  - _self_\n\n"
                                                  "_target_: archsweep.core.train.optimisers.optim.adamw\nname: adamw\n"
                                                  "lr: 1.0e-3\nbetas: [0.9, 0.98]\neps: 1.0e-9\nweight_decay: 0.0\n"
                                                  "weight_decy: 0.1\n")
    with pytest.raises(ConfigCompositionException, match="weight_decy") as caught:
        compose_train(f"hydra.searchpath=[file://{tmp_path}]", "optim=typo")
    assert "Key 'weight_decy' not in 'AdamWSchema'" in str(caught.value.__cause__ or caught.value)


@pytest.mark.parametrize("override,message", [
    ("schedule.warmup_steps=-1", r"schedule.warmup_steps=-1 must be a number of optimiser steps >= 0"),
    ("optim.lr=0", r"optim.lr=0.0 must be a positive learning rate"),
    ("optim.betas=[0.9,1.0]", r"optim.betas=\[0.9, 1.0\] must be two numbers in \[0, 1\)"),
    ("decoding.top_p=0", r"decoding.top_p=0.0 must be in \(0, 1\]"),
    ("eval.decode_samples=-1", r"eval.decode_samples=-1 must be a number of examples >= 0"),
    ("eval.decode_max_new_tokens=0", r"eval.decode_max_new_tokens=0 must be a positive number of tokens, or null"),
    ("eval.decode_time_s=0", r"eval.decode_time_s=0.0 must be a positive number of seconds, or null"),
])
def test_a_value_out_of_range_is_refused_by_its_schema_naming_the_field(override, message):
    cfg = compose_train(override)
    with pytest.raises(ConfigError, match=message):
        check_training(cfg)


@pytest.mark.parametrize("choice", options("model"))
def test_a_model_kind_yaml_holds_only_what_differs_from_the_shared_fields(choice):
    """conf/model_common.yaml holds the fields every kind has; a kind's yaml names it and sets only its own fields
    and the values it changes, so the shared defaults are written once."""
    kind = choice.split("=")[1]
    raw = OmegaConf.load(CONF / "model" / f"{kind}.yaml")
    own = raw.get("model", raw)  # a kind that chooses its own axis defaults is a _global_ yaml
    common = OmegaConf.load(CONF / "model_common.yaml")
    assert any("/model_common@" in str(d) for d in raw.defaults)
    repeated = [k for k in own if k != "kind" and k in common and own[k] == common[k]]
    assert not repeated, f"conf/model/{kind}.yaml repeats the shared {repeated}"
    model = compose_train(choice, *(["task=digits"] if needs_images(choice) else []))["model"]
    assert set(common) <= set(model) and model.kind == kind
    assert all(model[k] == (own[k] if k in own else common[k]) for k in common)


def schedule_reference(option: str, step: int, warmup: int, total: int, floor: float) -> float:
    """The factor on optim.lr after `step` optimiser steps (0-based), written from the definitions: a linear
    warm-up to 1, then the 2017 paper's inverse square root normalised to 1 at the warm-up's end (noam), a cosine
    to `floor` at `total` (cosine), 1 and then 1 - sqrt(progress) to `floor` over the last 20% of `total` (wsd), or 1
    (constant)."""
    t = step + 1
    if t < warmup:
        return t / warmup
    if option == "noam":
        return (warmup / t) ** 0.5
    if option == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * min((t - warmup) / (total - warmup), 1.0)))
    if option == "wsd":
        start = total - round(0.2 * total)
        return 1.0 if t <= start else floor + (1 - floor) * (1 - min((t - start) / (total - start), 1.0) ** 0.5)
    return 1.0


@pytest.mark.parametrize("choice", options("schedule"))
def test_each_schedule_follows_its_definition(choice):
    cfg = compose_train(choice, "schedule.warmup_steps=5", "trainer.max_steps=30")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(optimizer, OmegaConf.to_container(cfg.schedule, resolve=True))
    option = choice.split("=")[1]
    for step in range(40):  # past total_steps: the cosine holds its floor
        expected = schedule_reference(option, step, 5, 30, cfg.schedule.get("min_lr_ratio", 0.0))
        assert scheduler.get_last_lr()[0] == pytest.approx(expected), step
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("override,message", [
    ("eval.context_lengths=[0]", r"eval.context_lengths=\[0\] must be a non-empty list of positive token counts"),
    ("eval.stride=0", r"eval.stride=0 must be a positive number of tokens"),
])
def test_context_settings_are_refused_by_the_rule_evaluate_py_uses(override, message):
    cfg = compose_train("eval.context_lengths=[8,16]", override)
    with pytest.raises(ConfigError, match=message):
        check_training(cfg)


def test_an_optimiser_of_ones_own_is_a_yaml_with_a_target(tmp_path):
    """One convention: an option is chosen by its yaml's `_target_`; an option without a schema composes untyped
    and is built all the same (its target refuses what it does not take)."""
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "adamw_no_decay.yaml").write_text(
        "_target_: archsweep.core.train.optimisers.optim.adamw\n_partial_: true\nname: adamw_no_decay\nlr: 1.0e-3\n"
        "betas: [0.9, 0.95]\neps: 1.0e-8\nweight_decay: 0.0\n")
    cfg = compose_train(f"hydra.searchpath=[file://{tmp_path}]", "optim=adamw_no_decay", *TINY)
    assert typed(cfg.optim, "optim") == OmegaConf.to_container(cfg.optim)  # no schema: a plain dict
    check_training(cfg)
    optimizer = make_optimizer(build_model(model_config(cfg, build_task(cfg))), OmegaConf.to_container(cfg.optim))
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["betas"] == (0.9, 0.95)
    with pytest.raises(Exception, match="momentum"):  # a setting the target does not take
        make_optimizer(build_model(model_config(cfg, build_task(cfg))),
                       {**OmegaConf.to_container(cfg.optim), "momentum": 0.9})
