"""The schemas of the config groups that are plain settings: dataclasses in Hydra's ConfigStore, so a value of the
wrong type, or a key the schema lacks, is refused while the config is composed, with the key named (Hydra's
"Value 'abc' of type 'str' could not be converted to Float / full_key: optim.lr", which the entry points give as
`error: optim.lr=abc: ...`, src/composition.py).

Each option yaml names its schema first in its defaults list (`- /schema_optim_adamw@_here_`, then `- _self_`);
the blocks of train.yaml (`eval`, `budget`, `diagnostics`) name theirs in train.yaml's defaults
(`- /schema_eval@eval`). A schema holds the types; the yaml holds the values (fields it must set are `MISSING`;
DecodingConfig and DiagnosticsConfig keep their defaults, which code that builds them directly uses). Rules on one
field's range or on fields of one group live in the schema's `__post_init__`, which runs when `check_schemas`
turns each group into its dataclass (`OmegaConf.to_object`), right after composing and before any heavy import.
Rules across groups are in `rules.py`.

Importing this module registers the schemas (cli.py and tests/conftest.py do, before composing). Light: no torch,
Lightning or wandb.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from archsweep.core.eval.context import check_lengths
from archsweep.core.model.config import DecodingConfig, ModelConfig
from archsweep.core.train.config.diagnostics import DiagnosticsConfig
from archsweep.core.train.config.wsd import SHAPES, check_phases

SEED_MAX = 2**32 - 1  # what numpy and Lightning's seed_everything take
MUON_SCALINGS = ("reference", "moonlight")  # muon.py's update scalings
MUON_NS_DTYPES = ("float32", "bfloat16")  # muon.py's Newton-Schulz dtypes (names of torch dtypes)


def refuse(key: str, value: Any, rule: str) -> None:
    raise ValueError(f"{key}={_show(value)} {rule}")


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, (list, tuple)) else repr(value)


def check_adam_part(lr_key: str, lr: float, betas: list[float], eps: float, weight_decay: float) -> None:
    if not lr > 0:
        refuse(lr_key, lr, "must be a positive learning rate, e.g. 2e-3")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        refuse("optim.betas", betas, "must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.98]")
    if not eps > 0:
        refuse("optim.eps", eps, "must be a positive number, e.g. 1e-9")
    if weight_decay < 0:
        refuse("optim.weight_decay", weight_decay, "must be a number >= 0 (0: no weight decay)")


def mixed_on_gpu(accelerator: str) -> str:
    """conf/trainer/fsdp.yaml's precision: bf16-mixed where `accelerator` is (or `auto` finds) a GPU, else 32-true."""
    from archsweep.core.train.config.rules import gpu_present

    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and gpu_present())
    return "bf16-mixed" if on_gpu else "32-true"


if not OmegaConf.has_resolver("mixed_on_gpu"):
    OmegaConf.register_new_resolver("mixed_on_gpu", mixed_on_gpu)


@dataclass
class AdamWSchema:
    """conf/optim/adamw.yaml."""

    _target_: str = MISSING  # a function (model, lr, ...) -> optimiser; `_partial_`: the model comes at build time
    _partial_: bool = True
    name: str = MISSING  # the option's label (results.json, compare); `_target_` chooses the implementation
    lr: float = MISSING
    betas: list[float] = MISSING
    eps: float = MISSING
    weight_decay: float = MISSING
    decay_embeddings: bool = False

    def __post_init__(self) -> None:
        check_adam_part("optim.lr", self.lr, self.betas, self.eps, self.weight_decay)


@dataclass
class MuonSchema:
    """conf/optim/muon.yaml (its AdamW part: adamw_lr, betas, eps)."""

    _target_: str = MISSING
    _partial_: bool = True
    name: str = MISSING
    lr: float = MISSING
    momentum: float = MISSING
    nesterov: bool = MISSING
    ns_steps: int = MISSING
    ns_dtype: str = MISSING
    scaling: str = MISSING
    weight_decay: float = MISSING
    adamw_lr: float = MISSING
    betas: list[float] = MISSING
    eps: float = MISSING
    decay_embeddings: bool = False

    def __post_init__(self) -> None:
        if not self.lr > 0:
            refuse("optim.lr", self.lr, "must be a positive learning rate (Muon's reference: 0.02)")
        check_adam_part("optim.adamw_lr", self.adamw_lr, self.betas, self.eps, self.weight_decay)
        if not 0.0 <= self.momentum < 1.0:
            refuse("optim.momentum", self.momentum, "must be a number in [0, 1) (Muon's reference: 0.95)")
        if self.ns_steps < 1:
            refuse("optim.ns_steps", self.ns_steps, "must be a positive whole number of Newton-Schulz iterations "
                                                    "(the reference's 5; fewer leave the update's singular values "
                                                    "far from 1)")
        if self.ns_dtype not in MUON_NS_DTYPES:
            refuse("optim.ns_dtype", self.ns_dtype, f"must be one of {', '.join(MUON_NS_DTYPES)} (bfloat16 as the "
                                                    f"reference does on GPU)")
        if self.scaling not in MUON_SCALINGS:
            refuse("optim.scaling", self.scaling, f"must be one of {', '.join(MUON_SCALINGS)}: reference = max(1, "
                                                  f"rows/cols)^0.5, moonlight = 0.2 sqrt(max(rows, cols))")


def check_warmup_steps(warmup_steps: int) -> None:
    if warmup_steps < 0:
        refuse("schedule.warmup_steps", warmup_steps, "must be a number of optimiser steps >= 0 (0: no warm-up), "
                                                      "e.g. schedule.warmup_steps=200")


@dataclass
class WarmupSchema:
    """conf/schedule/noam.yaml and constant.yaml: a linear warm-up, then the schedule's own shape."""

    _target_: str = MISSING  # a function (optimizer, warmup_steps, ...) -> LR scheduler; `_partial_`: the
    _partial_: bool = True  # optimiser comes at build time
    name: str = MISSING
    warmup_steps: int = MISSING
    branches: list[float] = field(default_factory=list)  # budget branches: schedule=wsd only (WsdSchema)

    def __post_init__(self) -> None:
        check_warmup_steps(self.warmup_steps)
        if self.branches:
            refuse("schedule.branches", self.branches, f"needs schedule=wsd: budget branches decay from a stable "
                                                       f"phase, which schedule={self.name} does not have")


@dataclass
class CosineSchema(WarmupSchema):
    """conf/schedule/cosine.yaml: the warm-up, then a cosine to a floor at total_steps."""

    total_steps: int = MISSING
    min_lr_ratio: float = MISSING

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            refuse("schedule.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]: the floor of the cosine as a "
                                                               "fraction of optim.lr (0.1 is usual)")
        if self.total_steps <= self.warmup_steps:
            refuse("schedule.total_steps", self.total_steps, f"must exceed schedule.warmup_steps={self.warmup_steps} "
                                                             f"for the cosine schedule; lower the warm-up or raise "
                                                             f"trainer.max_steps")


@dataclass
class WsdSchema(WarmupSchema):
    """conf/schedule/wsd.yaml: the warm-up, a constant rate, then a decay to a floor over the last decay_fraction
    of total_steps; `branches` (fractions of total_steps) adds budgets decayed from the stable phase
    (core/train/config/wsd.py)."""

    total_steps: int = MISSING
    decay_fraction: float = MISSING
    decay_shape: str = MISSING
    min_lr_ratio: float = MISSING

    def __post_init__(self) -> None:
        check_warmup_steps(self.warmup_steps)
        if not 0.0 < self.decay_fraction <= 1.0:
            refuse("schedule.decay_fraction", self.decay_fraction, "must be in (0, 1]: the share of total_steps "
                                                                   "spent decaying (Hägele et al. 2024: 0.2)")
        if self.decay_shape not in SHAPES:
            refuse("schedule.decay_shape", self.decay_shape, f"must be one of {', '.join(SHAPES)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            refuse("schedule.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]: the rate at the end of the decay "
                                                               "as a fraction of optim.lr (0 is usual for WSD)")
        if self.total_steps < 1:
            refuse("schedule.total_steps", self.total_steps, "must be a positive number of optimiser steps")
        if list(self.branches) != sorted(set(self.branches)) or not all(0.0 < f <= 1.0 for f in self.branches):
            refuse("schedule.branches", self.branches, "must be increasing fractions of schedule.total_steps in "
                                                       "(0, 1], e.g. schedule.branches=[0.25,0.5,1.0] (1.0: the run "
                                                       "itself)")
        check_phases(self.warmup_steps, self.total_steps, self.decay_fraction, list(self.branches))


@dataclass
class TrainerSchema:
    """conf/trainer/default.yaml (cpu, gpu and ddp extend it): the Lightning Trainer arguments it sets, and ours
    (peak_flops, collective_timeout_s), which fit.py takes out before the rest goes to lightning.Trainer. Others
    can be added with +trainer.<name>=... (Lightning checks those); the precision names are Lightning's, asked by
    rules.precision_known."""

    accelerator: str = MISSING
    devices: Any = MISSING  # a count, -1, auto, or a list of device ids
    strategy: str = MISSING
    num_nodes: int = MISSING
    precision: Any = MISSING  # a name or a number; rules.precision_known asks Lightning which are valid
    max_steps: int = MISSING
    val_check_interval: int = MISSING
    check_val_every_n_epoch: int | None = MISSING
    log_every_n_steps: int = MISSING
    gradient_clip_val: float | None = MISSING
    gradient_clip_algorithm: str = MISSING
    accumulate_grad_batches: int = MISSING
    num_sanity_val_steps: int = MISSING
    enable_progress_bar: bool = MISSING
    enable_model_summary: bool = MISSING
    deterministic: Any = MISSING  # true, false or "warn"
    peak_flops: float | None = MISSING
    collective_timeout_s: int = MISSING

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            refuse("trainer.max_steps", self.max_steps, "must be a positive number of optimiser steps (the training "
                                                        "stream is endless)")
        if self.val_check_interval < 1:
            refuse("trainer.val_check_interval", self.val_check_interval, "must be a positive number of training "
                                                                          "batches")
        if self.accumulate_grad_batches < 1:
            refuse("trainer.accumulate_grad_batches", self.accumulate_grad_batches,
                   "must be a positive whole number of batches per optimiser step (1: no accumulation)")
        if self.gradient_clip_val is not None and self.gradient_clip_val < 0:
            refuse("trainer.gradient_clip_val", self.gradient_clip_val, "must be a number >= 0, or null to disable "
                                                                        "clipping (a negative value would disable it "
                                                                        "silently)")
        if self.collective_timeout_s < 1:
            refuse("trainer.collective_timeout_s", self.collective_timeout_s, "must be a positive number of seconds")
        check_devices(self.devices)


def check_devices(devices: Any) -> None:
    fix = "must be a positive number of devices, -1 (all), auto, or a list of device ids such as [0,1]"
    if devices == "auto" or devices == -1:
        return
    if isinstance(devices, bool):
        refuse("trainer.devices", devices, fix)
    if isinstance(devices, int):
        if devices < 1:
            refuse("trainer.devices", devices, fix)
        return
    if isinstance(devices, (list, tuple)):
        if not devices or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            refuse("trainer.devices", devices, fix)
        return
    if isinstance(devices, str) and devices.replace(",", "").strip().isdigit():  # "2", or ids "0,1"
        if "," not in devices and int(devices) == 0:
            refuse("trainer.devices", devices, f"{fix} (GPU 0 alone: trainer.devices=[0])")
        return
    refuse("trainer.devices", devices, fix)


@dataclass
class BudgetSchema:
    """train.yaml's `budget:` block: one of these sets trainer.max_steps."""

    flops: float | None = None
    tokens: float | None = None

    def __post_init__(self) -> None:
        for name in ("flops", "tokens"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                refuse(f"budget.{name}", value, f"must be a positive number (e.g. budget.{name}=1e12), or null")
        if self.flops is not None and self.tokens is not None:
            raise ValueError("budget.flops and budget.tokens both set: give one of them, set the other to null")


@dataclass
class EvalSchema:
    """train.yaml's `eval:` block."""

    decode_samples: int = MISSING
    decode_max_new_tokens: int | None = MISSING
    decode_time_s: float | None = MISSING
    show_examples: int = MISSING
    context_lengths: list[int] | None = MISSING
    stride: int | None = MISSING
    context_tokens: int | None = MISSING

    def __post_init__(self) -> None:
        for name in ("decode_samples", "show_examples"):
            if getattr(self, name) < 0:
                refuse(f"eval.{name}", getattr(self, name), "must be a number of examples >= 0 (0: none)")
        if self.decode_max_new_tokens is not None and self.decode_max_new_tokens < 1:
            refuse("eval.decode_max_new_tokens", self.decode_max_new_tokens, "must be a positive number of tokens, "
                   "or null: the longest reference of the batch + 1 (enough to decide exact match)")
        if self.decode_time_s is not None and not self.decode_time_s > 0:
            refuse("eval.decode_time_s", self.decode_time_s, "must be a positive number of seconds, or null: no "
                   "time bound")
        if self.context_lengths is not None:
            check_lengths(self.context_lengths, self.stride)  # evaluate.py's rule too
        if self.context_tokens is not None and self.context_tokens < 1:
            refuse("eval.context_tokens", self.context_tokens, "must be a positive number of tokens, or null: all")


@dataclass
class RunSchema:
    """The top-level settings of train.yaml that are plain values. The root config is not typed (experiment
    presets and `+key=` overrides add keys to it), so these are checked by `check_schemas`, right after composing."""

    seed: int = 0
    label_smoothing: float = 0.0
    threads: int | None = None
    objective: str = "val/loss"
    export: str | None = None  # hf: the run must stay exportable (archsweep-export), refused before training if not
    pause_at: float | None = None  # a budget fraction of schedule.branches to pause at (rules.pause_at_a_branch)

    def __post_init__(self) -> None:
        if self.pause_at is not None and not 0.0 < self.pause_at < 1.0:
            refuse("pause_at", self.pause_at, "must be a budget fraction below 1.0, one of schedule.branches (e.g. "
                                              "pause_at=0.25), or null to train to the end")
        if self.export not in (None, "hf"):
            refuse("export", self.export, "must be hf (the model must map onto a Hugging Face class: checked before "
                                          "training) or null")
        if not 0 <= self.seed <= SEED_MAX:
            refuse("seed", self.seed, f"must be a whole number from 0 to {SEED_MAX}, e.g. seed=0")
        if not 0.0 <= self.label_smoothing < 1.0:
            refuse("label_smoothing", self.label_smoothing, "must be in [0, 1) (the 2017 paper used 0.1)")
        if self.threads is not None and self.threads < 1:
            refuse("threads", self.threads, "must be a positive number of CPU threads, or null for torch's default")
        if "/" not in self.objective:
            refuse("objective", self.objective, "must name a results.json metric as split/name, e.g. val/loss or "
                                                "val/exact_match")


DOTTED_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")  # optim.lr, model.n_layers, norm
METRIC_NAME = re.compile(r"^\w+/\w+(:(min|max))?$")  # split/name[:min|max]: val/loss, by_context/ppl_ratio:min
CELL_SPEC = re.compile(r"^\s*[A-Za-z_][\w.-]*=\S+(\s+[A-Za-z_][\w.-]*=\S+)*\s*$")  # norm=pre model.n_layers=6


@dataclass
class CompareSchema:
    """train.yaml's `compare:` block: how compare.py reads a sweep of this config (docs/training.md, Tuned
    comparisons). Recorded in results.json; compare.py's --tune, --no-tune, --baseline and --sort override it."""

    tune: list[str] = field(default_factory=list)  # keys tuned per cell rather than compared, e.g. [optim.lr]
    baseline: str | None = None  # the cell the others are tested against, e.g. "norm=pre"
    metric: str | None = None  # the metric that answers the question (split/name, :min or :max where the name does
    # not say which way is better); null: compare.py's default
    detect: float | None = None  # the difference worth finding, in the metric's units
    sequential: bool = False  # decide each comparison by seeds added in batches (docs/training.md, Sequential seeds)
    max_seeds: int = 10  # sequential: the most seeds a comparison gets
    seed_batch: int = 2  # sequential: seeds added between two looks
    transfer: str | None = None  # a width key (model.d_model): each width's best tuned rate against the smallest's

    def __post_init__(self) -> None:
        if self.detect is not None and not self.detect > 0:
            refuse("compare.detect", self.detect, "must be a positive difference in the metric's units, e.g. "
                                                  "compare.detect=0.02, or null")
        if self.max_seeds < 2:
            refuse("compare.max_seeds", self.max_seeds, "must be at least 2 (a paired test needs 2 seeds)")
        if self.seed_batch < 1:
            refuse("compare.seed_batch", self.seed_batch, "must be at least 1 seed")
        for key in self.tune:
            if not DOTTED_KEY.match(key) or key == "seed" or key.split(".")[0] == "compare":
                refuse("compare.tune", self.tune, f"names {key!r}, which is not a config key to tune; give dotted "
                                                  f"keys, e.g. compare.tune=[optim.lr]")
        if self.metric is not None and not METRIC_NAME.match(self.metric):
            refuse("compare.metric", self.metric, "must name a results.json metric as split/name, e.g. "
                                                  "test_long/acc or val/loss (with :min or :max where the name does "
                                                  "not say which way is better), or be null (compare.py's default)")
        if self.baseline is not None and not CELL_SPEC.match(self.baseline):
            refuse("compare.baseline", self.baseline, "must be a cell as key=value pairs separated by spaces, e.g. "
                                                      "compare.baseline='norm=pre', or null")


SCHEMAS: dict[str, type] = {  # ConfigStore name -> schema; an option yaml names its own in its defaults list
    "schema_optim_adamw": AdamWSchema,
    "schema_optim_muon": MuonSchema,
    "schema_schedule_warmup": WarmupSchema,
    "schema_schedule_cosine": CosineSchema,
    "schema_schedule_wsd": WsdSchema,
    "schema_trainer": TrainerSchema,
    "schema_decoding": DecodingConfig,
    "schema_diagnostics": DiagnosticsConfig,
    "schema_budget": BudgetSchema,
    "schema_eval": EvalSchema,
    "schema_compare": CompareSchema,
    "schema_model": ModelConfig,  # the model's fields (its rules across fields run when the model is built)
}
GROUPS = ("optim", "schedule", "trainer", "decoding", "diagnostics", "budget", "eval", "compare")  # typed nodes


def register() -> None:
    """Store the schemas at the top level of the ConfigStore (not in a group, so --help does not list them as
    options). Idempotent."""
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        cs.store(name=name, node=schema)


register()


@dataclass
class Checked:
    """The typed settings of one composed train.py config."""

    run: RunSchema
    groups: dict[str, Any] = field(default_factory=dict)  # group -> its schema's dataclass (or a dict if untyped)


def typed(node: Any, key: str, schema: type | None = None) -> Any:
    """A config node as its schema's dataclass, the schema's rules run. A node composed against a schema carries
    it; `schema` types a node that does not (the untyped root's settings, a user's option yaml that names no
    schema). A node with neither comes back as a dict. ValueError names the key."""
    plain = schema is not None and OmegaConf.get_type(node) in (dict, None)
    prefix = key if plain else ""  # a merged copy's keys are relative to it; a composed node's are full
    try:
        if plain:
            node = OmegaConf.merge(OmegaConf.structured(schema), node)
        if OmegaConf.get_type(node) not in (dict, None):
            return OmegaConf.to_object(node)
        return OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as e:  # a wrong type, a missing value; its message names the key
        where = ".".join(p for p in (prefix, e.full_key) if p) or key
        raise ValueError(f"{where}: {str(e.msg).splitlines()[0]}") from None


# groups whose every option has this schema
ONE_SCHEMA = {"trainer": TrainerSchema, "decoding": DecodingConfig, "diagnostics": DiagnosticsConfig,
              "budget": BudgetSchema, "eval": EvalSchema, "compare": CompareSchema}


def check_schemas(cfg: DictConfig) -> Checked:
    """Every typed group of a composed train.py config as its dataclass (their `__post_init__` rules run), and
    the top-level settings. ValueError names the field, the value and the fix."""
    keys = ("seed", "label_smoothing", "threads", "objective", "export", "pause_at")
    run = typed(OmegaConf.create({k: cfg.get(k) for k in keys if k in cfg}), "", RunSchema)
    return Checked(run, {g: typed(cfg[g], g, ONE_SCHEMA.get(g)) for g in GROUPS if cfg.get(g) is not None})
