"""Who a run is: the option chosen in every config group, its overrides, and from those its W&B name, tags
and group. Light (Hydra and OmegaConf only), so it runs before the heavy imports."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

# keys that say where or how a run is logged or executed, or how its sweep is read (compare), not what is trained:
# left out of run names, of the settings a sweep re-run compares, and of compare.py's cells (pause_at: where the run
# stops this time; continued with another, it is the same run)
SETTINGS = ("ckpt_path", "resume", "output_root", "overwrite", "logger", "hydra", "threads", "trace_shapes",
            "data_dir", "compare", "pause_at")


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def is_setting(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") or key.startswith(k + "/") for k in SETTINGS)


def compare_block(cfg: DictConfig) -> dict[str, Any] | None:
    """The config's `compare:` block as results.json records it (compare.py reads it from the runs)."""
    return OmegaConf.to_container(cfg.compare, resolve=True) if cfg.get("compare") is not None else None


@dataclass
class RunInfo:
    run_dir: Path
    choices: dict[str, str | None]  # group -> option, e.g. {model: encoder_decoder, norm: post, ...}
    overrides: list[str]  # this job's command-line overrides
    name: str
    group: str | None
    tags: list[str] = field(default_factory=list)
    multirun: bool = False
    sweep_dir: Path | None = None
    job_num: int | None = None
    swept: dict[str, Any] = field(default_factory=dict)  # this job's value of every key the sweep varies


_key = override_key


def _named(override: str) -> bool:
    return not is_setting(_key(override))


def sweep_keys(sweep_dir: Path) -> list[str]:
    """Keys whose value varies across the sweep: sweep overrides (a,b,c or range) on the command line and
    `hydra.sweeper.params` (experiment presets), read from the sweep's multirun.yaml."""
    saved = sweep_dir / "multirun.yaml"
    if not saved.is_file():
        return []
    hydra_cfg = OmegaConf.load(saved).hydra
    # the command line wins over a preset's `hydra.sweeper.params`, as in Hydra's basic sweeper
    args = [f"{k}={v}" for k, v in (OmegaConf.select(hydra_cfg, "sweeper.params") or {}).items()]
    args += list(hydra_cfg.overrides.task)
    swept: dict[str, bool] = {}
    for o in OverridesParser.create().parse_overrides(args):
        swept[o.key_or_group] = o.is_sweep_override()
    return [key for key, is_sweep in swept.items() if is_sweep]


def run_info(cfg: DictConfig) -> RunInfo:
    hc = HydraConfig.get()
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
    overrides = list(hc.overrides.task)
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_dir = Path(hc.sweep.dir) if multirun else None
    named = [o for o in overrides if _named(o)]
    swept: dict[str, Any] = {}
    if multirun:
        varying = sweep_keys(sweep_dir)
        named = [o for o in named if _key(o) in varying] or named
        swept = {_key(o): OmegaConf.select(cfg, _key(o), default=o.split("=", 1)[1]) if _key(o) not in choices
                 else choices[_key(o)] for o in overrides if _key(o) in varying}
    name = " ".join(named) or "defaults"
    group = cfg.logger.get("group") or cfg.get("experiment_name")
    if group is None and multirun:
        group = f"sweep-{sweep_dir.name}"
    tags = [f"{g}={o}" for g, o in choices.items() if o is not None and g != "logger"]
    tags += [str(t) for t in cfg.logger.get("tags") or []]
    return RunInfo(run_dir=Path(hc.runtime.output_dir), choices=choices, overrides=overrides, name=name,
                   group=group, tags=tags, multirun=multirun, sweep_dir=sweep_dir,
                   job_num=hc.job.num if multirun else None, swept=swept)


def wandb_config(cfg: DictConfig, info: RunInfo, extra: dict[str, Any]) -> dict[str, Any]:
    """What W&B's config receives: every group's chosen option as a top-level key (model, norm, pos, ffn, task,
    ...) for grouping and filtering, the seed, in a sweep every swept key with this job's value (e.g.
    `model.n_layers`) and `cell` (the swept settings but the seed: group by it to average over seeds), and the
    whole resolved config under `cfg` (cfg.model.d_model, cfg.optim.lr, ... in the runs table)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    cell = " ".join(f"{k}={v}" for k, v in info.swept.items() if k != "seed")
    sweep = {**info.swept, "cell": cell or "all"} if info.multirun else {}
    return {**{g: o for g, o in info.choices.items()}, "seed": cfg.seed, **sweep, **extra, "cfg": resolved}
