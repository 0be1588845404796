"""Build, fit and test one validated configuration with Lightning; write the run directory's outputs.

<run dir>/config.yaml        resolved config (what was trained, vocab sizes filled in)
<run dir>/metrics.csv        every logged metric, whatever the logger
<run dir>/checkpoints/       last.ckpt (resume) and best.ckpt (lowest val/loss)
<run dir>/attention/         attention maps at each validation (step_<step>.png; `diagnostics:` settings; image
                             tasks also patches_step_<step>.png: attention over the patches on the images)
<run dir>/confusion_matrix_<split>.png, .json   image tasks: the test split's confusion matrix
<run dir>/results.json       final metrics and facts about the run (runs/results.py: `Results`)
<run dir>/branches/          schedule.branches: the stable-phase states and budgets.json (lifecycle/branches.py)

With pause_at, the fit stops at that budget's decay start and `record_paused` writes results.json (status paused)
after the budget branches up to it, without the final evaluation.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import LearningRateMonitor
from omegaconf import DictConfig, OmegaConf

from archsweep.core.data.codec import codec_from_state, codec_state_for
from archsweep.core.data.paths import cache_dir
from archsweep.core.model.build import build_model, count_parameters
from archsweep.core.model.checkpoint import CKPT_DIR
from archsweep.core.train.config.rules import data_parallel
from archsweep.core.train.config.setup import ConfigError, Setup
from archsweep.core.train.config.wsd import Branch, branch_at
from archsweep.core.train.lifecycle.branches import (
    Budgets,
    PauseAt,
    branch_callbacks,
    branch_trainer_cfg,
    fit_branch,
    plan_of,
    stable_points,
)
from archsweep.core.train.lifecycle.interrupts import Interrupted, StopOnSignal, caught_stops, interrupted_results
from archsweep.core.train.lifecycle.stops import STOPS
from archsweep.core.train.lifecycle.trainer import (
    TaskData,
    explain_collective_timeout,
    make_trainer,
    sweep_job_for_ddp,
)
from archsweep.core.train.lit import LitModel
from archsweep.core.train.monitoring.callback_group import make_callbacks
from archsweep.core.train.monitoring.callbacks import Progress, RunCheckpoint, ValidateAtEnd
from archsweep.core.train.monitoring.compute import Compute
from archsweep.core.train.monitoring.decode_callback import DecodeOnValidation
from archsweep.core.train.monitoring.diagnostic_callbacks import DivergenceMonitor, diagnostic_callbacks
from archsweep.core.train.monitoring.image_callbacks import image_callbacks
from archsweep.core.train.monitoring.loggers import LogRun, finish_wandb, make_loggers, new_run_id
from archsweep.core.train.monitoring.memory import peak_mib, reset_peak
from archsweep.core.train.monitoring.summary import family, summary_line, validation_keys
from archsweep.core.train.runs.results import RESULTS, Results
from archsweep.core.train.runs.runinfo import RunInfo, compare_block, wandb_config
from archsweep.variants.model import BIDIRECTIONAL, IMAGE, form_of

log = logging.getLogger("train")


@dataclass
class Fitting:
    """What `start_run` builds for one run, read by its phases (fit, evaluation, budget branches)."""

    lit: LitModel
    trainer: L.Trainer
    data: TaskData
    ckpt_cb: RunCheckpoint
    progress: Progress
    compute: Compute
    stop_cb: StopOnSignal
    plan: list[Branch]  # budget branches (schedule.branches), [] without
    n_params: int
    n_active: int
    pause: PauseAt | None = None  # pause_at: the callback that stops the fit there

    @property
    def paused(self) -> bool:
        """The fit stopped at pause_at's step (not diverged or stopped early before it)."""
        return self.pause is not None and self.pause.paused_step is not None and self.lit.diverged is None

    @property
    def run_id(self) -> str:
        return self.lit.meta["wandb_run_id"]


class Fitted(NamedTuple):
    """What the fit leaves for the records: the last training figures and how long it took."""

    train: dict[str, float | None]  # train_summary, taken before any evaluation replaces the callback metrics
    fit_s: float


class Evaluated(NamedTuple):
    """What the evaluation after the fit measured, and how long the fit and the evaluation took."""

    val: dict[str, Any]
    test: dict[str, Any]
    best: str | None  # the checkpoint evaluated
    by_context: dict[str, Any] | None
    train: dict[str, float | None]  # train_summary, taken before the evaluation replaced the callback metrics
    fit_s: float
    eval_s: float


def wandb_lines(loggers: list[Any]) -> list[str]:
    """W&B runs silent (monitoring/console.py); this is what it would have said that matters: where the run is."""
    from lightning.pytorch.loggers import WandbLogger

    lines = []
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment  # starts the W&B run now rather than at the first logged metric
            if getattr(run, "settings", None) is not None and run.settings.mode == "offline":
                lines.append(f"W&B offline run in {run.settings.sync_dir}; upload it with "
                             f"`wandb sync {run.settings.sync_dir}`")
            elif getattr(run, "url", None):
                lines.append(f"W&B run {run.url}")
    return lines


def train_summary(trainer: L.Trainer) -> dict[str, float | None]:
    """The last logged training loss (the final loss; val/loss comes from the best checkpoint) and the loss spikes
    the divergence check counted (diagnostics.spike_factor)."""
    loss = trainer.callback_metrics.get("train/loss")
    monitor = next((cb for cb in trainer.callbacks if isinstance(cb, DivergenceMonitor)), None)
    return {"loss": float(loss) if loss is not None else None,
            "loss_spikes": float(monitor.spikes) if monitor is not None else None}


def metrics_of(split: str, out: dict[str, Any]) -> dict[str, float]:
    return {k.split("/", 1)[1]: float(v) for k, v in out.items() if k.startswith(f"{split}/")}


def evaluate_after_fit(trainer: L.Trainer, lit: LitModel, data: TaskData, ckpt_cb: RunCheckpoint,
                       splits: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(validation outputs, test outputs, checkpoint evaluated) from the best checkpoint, else the final weights.
    A diverged run is evaluated only from a checkpoint whose validation loss was finite; without one, its
    metrics are NaN and its (possibly NaN) weights are not run."""
    best = ckpt_cb.best_model_path or None
    score = ckpt_cb.best_model_score
    if lit.diverged is not None and (best is None or score is None or not math.isfinite(float(score))):
        nan = {f"{split}/{k}": math.nan for split in ("val", *splits) for k in ("loss", "ppl", "acc", "exact_match")}
        return nan, nan, None
    ckpt = "best" if best else None
    log.info(f"evaluating {f'the best checkpoint ({best})' if best else 'the final weights'} on "
             f"{', '.join(('val', *splits)[:-1])} and {splits[-1]}")
    val = trainer.validate(lit, datamodule=data, ckpt_path=ckpt, verbose=False)[0]
    test = {k: v for out in trainer.test(lit, datamodule=data, ckpt_path=ckpt, verbose=False) for k, v in out.items()}
    return val, test, best


DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "PL_GLOBAL_SEED",
           "PL_SEED_WORKERS")


def train(cfg: DictConfig, setup: Setup, info: RunInfo, start_time: float) -> dict[str, Any] | None:
    """Returns results.json's content (None in DDP worker processes other than rank 0)."""
    env = {k: os.environ.get(k) for k in DDP_ENV}
    try:
        return fit_and_test(cfg, setup, info, start_time)
    except RuntimeError as error:
        explained = explain_collective_timeout(error, cfg)
        if explained is error:
            raise
        raise explained from error
    finally:
        # Lightning leaves its process group and environment (LOCAL_RANK, MASTER_PORT, ...) behind; the next job
        # of a sweep would take them for an external launcher's and never start its own workers.
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def folder_codec(codec: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A run started from a Hugging Face folder keeps the folder's tokenizer where its data came as bare ids; one
    whose data has another tokenizer than the folder's is refused (the same ids would mean other text)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return codec
    text = path.read_text()
    if codec.get("type") == "ids":
        return {**codec, "type": "tokenizer", "src": text, "tgt": text}
    if codec.get("type") == "tokenizer" and json.loads(codec["tgt"]).get("model") != json.loads(text).get("model"):
        raise ConfigError(f"model.init_from={folder}: the task's tokenizer is not the folder's tokenizer.json (their "
                          f"vocabularies differ); train on data tokenized with the folder's tokenizer")
    return codec


def fit_and_test(cfg: DictConfig, setup: Setup, info: RunInfo, start_time: float) -> dict[str, Any] | None:
    """Build, fit and test `setup` (checked by job.py; `cfg` is read, not checked again). A stop in any phase
    (`interrupts.caught_stops`) ends here as an interrupted run's results."""
    run = start_run(cfg, setup, info, start_time)
    try:
        fitted = fit(setup, run, info.run_dir)
        if run.paused:
            results = record_paused(cfg, setup, info, run, fitted, start_time)  # one process: branches need it
        else:
            evaluated = evaluate(cfg, setup, run, fitted, info.run_dir)
            results = record(cfg, setup, info, run, evaluated, start_time) if run.trainer.is_global_zero else None
    except Interrupted as stop:
        return interrupted_results(run.trainer, stop, info, cfg.seed, setup, run.n_params, run.run_id)
    finish_wandb()
    return results


def start_run(cfg: DictConfig, setup: Setup, info: RunInfo, start_time: float) -> Fitting:
    """The LightningModule, loggers, callbacks and Trainer of the run; rank 0 writes config.yaml and announces it."""
    lit, n_params, n_active = build_lit(cfg, setup, info)
    extra = {"params": n_params, "active_params": n_active, "run_dir": str(info.run_dir)}
    in_place = setup.ckpt_path is not None and info.run_dir.resolve() in Path(setup.ckpt_path).resolve().parents
    log_run = LogRun(info.run_dir, info.name, info.group, info.tags, wandb_config(cfg, info, extra),
                     lit.meta["wandb_run_id"])
    loggers = make_loggers(lit.meta["config"]["logger"], log_run, setup.resume_step if in_place else None)
    ckpt_cb = RunCheckpoint(info.run_dir / CKPT_DIR)
    progress = Progress(start_time, validation_keys(setup.task))
    compute = Compute(cfg.trainer.get("peak_flops"), cache_dir(cfg.task.get("cache_dir")))
    if info.multirun and data_parallel(cfg.trainer.strategy) and "spawn" not in str(cfg.trainer.strategy):
        sweep_job_for_ddp(info)
    stop_cb = StopOnSignal(info.run_dir / CKPT_DIR / "last.ckpt")
    callbacks: list[L.Callback] = [ckpt_cb, progress, compute, stop_cb, ValidateAtEnd(),
                                   LearningRateMonitor(logging_interval="step")]  # train/lr/pg<N>
    plan = plan_of(cfg)  # budget branches (schedule.branches): their stable-phase states are saved as the run passes
    callbacks += run_callbacks(cfg, setup, info, plan, lit.meta["codec"])
    pause = None
    if cfg.get("pause_at") is not None:  # last: its checkpoint holds every other callback's state after the step
        pause = PauseAt(branch_at(plan, float(cfg.pause_at)).decay_start, info.run_dir / CKPT_DIR / "paused.ckpt")
        callbacks.append(pause)
    trainer = make_trainer(cfg, loggers, callbacks, info.run_dir)
    if trainer.is_global_zero:
        announce(cfg, setup, info, loggers, n_params, n_active)
    return Fitting(lit, trainer, TaskData(setup.task, setup.model_cfg.kind, cfg.seed), ckpt_cb, progress, compute,
                   stop_cb, plan, n_params, n_active, pause)


def build_lit(cfg: DictConfig, setup: Setup, info: RunInfo) -> tuple[LitModel, int, int]:
    """The seeded model in its LightningModule, with the weights it starts from, and its (total, active) parameter
    counts. Its `meta` (stored in every checkpoint) holds the resolved config, the run's identity and the codec."""
    meta_in = setup.resume
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    model = build_model(setup.model_cfg)
    if meta_in is None:  # a resumed run has its own weights
        load_start_weights(model, cfg.get("init_from"), setup.hf_init)
    n_params, n_active = count_parameters(model), count_parameters(model, count="active")
    if cfg.compile:
        model.compile()
    run_id = meta_in["wandb_run_id"] if meta_in else new_run_id()
    resolved = OmegaConf.to_container(cfg, resolve=True)
    codec = codec_state_for(setup.task)  # lets generate.py / evaluate.py work from a checkpoint alone
    if setup.hf_init is not None:
        codec = folder_codec(codec, Path(setup.hf_init))
    meta = {"config": resolved, "choices": info.choices, "overrides": info.overrides, "wandb_run_id": run_id,
            "codec": codec}
    lit = LitModel(model, setup.task.forward_fn(setup.model_cfg.kind), resolved["optim"], resolved["schedule"],
                   cfg.label_smoothing, cfg.seed, meta, setup.task.test_splits,
                   longest_input=setup.task.max_input_len(setup.model_cfg.kind),
                   token_bytes=setup.task.token_bytes(setup.model_cfg.kind))
    return lit, n_params, n_active


def load_start_weights(model: Any, init_from: Any, hf_init: str | None) -> None:
    """A new run's starting weights: a train.py checkpoint (`init_from`, fine-tuning), then published weights
    (`model.init_from`, a Hugging Face folder); neither set: the model's own initialisation."""
    if init_from is not None:
        from archsweep.core.model.checkpoint import CheckpointError, init_weights_from

        try:
            log.info(f"initialised from the weights of {init_weights_from(model, init_from)}")
        except CheckpointError as e:
            raise ConfigError(str(e)) from None
    if hf_init is not None:
        from archsweep.core.model.hf import load_folder_weights

        try:
            load_folder_weights(model, hf_init)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        log.info(f"initialised from the Hugging Face model in {hf_init}")


def run_callbacks(cfg: DictConfig, setup: Setup, info: RunInfo, plan: list[Branch],
                  codec: dict[str, Any]) -> list[L.Callback]:
    """The callbacks that depend on the run: the budget branches' stable-phase saves, decoding at each validation,
    the diagnostics, an image task's metrics and maps, then the `callbacks` group's (after train.py's own)."""
    callbacks: list[L.Callback] = []
    if plan:
        try:
            callbacks.append(stable_points(plan, info.run_dir, (setup.resume_step or 0) if setup.ckpt_path else None))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    kind, text = setup.model_cfg.kind, codec_from_state(codec)
    if cfg.eval.decode_samples > 0 and codec["seq2seq"] and form_of(kind) != BIDIRECTIONAL:
        callbacks.append(DecodeOnValidation(setup.task, kind, text, setup.decoding, cfg.eval.decode_samples,
                                            cfg.eval.show_examples, cfg.seed, cfg.eval.decode_max_new_tokens,
                                            cfg.eval.decode_time_s))
    callbacks += diagnostic_callbacks(setup.diagnostics, setup.task, kind, text, cfg.seed, info.run_dir,
                                      compiled=cfg.compile)
    if form_of(kind) == IMAGE:  # top-5 accuracy, confusion matrix, attention over the patches
        callbacks += image_callbacks(setup.task, kind, cfg.seed, info.run_dir, setup.diagnostics.attention_maps)
    return callbacks + make_callbacks(setup.callbacks)


def announce(cfg: DictConfig, setup: Setup, info: RunInfo, loggers: list[Any], n_params: int, n_active: int) -> None:
    """Rank 0, before the fit: the resolved config.yaml and the task's files (e.g. its tokenizer, so the run's outputs
    can be decoded) into the run directory, and the run's first lines."""
    OmegaConf.save(cfg, info.run_dir / "config.yaml", resolve=True)
    setup.task.save(info.run_dir)
    log.info(f"run {info.name!r} in {info.run_dir}: {setup.model_cfg.kind}, {n_params:,} parameters"
             + (f" ({n_active:,} active per token)" if n_active != n_params else "")
             + (f", resuming from {setup.ckpt_path}" if setup.ckpt_path else ""))
    for line in wandb_lines(loggers):
        log.info(line)


def fit(setup: Setup, run: Fitting, run_dir: Path) -> Fitted:
    """Fit (from the checkpoint to resume, if any) and write last.ckpt at the final step (a paused fit has written
    its own, at its step)."""
    trainer = run.trainer
    reset_peak()
    fit_start = time.time()
    with caught_stops(trainer, run.ckpt_cb):
        trainer.fit(run.lit, datamodule=run.data, ckpt_path=str(setup.ckpt_path) if setup.ckpt_path else None)
    fit_s = time.time() - fit_start
    train = train_summary(trainer)  # before an evaluation replaces the callback metrics
    if run.pause is not None:
        run.pause.keep(run_dir / CKPT_DIR / "last.ckpt" if run.paused else None)
    if not run.paused and run.ckpt_cb.saved_step != trainer.global_step:  # last steps after the last validation
        trainer.save_checkpoint(run.ckpt_cb.last_model_path or str(run_dir / CKPT_DIR / "last.ckpt"))
    return Fitted(train, fit_s)


def evaluate(cfg: DictConfig, setup: Setup, run: Fitting, fitted: Fitted, run_dir: Path) -> Evaluated:
    """Evaluate the best checkpoint on the validation and test splits and, with eval.context_lengths, by context
    length."""
    trainer = run.trainer
    last = run.ckpt_cb.last_model_path or str(run_dir / CKPT_DIR / "last.ckpt")
    eval_start = time.time()
    # a signal in the fit's last step or its final validation, or during this evaluation, stops the run here; its
    # resume evaluates from last.ckpt
    with caught_stops(trainer, run.ckpt_cb), STOPS.at_once(trainer, trainer.global_step, last):
        val, test, best = evaluate_after_fit(trainer, run.lit, run.data, run.ckpt_cb, setup.task.test_splits)
        by_context = None
        if cfg.eval.get("context_lengths") is not None and trainer.is_global_zero:
            from archsweep.core.eval.context import evaluate_contexts

            by_context = evaluate_contexts(run.lit.model, setup.task, "test", list(cfg.eval.context_lengths),
                                           cfg.eval.get("stride"), cfg.eval.get("context_tokens"),
                                           progress=log.info)
    return Evaluated(val, test, best, by_context, fitted.train, fitted.fit_s, time.time() - eval_start)


def record(cfg: DictConfig, setup: Setup, info: RunInfo, run: Fitting, evaluated: Evaluated,
           start_time: float) -> dict[str, Any]:
    """Rank 0: results.json (with the budget branches' entries, fitted now, when schedule.branches asks for them)
    and the run's summary line; returns what was written."""
    done = completed_results(cfg, setup, info, run, evaluated, start_time)
    trainer = run.trainer
    if run.plan and (run.lit.diverged or trainer.global_step < cfg.trainer.max_steps):
        log.warning(f"schedule.branches: the run stopped at step {trainer.global_step} of "
                    f"{cfg.trainer.max_steps} ({'diverged' if run.lit.diverged else 'stopped early'}); no budgets "
                    f"are recorded")
    elif run.plan:  # a stop in a branch: continuing the run re-fits that branch
        with caught_stops(trainer, run.ckpt_cb, branch_from=str(info.run_dir / CKPT_DIR / "last.ckpt")):
            done = with_budgets(done, Budgets(run.plan, info.run_dir), cfg, setup, run, info, start_time)
    done.write(info.run_dir / RESULTS)
    results = done.to_dict()
    log.info(summary_line(setup.task, results, info.run_dir / RESULTS))
    return results


def completed_results(cfg: DictConfig, setup: Setup, info: RunInfo, run: Fitting, evaluated: Evaluated,
                      start_time: float) -> Results:
    """results.json of a run that trained to its end (or diverged), before any budget branch."""
    lit, val, test = run.lit, evaluated.val, evaluated.test
    return run_results(
        cfg, setup, info, run, Fitted(evaluated.train, evaluated.fit_s), start_time,
        status="diverged" if lit.diverged else "completed", diverged=lit.diverged,
        splits={"val": metrics_of("val", val), **{s: metrics_of(s, test) for s in setup.task.test_splits}},
        by_length=lit.by_length, by_context=evaluated.by_context, best_checkpoint=evaluated.best,
        eval_time_s=evaluated.eval_s)


def run_results(cfg: DictConfig, setup: Setup, info: RunInfo, run: Fitting, fitted: Fitted, start_time: float,
                **fields: Any) -> Results:
    """results.json's facts about the run and its fit, whatever its end, with `fields` (its status and what
    depends on it)."""
    trainer, progress = run.trainer, run.progress
    return Results(
        name=info.name, group=info.group, run_dir=str(info.run_dir), choices=info.choices,
        overrides=info.overrides, seed=cfg.seed, params=run.n_params, active_params=run.n_active,
        task_family=family(setup.task), steps=trainer.global_step, train=fitted.train,
        budget=setup.budget.record(trainer.global_step) if setup.budget else None,
        last_checkpoint=str(info.run_dir / CKPT_DIR / "last.ckpt"),
        resumed_from=str(setup.ckpt_path) if setup.ckpt_path else None, wandb_run_id=run.run_id,
        tokens_per_s=progress.tokens_per_s * trainer.world_size,
        **run.compute.summary(progress.train_s, trainer.world_size),  # FLOPs, mfu, mfu_estimate, peak_*
        peak_memory_mib=peak_mib(run.lit.device), train_time_s=progress.train_s, val_time_s=progress.val_s,
        fit_time_s=fitted.fit_s, wall_time_s=time.time() - start_time, time_to_first_step_s=progress.first_step_s,
        world_size=trainer.world_size, compare=compare_block(cfg), **fields)


def record_paused(cfg: DictConfig, setup: Setup, info: RunInfo, run: Fitting, fitted: Fitted,
                  start_time: float) -> dict[str, Any]:
    """A run paused at pause_at (one process, as every run with branches): the budget branches up to it not yet
    recorded, fitted as after a whole run, then results.json with status paused and `budgets` those branches, and
    the line that says how to continue; returns what was written."""
    pause, step = branch_at(run.plan, float(cfg.pause_at)), run.trainer.global_step
    done = run_results(cfg, setup, info, run, fitted, start_time, status="paused",
                       paused={"at": pause.fraction, "step": step})
    budgets = Budgets([b for b in run.plan if b.steps <= pause.steps], info.run_dir)
    last = str(info.run_dir / CKPT_DIR / "last.ckpt")
    with caught_stops(run.trainer, run.ckpt_cb, branch_from=last):  # a stop in a branch: continuing re-fits it
        done.budgets = budgets.complete(done, branch_fitter(cfg, setup, run, info, start_time), run.stop_cb.pending)
    done.write(info.run_dir / RESULTS)
    log.info(paused_line(done, run.plan, pause, info))
    return done.to_dict()


def paused_line(done: Results, plan: list[Branch], pause: Branch, info: RunInfo) -> str:
    """Where the run paused, its budget's validation loss, and how to continue it."""
    later = [f"{b.fraction:g}" for b in plan if b.steps > pause.steps and b.fraction < 1.0]
    if info.multirun:
        how = "re-run the sweep with a later pause_at, or pause_at=null"
    else:
        how = f"python train.py resume={info.run_dir} " + (
            f"pause_at={' or '.join(later)} (a later budget) or pause_at=null (to the end)" if later
            else "pause_at=null (to the end)")
    return (f"paused after budget {pause.fraction:g} at step {done.steps} (its branch's val/loss "
            f"{done.budgets[-1]['val/loss']:.4f}; {done.total_flops or 0:.4g} training FLOPs so far); to continue: "
            f"{how}")


def with_budgets(done: Results, budgets: Budgets, cfg: DictConfig, setup: Setup, run: Fitting, info: RunInfo,
                 start_time: float) -> Results:
    """The run's results with `budgets`: each branch not yet recorded is fitted from its stable-phase state by a
    trainer of its own (no logger: the run's curves stay the run's), then the run itself (branches.py). A signal the
    run's fit noted in its last step (`StopOnSignal.pending`) stops before the first branch."""
    done = budgets.run_results(done, trained=run.compute.flops_this_fit > 0)
    done.budgets = budgets.complete(done, branch_fitter(cfg, setup, run, info, start_time), run.stop_cb.pending)
    return done


def branch_fitter(cfg: DictConfig, setup: Setup, run: Fitting, info: RunInfo,
                  start_time: float) -> Callable[[Branch], tuple[dict[str, Any], int | None]]:
    """Fits one budget branch from its stable-phase state with a trainer of its own (no logger: the run's curves
    stay the run's); `Budgets.complete` calls it for each branch not recorded."""
    lit = run.lit

    def fit_one(branch: Branch) -> tuple[dict[str, Any], int | None]:
        model = build_model(setup.model_cfg)  # its weights come from the stable-phase checkpoint
        if cfg.compile:
            model.compile()
        schedule = {**lit.schedule_cfg, "total_steps": branch.steps}
        branch_lit = LitModel(model, lit.forward_fn, lit.optim_cfg, schedule, cfg.label_smoothing, cfg.seed, lit.meta,
                              setup.task.test_splits, longest_input=lit.longest_input,
                              token_bytes=setup.task.token_bytes(setup.model_cfg.kind))
        branch_compute = Compute(cfg.trainer.get("peak_flops"), cache_dir(cfg.task.get("cache_dir")))
        callbacks = branch_callbacks(branch_compute, start_time, validation_keys(setup.task))
        trainer = make_trainer(branch_trainer_cfg(cfg, branch), [], callbacks, info.run_dir)
        return fit_branch(branch, branch_lit, run.data, trainer, branch_compute, info.run_dir)

    return fit_one
