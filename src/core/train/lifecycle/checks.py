"""The checks of one train.py job, before any heavy import: everything a user can get wrong (model fields,
task/model compatibility, optimiser, schedule, logger, trainer settings, budgets, the checkpoint to resume) is
refused here, so a refused config answers in well under a second. `prepare` turns a config into the one checked
`Setup` the rest of the job reads; `model_config` builds the model's config (from the task, a Hugging Face folder,
match_params / match_flops).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, NamedTuple

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from archsweep.core.data.tasks.base import Task
from archsweep.core.model.checkpoint import (
    CKPT_DIR,
    CheckpointError,
    check_checkpoint_file,
    read_checkpoint,
    resolve_checkpoint,
    resolve_init,
)
from archsweep.core.model.config import AXES, DecodingConfig, ModelConfig
from archsweep.core.train.config.diagnostics import DiagnosticsConfig
from archsweep.core.train.config.rules import (
    check_rules,
    decay_after_warmup,
    decay_phases,
    pause_at_a_branch,
    processes,
    warmup_within_training,
)
from archsweep.core.train.config.schemas import Checked as TypedConfig
from archsweep.core.train.config.schemas import check_schemas
from archsweep.core.train.config.setup import Budget, ConfigError, Setup
from archsweep.core.train.monitoring.callback_group import check_callbacks
from archsweep.core.train.monitoring.loggers import check_logger
from archsweep.core.train.runs.resume import NOT_SAVED, SAVED, saved_overrides
from archsweep.core.train.runs.runinfo import RunInfo, override_key
from archsweep.variants.plugins import PLUGIN

log = logging.getLogger("train")
BUDGET_SLACK = 0.05  # whole steps that miss budget.flops / budget.tokens by more than this fraction are warned about


class Settings(NamedTuple):
    """The training settings check_training turned into objects (the rest of the config is read as it is)."""

    decoding: DecodingConfig
    diagnostics: DiagnosticsConfig
    callbacks: dict[str, dict[str, Any]]


def build_task(cfg: DictConfig) -> Task:
    if cfg.get("data_dir") is not None and "data_dir" in cfg.task and cfg.task.data_dir is None:
        with open_dict(cfg):  # train.py data_dir=<folder>: where the task's relative data paths are looked up
            cfg.task.data_dir = str(cfg.data_dir)
    try:
        task = instantiate(cfg.task)
    except Exception as e:  # Hydra wraps the constructor's TypeError/ValueError
        raise ConfigError(f"task: {e.__cause__ or e}") from None
    if not isinstance(task, Task):
        raise ConfigError(f"task._target_={cfg.task._target_} does not build a archsweep.core.data.tasks.Task")
    return task


def overridden_fields(overrides: list[str] | tuple[str, ...]) -> set[str]:
    """The model fields the command line names: `model.n_layers=2` -> n_layers, `pos=alibi` -> pos,
    `pos.scaling=linear` -> pos.scaling, `model=decoder_only` -> kind."""
    out = set()
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key == "model":
            out.add("kind")
        elif key.startswith("model."):
            out.add(key.removeprefix("model."))
        elif key.split(".")[0] in AXES:
            out.add(key)
    return out


def hf_import(fields: dict[str, Any], folder: str, overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The fields of a run that starts from a Hugging Face folder (`model.init_from`): the folder's config.json
    sets them, the run's own weight-free settings kept; a clash or another vocabulary than the task's refused."""
    from archsweep.core.model.hf import import_fields, read_folder

    layout, hf = read_folder(folder)
    theirs = layout.model_fields(hf)
    if fields.get("vocab_size") != theirs["vocab_size"]:
        raise ValueError(f"model.init_from={folder} has a vocabulary of {theirs['vocab_size']} ids, the task "
                         f"{fields.get('vocab_size')}: train on data tokenized with the folder's tokenizer (e.g. "
                         f"archsweep-prepare with its tokenizer.json)")
    return import_fields(fields, theirs, overridden_fields(overrides) - {"vocab_size"})


def model_config(cfg: DictConfig, task: Task, overrides: list[str] | tuple[str, ...] = ()) -> ModelConfig:
    for axis in (*AXES, *PLUGIN.names()):  # a yaml whose first line is not its package directive lands at the top
        if axis in cfg:
            package = f"model.{axis}" if axis in AXES else f"model.plugins.{axis}"
            raise ConfigError(f"{axis}: the config has a top-level `{axis}` key, so the option's yaml is not read as "
                              f"part of the model; conf/{axis}/<option>.yaml must begin with the line "
                              f"'# @package {package}'")
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    try:
        task.check_kind(str(fields.get("kind")))
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    for key, value in task.model_fields().items():
        if fields.get(key) is None:
            fields[key] = value
    init = fields.pop("init_from", None)
    try:
        if init is not None:
            fields = hf_import(fields, str(init), overrides)
        model_cfg = ModelConfig.from_dict(fields)
        if init is not None:
            check_standard_weights(model_cfg, str(init))
        task.check_model(model_cfg)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    filled = list(task.model_fields())
    field = cfg.get("match_field", "d_ff")
    if cfg.match_params is not None and cfg.get("match_flops") is not None:
        raise ConfigError("match_params and match_flops both set: a model can be held to one of them; set the "
                          "other to null")
    count = cfg.get("match_count")  # total or active; null: total parameters, active FLOPs
    if cfg.match_params is not None:
        model_cfg = match_params(model_cfg, cfg.match_params, field, count or "total")
        filled.append(field)
    if cfg.get("match_flops") is not None:
        model_cfg = match_flops(model_cfg, cfg.match_flops, task, field, count or "active")
        filled.append(field)
    with open_dict(cfg):  # the resolved config records what was actually built
        for key in filled:
            cfg.model[key] = getattr(model_cfg, key)
    if cfg.get("export") == "hf":
        check_exportable(model_cfg)
    return model_cfg


def check_standard_weights(model_cfg: ModelConfig, folder: str) -> None:
    """A Hugging Face folder holds a standard-parametrisation model: a parametrisation whose forward constants are
    not 1 at this width would compute something else with its weights."""
    from archsweep.core.model.build import forward_scales
    from archsweep.variants.param.base import ForwardScales

    if forward_scales(model_cfg) != ForwardScales():
        raise ValueError(f"model.init_from={folder} holds a standard-parametrisation model, and param="
                         f"{model_cfg.choice('param')} at d_model={model_cfg.d_model} would scale its forward pass; "
                         f"set model.param.base_width={model_cfg.d_model} (the folder's width) or param=sp")


def check_exportable(model_cfg: ModelConfig) -> None:
    """`export=hf`: a model that no Hugging Face layout maps exactly is refused before any training, naming each
    option that has no place and the value that would."""
    from archsweep.core.model.hf import layout_for
    from archsweep.core.model.hf.base import folded_config

    try:
        layout_for(folded_config(model_cfg))
    except ValueError as e:
        raise ConfigError(f"export=hf: {str(e).replace('; nothing was written', '')}; change those options or set "
                          f"export=null") from None


def match_params(model_cfg: ModelConfig, target: Any, field: str = "d_ff", count: str = "total") -> ModelConfig:
    """Solve model.<field> (d_ff) for `target`: a parameter count, or model fields naming a reference model (this
    model with those fields changed, e.g. {ffn: relu}), whose parameter count is then the target. `count`: total
    parameters, or those one token uses (active)."""
    from archsweep.core.model.build import check_count, match_d_ff, match_field, parameter_count  # torch

    try:
        check_count(count, "match_count")
        parameter_count = functools.partial(parameter_count, count=count)
        if isinstance(target, DictConfig):
            fields = OmegaConf.to_container(target, resolve=True)
            reference = ModelConfig.from_dict({**model_cfg.to_dict(), **fields})
            target = parameter_count(reference)
            log.info(f"match_params: the reference model ({', '.join(f'{k}={v}' for k, v in fields.items())}) "
                     f"has {target:,} parameters")
        if field == "d_ff":
            matched, found = match_d_ff(model_cfg, target, count)
        else:
            model_cfg.validate()
            matched, found = match_field(model_cfg, target, parameter_count, "match_params", field)
    except ValueError as e:
        raise ConfigError(str(e) if str(e).startswith("match_") else f"match_params: {e}") from None
    log.info(f"match_params: model.{field}={getattr(matched, field)} gives {found:,.0f} {count} parameters "
             f"({(found - target) / target:+.2%} from {target:,})")
    return matched


def match_flops(model_cfg: ModelConfig, target: Any, task: Task, field: str = "d_ff",
                count: str = "active") -> ModelConfig:
    """Solve model.<field> (d_ff) so the training FLOPs per token, at the task's batch shape, equal `target`: a
    number, or model fields naming a reference model (e.g. {attention: full}) whose FLOPs per token it is.
    `count`: the work a token does (active), or what it would be on every parameter (total)."""
    from archsweep.core.model.build import check_count, flops_per_token, match_field  # imports torch

    shape = task.flop_shape(model_cfg.kind)
    measure = lambda cfg: flops_per_token(cfg, shape, count)  # noqa: E731
    try:
        check_count(count, "match_count")
        if isinstance(target, DictConfig):
            fields = OmegaConf.to_container(target, resolve=True)
            reference = ModelConfig.from_dict({**model_cfg.to_dict(), **fields})
            reference.validate()
            target = measure(reference)
            log.info(f"match_flops: the reference model ({', '.join(f'{k}={v}' for k, v in fields.items())}) "
                     f"takes {target:,.0f} training FLOPs per token")
        elif isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0:
            raise ValueError(f"match_flops={target!r} must be a positive number of FLOPs per token, model fields "
                             f"naming a reference model (e.g. {{attention: full}}), or null to turn it off")
        model_cfg.validate()
        matched, found = match_field(model_cfg, float(target), measure, "match_flops", field, "FLOPs per token")
    except ValueError as e:
        raise ConfigError(str(e) if str(e).startswith("match_") else f"match_flops: {e}") from None
    log.info(f"match_flops: model.{field}={getattr(matched, field)} gives {found:,.0f} {count} training FLOPs per "
             f"token ({(found - target) / target:+.2%} from {target:,.0f})")
    return matched


def apply_budget(cfg: DictConfig, model_cfg: ModelConfig, task: Task) -> Budget | None:
    """budget.flops or budget.tokens -> trainer.max_steps (the nearest whole number of optimiser steps, at least
    one), from the task's batch shape, the gradient accumulation and the number of processes. A budget below one
    step, or one that whole steps miss by more than BUDGET_SLACK, is warned about with what the run spends."""
    budget = cfg.get("budget") or {}
    flops, tokens = budget.get("flops"), budget.get("tokens")
    if flops is None and tokens is None:
        return None
    from archsweep.core.model.build import flop_count, tokens_of
    from archsweep.variants.flops import TRAIN_FACTOR

    shape = task.flop_shape(model_cfg.kind)
    batches = int(cfg.trainer.get("accumulate_grad_batches", 1)) * (processes(cfg.trainer) or 1)
    if flops is not None:
        unit, requested, per_step = "flops", float(flops), float(TRAIN_FACTOR * flop_count(model_cfg, shape) * batches)
        what, amount = f"budget.flops={flops:.3g}", lambda x: f"{x:.4g} FLOPs"
    else:
        unit, requested, per_step = "tokens", float(tokens), float(tokens_of(shape) * batches)
        what, amount = f"budget.tokens={tokens:.4g}", lambda x: f"{x:,.0f} tokens"
    steps = max(1, round(requested / per_step))
    with open_dict(cfg):
        cfg.trainer.max_steps = steps
    spent = steps * per_step
    if requested < per_step:
        log.warning(f"{what} is below one step ({amount(per_step)} per step); trainer.max_steps=1 spends "
                    f"{amount(spent)}, {spent / requested:.3g}x the budget. Raise budget.{unit} to a whole number of "
                    f"steps, or use a smaller model or batch")
    elif abs(spent / requested - 1) > BUDGET_SLACK:
        log.warning(f"{what} at {amount(per_step)} per step: trainer.max_steps={steps} spends {amount(spent)}, "
                    f"{spent / requested - 1:+.1%} from the budget (whole steps)")
    else:
        log.info(f"{what} at {amount(per_step)} per step: trainer.max_steps={steps}")
    return Budget(unit, requested, per_step, steps)


def check_training(cfg: DictConfig, typed: TypedConfig | None = None) -> Settings:
    """The typed groups (their schemas' rules run; the types were checked when composing), the logger and the
    callbacks. `typed`: the config's `check_schemas`, when the caller has it already. Rules across groups are
    `rules.py`'s, which prepare() runs."""

    def fail(msg: str) -> None:
        raise ConfigError(msg)

    if typed is None:
        try:
            typed = check_schemas(cfg)
        except ValueError as e:
            fail(str(e))
    try:
        check_logger(cfg.logger)
    except ValueError as e:
        fail(str(e))
    try:  # last: it imports the callbacks' modules (Lightning, when an entry names a Lightning callback)
        callbacks = check_callbacks(OmegaConf.to_container(cfg.callbacks, resolve=True)
                                    if cfg.get("callbacks") is not None else None)
    except ValueError as e:
        fail(str(e))
    return Settings(typed.groups["decoding"], typed.groups.get("diagnostics") or DiagnosticsConfig(), callbacks)


def prepare(cfg: DictConfig, info: RunInfo) -> Setup:
    """The one checked Setup of this job (the resume checkpoint is read later, by check_resume)."""
    typed, ckpt = check_light(cfg, info)
    task = build_task(cfg)
    try:
        check_rules(cfg, task)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    settings = check_training(cfg, typed)  # before the model: its variants import torch, these settings need not
    model_cfg = model_config(cfg, task, info.overrides)
    budget = None
    if cfg.get("budget") is not None:
        steps = cfg.trainer.max_steps
        budget = apply_budget(cfg, model_cfg, task)
        try:  # the schedule against the steps the budget gives (checked already if they are the same)
            if cfg.trainer.max_steps != steps:
                check_rules(cfg, task, (warmup_within_training, decay_after_warmup, decay_phases,
                                         pause_at_a_branch))
        except ValueError as e:
            raise ConfigError(f"the budget gives trainer.max_steps={cfg.trainer.max_steps}: {e}") from None
    return Setup(model_cfg, task, ckpt, settings.decoding, settings.diagnostics, settings.callbacks,
                 budget=budget, hf_init=cfg.model.get("init_from"))


def check_light(cfg: DictConfig, info: RunInfo) -> tuple[TypedConfig, Path | None]:
    """What needs neither the task nor the model (whose variants import torch): the schemas (the one time they are
    checked), the checkpoint files named, and that a run starts from one set of weights. Returns the typed groups
    and the checkpoint file to resume from."""
    current_targets(cfg)
    ckpt = None
    try:
        typed = check_schemas(cfg)
        if cfg.ckpt_path is not None:
            ckpt = resolve_checkpoint(str(cfg.ckpt_path), "resume", cfg.output_root, info.overrides)
            check_checkpoint_file(ckpt)
        if cfg.get("init_from") is not None:
            resolve_init(str(cfg.init_from))
            if cfg.model.get("init_from") is not None:
                raise ValueError(f"init_from={cfg.init_from} and model.init_from={cfg.model.init_from} both set: "
                                 f"a run starts from one set of weights; set the other to null")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return typed, ckpt


def current_targets(cfg: DictConfig) -> None:
    """`_target_`s that name a module by its former path (a resumed run's saved overrides, one's own yaml written
    before the train wing's sub-packages: `archsweep.core.train.optim.adamw`) rewritten in place to today's path
    (`archsweep.core.model.legacy.MODULES`), each said once in the log."""
    from archsweep.core.model.legacy import module_path

    def walk(node: Any, path: str) -> None:
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(value, dict):
                walk(value, where)
            elif key == "_target_" and isinstance(value, str) and module_path(value) != value:
                log.warning(f"{where}={value} names a former module path; read as {module_path(value)}")
                with open_dict(cfg):
                    OmegaConf.update(cfg, where, module_path(value), merge=False)

    walk(OmegaConf.to_container(cfg, resolve=False), "")


def check_resume(setup: Setup, resume: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Read the checkpoint to resume from (torch) and check that it holds this model; sets setup.resume. `resume`
    (the run directory train.py's `resume=` named) and this job's `overrides` are for the refusal's wording."""
    if setup.ckpt_path is None:
        return
    try:
        ckpt = read_checkpoint(setup.ckpt_path)
    except CheckpointError as e:
        raise ConfigError(f"ckpt_path: {e}") from None
    meta = ckpt.get("archsweep")
    if meta is None:
        raise ConfigError(f"ckpt_path={setup.ckpt_path} is not a train.py checkpoint")
    try:  # canonical, and a field the checkpoint predates at its default (what that run was built with)
        stored = ModelConfig.from_dict(meta["model_config"]).to_dict()
    except ValueError as e:
        raise ConfigError(f"ckpt_path={setup.ckpt_path}: its model config does not load: {e}") from None
    if stored != setup.model_cfg.to_dict():
        raise ConfigError(other_model(setup.ckpt_path, setup.model_cfg.to_dict(), stored, resume, overrides))
    setup.resume, setup.resume_step = meta, int(ckpt.get("global_step", 0))


def other_model(ckpt_path: Path, now: dict[str, Any], stored: dict[str, Any], resume: str | None,
                overrides: list[str] | tuple[str, ...] = ()) -> str:
    """The refusal of a checkpoint whose model is not this config's: each field that differs as a `key: now ->
    checkpoint` line, and the overrides its run was started with (its `.hydra/overrides.yaml`) to use instead."""
    fields = "\n".join(f"  {k}: {v} -> {stored.get(k)}" for k, v in now.items() if stored.get(k) != v)
    run_dir = ckpt_path.parent.parent if ckpt_path.parent.name == CKPT_DIR else ckpt_path.parent
    saved = saved_overrides(run_dir)
    listed = " ".join(saved) if saved else "(no overrides)"
    if resume is not None:
        added = [o for o in overrides if o not in (saved or []) and override_key(o) not in NOT_SAVED]
        return (f"resume={resume}: the overrides added to the run's ({' '.join(added) or 'none'}) change its model "
                f"(now -> checkpoint):\n{fields}\nresume= takes the run's saved overrides ({listed}) and accepts "
                f"only overrides that keep its model, e.g. trainer.max_steps=<steps>; leave out the ones that change "
                f"these fields")
    head = f"ckpt_path={ckpt_path} holds a different model (now -> checkpoint):\n{fields}\n"
    if saved is None:
        return (f"{head}its run directory {run_dir} records no overrides ({run_dir / SAVED} is missing); "
                f"resume with the overrides that run was started with")
    return (f"{head}the run was started with: {listed}\nresume it with: python train.py resume={run_dir} (the same "
            f"overrides, read from {run_dir / SAVED}), or add those overrides to this command")
